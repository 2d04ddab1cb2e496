"""Streaming Kineto trace parser: `.json` / `.json.gz` in, numpy arrays of the kept events out.

A rank trace is 1-1.5 GB of JSON, so it is decompressed and decoded a chunk at a time (isal, msgspec), keeping
only the event kinds stepscope reads (docs/methods.md#trace-format); timestamps stay float64 as written.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from array import array
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

import msgspec
import numpy as np

from stepscope.errors import TraceError
from stepscope.trace import split
from stepscope.trace.frames import KEEP_FRAME, NAME_CAP_CHARS, keep_frame
from stepscope.trace.widths import narrow_ints

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

LOADER_VERSION = 13
"""Bump when the slim table's columns or meaning change: it keys the Parquet cache."""

CHUNK_BYTES = 4 << 20
DECOMPRESS_BLOCK_BYTES = 1 << 20
"""Blocks the decompression thread hands over (it queues at most two)."""

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
ANNOTATION_CATS = ("user_annotation", "gpu_user_annotation")
KEPT_CATS = DEVICE_CATS + LAUNCH_CATS + ANNOTATION_CATS + ("cpu_op", "python_function")
# Kineto categories that stepscope knows and ignores on purpose.
IGNORED_CATS = frozenset({
    "python_function", "ac2g", "fwdbwd", "cpu_instant_event", "Trace", "cuda_profiler_range",
    "gpu_user_annotation", "user_annotation", "overhead", "memory", "cuda_sync",
    "kineto_metadata", "privateuse1_runtime", "privateuse1_driver", "mtia_runtime",
    "mtia_ccp_events", "Trace Collector", "gpu_kernel_memory",
})
UNREAD_DEVICE_CATS = frozenset({"mtia_ccp_events"})
"""Device work stepscope does not read as kernels (an MTIA's command processor): counted and summed, so such a
trace never reads as having no device work."""
# Older Kineto releases capitalised the categories; map them onto today's names.
CAT_ALIASES = {
    "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset",
    "Runtime": "cuda_runtime", "Driver": "cuda_driver", "Operator": "cpu_op",
}
KNOWN_CATS = frozenset(KEPT_CATS) | IGNORED_CATS | frozenset(CAT_ALIASES)

MAX_DUR_US = 1e11
"""A duration above this (28 hours) is no measurement: the event is dropped, as NaN and Infinity are."""
MAX_TS_US = 1e17
"""A timestamp outside [0, this) µs is dropped with its event: it would stretch every span."""
TRAILER_MAX_BYTES = 64 << 20
"""The most top-level metadata read after traceEvents (and before it, for the header)."""

SLIM_COLUMNS = ("cat", "name", "pid", "tid", "ts", "dur", "correlation", "stream", "collective", "msg_nelems")
"""No `External id`: nothing reads it (launches are found by `correlation`), and it cost 4 bytes an event."""


class _Args(msgspec.Struct, gc=False):
    correlation: int | None = None
    stream: int | None = None
    collective: str | None = msgspec.field(default=None, name="Collective name")
    msg_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    dtype: str | None = None
    group_size: int | None = msgspec.field(default=None, name="Group size")
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")


def _collective_key(a: _Args) -> str:
    return "\t".join(("" if v is None else str(v)) for v in (a.collective, a.dtype, a.group_size, a.pg_name))


def collective_args(value: object) -> tuple[str, str, int | None, str]:
    """(Collective name, dtype, Group size, Process Group Name) from the slim table's
    `collective` column ("" and None where the kernel's args lack them)."""
    parts = (str(value) if isinstance(value, str) else "").split("\t")
    parts += [""] * (4 - len(parts))
    return parts[0], parts[1], int(parts[2]) if parts[2].lstrip("-").isdigit() else None, parts[3]


class _Event(msgspec.Struct, gc=False):
    cat: str | None = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


_events_decoder = msgspec.json.Decoder(list[_Event])
_any_decoder = msgspec.json.Decoder()
_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_GPU_HEADER_RE = re.compile(rb'"deviceProperties"\s*:\s*\[\s*\{')
_BYTE_RE = re.compile(r"\(byte (\d+)\)")
_WS = b" \t\r\n"


# --------------------------------------------------------------------------- reading


_NOT_REGULAR = (
    (stat.S_ISDIR, "a folder", "pass the trace files in it, or the folder to `stepscope analyze`"),
    (stat.S_ISFIFO, "a FIFO (named pipe): reading it waits for a writer and has no size to check",
     "write the trace to a file first, then pass the file"),
    (stat.S_ISCHR, "a character device: it can stream bytes without end",
     "pass a trace file"),
    (stat.S_ISBLK, "a block device", "pass a trace file"),
    (stat.S_ISSOCK, "a socket", "write the trace to a file first, then pass the file"),
)
"""(test of st_mode, what the path is, the fix) for each kind of path that is no regular file."""


def require_regular_file(path: Path) -> None:
    """Refuse, before anything opens it, a path that is no regular file once its symlinks are
    followed: a FIFO hung `analyze` silently, and /dev/zero was read to MemoryError."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise TraceError("trace file not found", where=str(path)) from None
    except OSError as exc:  # a symlink loop, no permission
        raise TraceError(f"cannot read it: {exc.strerror}", where=str(path),
                         hint="pass a readable trace file (.json / .json.gz)") from None
    if stat.S_ISREG(mode):
        return
    kind, hint = next(((k, h) for is_kind, k, h in _NOT_REGULAR if is_kind(mode)),
                      (f"no regular file (mode {stat.filemode(mode)})", "pass a trace file"))
    resolved = os.path.realpath(path)
    seen_as = "" if resolved == os.path.abspath(path) else f" (a link to {resolved})"
    raise TraceError(f"not a trace file{seen_as}: it is {kind}", where=str(path), hint=hint)


def open_stream(path: Path, threaded: bool = True):
    """A trace file as a binary stream of its JSON, decompressed when it is gzip."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        from isal import igzip, igzip_threaded

        # isal is ~4x faster than zlib; its background thread (GIL released) overlaps JSON decoding.
        if threaded and split.usable_cores() > 1:
            return igzip_threaded.open(path, "rb", threads=1, block_size=DECOMPRESS_BLOCK_BYTES)
        return igzip.open(path, "rb")
    return open(path, "rb", buffering=0)


def _read(stream, path: Path, n: int) -> bytes:
    try:
        return stream.read(n)
    except EOFError:
        raise TraceError(
            "the gzip stream is truncated (the file ends before the compressed data does)",
            where=str(path),
            hint="the capture was probably copied while the profiler was still writing; "
                 "copy it again after /stop_profile returns",
        ) from None
    except (OSError, ValueError) as exc:
        raise TraceError(f"cannot decompress: {exc}", where=str(path),
                         hint="check that the file is a complete .json.gz trace") from None


def _malformed(path: Path, offset: int, exc: Exception) -> TraceError:
    return TraceError(
        f"not valid JSON near byte {offset:,} of the decompressed trace ({exc})",
        where=str(path),
        hint="the file is damaged or not a Kineto trace; re-copy it from the profiler directory",
    )


def _last_boundary(buf: bytes | bytearray, lo: int, hi: int) -> tuple[int, int] | None:
    """(end of an event, start of the next) for the last `} , {` in buf[lo:hi]."""
    j = hi
    while True:
        j = buf.rfind(b"{", lo, j)
        if j <= lo:
            return None
        k = j - 1
        while k > lo and buf[k] in _WS:
            k -= 1
        if buf[k] != 0x2C:  # ','
            continue
        k -= 1
        while k > lo and buf[k] in _WS:
            k -= 1
        if buf[k] == 0x7D:  # '}'
            return k + 1, j


class _Collector:
    """Accumulates kept events column-wise in compact arrays (names interned)."""

    def __init__(self) -> None:
        self.cat = array("b")
        # Int columns start as int8 and widen only as values need (`_ints_into`): int32 columns were the
        # load's peak memory.
        self.name = array("b")
        self.pid = array("b")
        self.tid = array("b")
        self.ts = array("d")
        self.dur = array("d")
        self.corr = array("b")
        self.stream = array("b")
        self.coll = array("b")
        self.nelems = array("b")
        self.names: dict[str, int] = {}
        self.colls: dict[str, int] = {"": 0}
        self.ids: dict[Any, int] = {}
        self.n_total = 0
        self.unknown: dict[str, int] = {}
        self.unread: dict[str, list[float]] = {}  # {category: [events, summed dur µs]}
        self.seen_device = False  # True: cpu_ops are no longer collected
        self.has_device = False
        self.bad_dur: list[str] = []
        self.n_bad_dur = 0
        self.n_bad_other = 0  # annotations / launches dropped for an unusable ts or dur
        self.n_capped = 0  # names cut at NAME_CAP_CHARS
        self.n_huge_ids = 0  # ids outside int64, read as "no id"

    def _id(self, v: Any) -> int:
        if type(v) is int and -(1 << 63) <= v < (1 << 63):
            return v
        if v is None:
            return -1
        # String pids/tids ("Spans", "stream 7") get stable negative ids.
        got = self.ids.get(v)
        if got is None:
            got = self.ids[v] = -2 - len(self.ids)
        return got

    def add(self, events: list) -> None:
        """Events decoded with the generic struct (`_Event`, which carries `cat`)."""
        # Hot path (millions of events): comprehensions, not a Python statement per event.
        self.n_total += len(events)
        unknown = set(map(_get_cat, events)) - _KNOWN_OR_NONE
        for c in unknown:  # rare: count only what the summary must name
            self.unknown[c] = self.unknown.get(c, 0) + sum(1 for e in events if e.cat == c)
        self._count_unread([e for e in events if e.cat in UNREAD_DEVICE_CATS])
        keep = _KEEP_GPU_NO_FRAMES if self.seen_device else _KEEP_ALL_NO_PYFN
        frame_cats = _FRAME_CATS_GPU if self.seen_device else _FRAME_CATS_ALL
        kept = [e for e in events if e.cat in keep
                or (e.cat in frame_cats and type(e.name) is str and KEEP_FRAME[e.name])]
        if not kept:
            return
        cat_index = _CAT_INDEX
        cis = [cat_index.get(e.cat) for e in kept]
        if None in cis:  # old capitalised categories
            cis = [ci if ci is not None else cat_index[CAT_ALIASES[e.cat]] for ci, e in zip(cis, kept)]
        self._columns(kept, cis)

    def add_tagged(self, events: list) -> None:
        """Events decoded with the tagged union (the struct type is the category). Every filter runs
        in C (`compress` over `map`); frames are kept by name through a memo."""
        self.n_total += len(events)
        types = list(map(type, events))  # read by each filter below: one pass, not three
        self._count_unread(list(compress(events, map(_UNREAD_TYPES.__contains__, types))))
        gpu = self.seen_device
        keep = _TYPES_GPU_NO_FRAMES if gpu else _TYPES_ALL_NO_PYFN
        kept = list(compress(events, map(keep.__contains__, types)))
        cand = list(compress(events, map((_FRAME_TYPES_GPU if gpu else _FRAME_TYPES_ALL).__contains__, types)))
        if cand:
            try:
                kept += compress(cand, map(KEEP_FRAME.__getitem__, map(_get_name, cand)))
            except TypeError:  # a name that is not a string (unhashable): judge one by one
                kept += [e for e in cand if keep_frame(e.name)]
        if not kept:
            return
        self._columns(kept, list(map(_TYPE_CI.__getitem__, map(type, kept))))

    def _count_unread(self, events: list) -> None:
        """Count device events of `UNREAD_DEVICE_CATS` and sum their usable durations."""
        for e in events:
            got = self.unread.setdefault(e.cat, [0, 0.0])
            got[0] += 1
            if _usable(0.0, e.dur):
                got[1] += e.dur

    def _columns(self, kept: list, cis: list) -> None:
        if not self.has_device and any(ci < 3 for ci in cis):
            self.seen_device = self.has_device = True
        # Fast path: every ts/dur present and in range (checked in C, NaN fails every test).
        try:
            ts_a = array("d", [e.ts for e in kept])
            dur_a = array("d", [e.dur for e in kept])
            bad = [] if not len(dur_a) or _in_range(np.frombuffer(ts_a), np.frombuffer(dur_a)).all() else None
        except (TypeError, OverflowError):
            bad = None
        if bad is None:
            bad = [i for i, e in enumerate(kept) if not _usable(e.ts, e.dur)]
            ts_a = dur_a = None
        if bad:
            kept, cis = self._drop_bad(kept, cis, bad)
        names = self.names
        nm = [e.name if type(e.name) is str else ("" if e.name is None else str(e.name)) for e in kept]
        if nm and max(map(len, nm)) > NAME_CAP_CHARS:
            self.n_capped += sum(len(n) > NAME_CAP_CHARS for n in nm)
            nm = [cap_name(n) for n in nm]
        self._ints_into("name", [names[n] if n in names else names.setdefault(n, len(names)) for n in nm], int)
        self.cat.extend(cis)
        self._ints_into("pid", [e.pid for e in kept], self._id)
        self._ints_into("tid", [e.tid for e in kept], self._id)
        if ts_a is None or bad:
            ts_a = array("d", [e.ts for e in kept])
            dur_a = array("d", [e.dur for e in kept])
        self.ts.extend(ts_a)
        self.dur.extend(dur_a)
        args = [e.args or _NO_ARGS for e in kept]
        self._ints_into("corr", [-1 if a.correlation is None else a.correlation for a in args], self._huge_id)
        self._ints_into("stream", [-1 if a.stream is None else a.stream for a in args], self._huge_id)
        self._ints_into("nelems", [-1 if a.msg_nelems is None else a.msg_nelems for a in args], self._huge_id)
        colls = self.colls
        # A collective's args as one interned tab-joined string (`collective_args` splits it).
        keys = [None if a.collective is None else _collective_key(a) for a in args]
        self._ints_into("coll", [0 if k is None else (colls[k] if k in colls else colls.setdefault(k, len(colls)))
                                 for k in keys], int)

    def _drop_bad(self, kept: list, cis: list, bad: list[int]) -> tuple[list, list]:
        """Drop the events without a usable ts/dur, counting them (work events against
        thresholds.BAD_EVENT_SHARE_LIMIT); an annotation with no duration at all marks an instant."""
        drop = set()
        for i in bad:
            e, ci = kept[i], cis[i]
            work = ci < 3 or ci == _CPU_OP
            if not work and e.dur is None and _usable(e.ts, 0.0):
                e.dur = 0.0
                continue
            if work:
                self.n_bad_dur += 1
            else:
                self.n_bad_other += 1
            if len(self.bad_dur) < 3:
                self.bad_dur.append(f"{KEPT_CATS[ci]} {str(e.name)[:60]!r} ts={e.ts} dur={e.dur}")
            drop.add(i)
        return ([e for i, e in enumerate(kept) if i not in drop],
                [c for i, c in enumerate(cis) if i not in drop])

    def _ints_into(self, attr: str, vals: list, as_int: Callable[[Any], int]) -> None:
        """Append `vals` to int column `attr`, widening int8 -> int64 only as its values need."""
        dst = getattr(self, attr)
        try:
            dst.extend(array(dst.typecode, vals))  # all-int and in range (the usual case)
            return
        except OverflowError:
            pass
        except TypeError:
            vals = [as_int(v) for v in vals]
        while True:
            try:
                dst.extend(array(dst.typecode, vals))
                return
            except OverflowError:
                if dst.typecode == "q":  # beyond int64 (a crafted 2**63)
                    dst.extend(array("q", [as_int(v) for v in vals]))
                    return
                dst = array(_WIDER[dst.typecode], dst)
                setattr(self, attr, dst)

    def _huge_id(self, v: Any) -> int:
        """An id that is no int64 (a crafted 2**63) reads as no id (-1), counted."""
        if type(v) is int and -(1 << 63) <= v < (1 << 63):
            return v
        if v != -1:
            self.n_huge_ids += 1
        return -1

    def add_untyped(self, items: list) -> None:
        """Slow path for chunks whose field types differ from Kineto's usual ones."""
        evs = []
        for d in items:
            if not isinstance(d, dict):
                continue
            args = d.get("args") if isinstance(d.get("args"), dict) else {}

            def _int(v: Any) -> int | None:
                try:
                    return int(v) if v is not None else None
                except (TypeError, ValueError, OverflowError):
                    return None

            def _float(v: Any) -> float | None:
                try:
                    return float(v) if v is not None else None
                except (TypeError, ValueError):
                    return None
                except OverflowError:  # an integer beyond float: present but unusable
                    return float("inf")

            evs.append(_Event(
                cat=d.get("cat") if isinstance(d.get("cat"), str) else None,
                name=d.get("name"), pid=d.get("pid"), tid=d.get("tid"),
                ts=_float(d.get("ts")), dur=_float(d.get("dur")),
                args=_Args(correlation=_int(args.get("correlation")),
                           stream=_int(args.get("stream")),
                           collective=(str(args["Collective name"])
                                       if "Collective name" in args else None),
                           msg_nelems=_int(args.get("In msg nelems")),
                           dtype=str(args["dtype"]) if "dtype" in args else None,
                           group_size=_int(args.get("Group size")),
                           pg_name=(str(args["Process Group Name"]) if "Process Group Name" in args
                                    else None))))
        self.add(evs)

    def share(self, segments: list[tuple[int, int, int]], top: dict[str, Any] | None) -> _Share:
        # Narrowed column by column, each original let go at once: the shares are held whole while they merge.
        arrays = {}
        for col, attr in _ARRAY_FIELDS:
            a = getattr(self, attr)
            setattr(self, attr, array(a.typecode))
            arrays[col] = narrow_ints(np.frombuffer(a, dtype=a.typecode))
            del a
        return _Share(arrays=arrays, names=list(self.names), colls=list(self.colls),
                      ids=dict(self.ids), segments=segments, n_total=self.n_total,
                      n_bad_dur=self.n_bad_dur, bad_dur=list(self.bad_dur), unknown=dict(self.unknown),
                      unread={c: tuple(v) for c, v in self.unread.items()},
                      counts={"n_bad_other": self.n_bad_other, "n_names_capped": self.n_capped,
                              "n_huge_ids": self.n_huge_ids},
                      seen_device=self.seen_device, has_device=self.has_device, top=top)


_WIDER = {"b": "h", "h": "i", "i": "q"}
"""The next wider array typecode: int8 -> int16 -> int32 -> int64."""

_ARRAY_FIELDS = (
    ("cat", "cat"), ("name", "name"), ("pid", "pid"), ("tid", "tid"), ("ts", "ts"), ("dur", "dur"),
    ("correlation", "corr"), ("stream", "stream"), ("collective", "coll"),
    ("msg_nelems", "nelems"),
)
"""(table column, `_Collector` array) pairs."""


@dataclass
class _Share:
    """What one parsing process collected from its share of a trace's chunks."""

    arrays: dict[str, np.ndarray]
    """Columns as collected: `name`/`collective` index `names`/`colls`; string pids and
    tids carry negative ids from `ids`."""
    names: list[str]
    colls: list[str]
    ids: dict[Any, int]
    segments: list[tuple[int, int, int]]
    """(chunk number, first row, end row) of each decoded chunk, to restore file order."""
    n_total: int
    n_bad_dur: int
    bad_dur: list[str]
    unknown: dict[str, int]
    seen_device: bool
    has_device: bool
    top: dict[str, Any] | None
    """The trace's top-level metadata; only share 0 reads the trailer."""
    counts: dict[str, int] = field(default_factory=dict)
    """What was dropped or cut on the way (n_bad_other, n_names_capped, n_huge_ids)."""
    unread: dict[str, tuple[int, float]] = field(default_factory=dict)
    """{unread device category: (events, summed dur µs)} (`UNREAD_DEVICE_CATS`)."""


def _parsed_from_shares(shares: list[_Share]) -> ParsedTrace:
    arrays, all_names, colls = split.merge_shares(shares, tuple(c for c, _ in _ARRAY_FIELDS))
    seen_device = any(sh.seen_device for sh in shares)
    # On a GPU trace only the cpu_ops that name a purpose are kept (as context).
    keep = None
    if seen_device:
        ctx = np.fromiter((KEEP_FRAME[n] for n in all_names), dtype=bool, count=len(all_names))
        keep = arrays["cat"] != _CPU_OP
        if len(all_names):  # a slice at a time: numpy widens int32 indices to int64 first
            for lo in range(0, len(keep), FIRST_USE_CHUNK_ROWS):
                keep[lo:lo + FIRST_USE_CHUNK_ROWS] |= ctx[arrays["name"][lo:lo + FIRST_USE_CHUNK_ROWS]]
        keep = None if keep.all() else keep  # nothing to drop: no copy of every column
    # column by column, each original dropped once filtered: the table is held once plus a column
    columns = {k: (arrays.pop(k)[keep] if keep is not None else arrays.pop(k)) for k in list(arrays)}
    # Only the names still used, in order of first use: slim, and independent of how many processes parsed.
    columns["name"], names = _by_first_use(columns["name"], all_names)
    columns["collective"], colls = _by_first_use(columns["collective"], colls, keep=0)
    counts = sum((np.bincount(columns["cat"][lo:lo + FIRST_USE_CHUNK_ROWS].astype(np.intp), minlength=len(KEPT_CATS))
                  for lo in range(0, len(columns["cat"]), FIRST_USE_CHUNK_ROWS)), np.zeros(len(KEPT_CATS), np.int64))
    unknown: dict[str, int] = {}
    for sh in shares:
        for c, n in sh.unknown.items():
            unknown[c] = unknown.get(c, 0) + n
    stats = {
        "cat_counts": {c: int(n) for c, n in zip(KEPT_CATS, counts) if n},
        "n_events_total": sum(sh.n_total for sh in shares),
        "n_bad_dur": sum(sh.n_bad_dur for sh in shares),
        "bad_dur_examples": [x for sh in shares for x in sh.bad_dur][:3],
        **{k: sum(sh.counts.get(k, 0) for sh in shares) for k in ("n_bad_other", "n_names_capped", "n_huge_ids")},
        "unknown_cats": unknown,
        "unread_device": _unread_totals(shares),
    }
    return ParsedTrace(columns=columns, names=names, collectives=colls,
                       top=shares[0].top or {}, stats=stats)


def _unread_totals(shares: list[_Share]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for sh in shares:
        for c, (n, dur_us) in sh.unread.items():
            got = out.setdefault(c, {"n_events": 0, "dur_us": 0.0})
            got["n_events"] += n
            got["dur_us"] += dur_us
    return out


def _by_first_use(codes: np.ndarray, table: list[str], keep: int | None = None) -> tuple[np.ndarray, list[str]]:
    """Codes renumbered to the used entries of `table` in order of first use (`keep` first), in the
    narrowest ints; a slice at a time, to bound the load's peak memory."""
    first = np.full(max(len(table), 1), len(codes), dtype=np.int64)  # each code's first row
    for lo in range(0, len(codes), FIRST_USE_CHUNK_ROWS):
        u, at = np.unique(codes[lo:lo + FIRST_USE_CHUNK_ROWS], return_index=True)
        np.minimum.at(first, u, lo + at)
    used = np.flatnonzero(first < len(codes))
    used = used[np.argsort(first[used], kind="stable")]
    if keep is not None:
        used = np.concatenate([[keep], used[used != keep]]).astype(used.dtype)
    # pandas' own widths for codes (`Categorical.from_codes` would copy into them otherwise)
    width = np.int8 if len(used) < 127 else np.int16 if len(used) < 32767 else np.int32
    remap = np.zeros(max(len(table), 1), dtype=width)
    remap[used] = np.arange(len(used))
    out = np.empty(len(codes), dtype=width)
    for lo in range(0, len(codes), FIRST_USE_CHUNK_ROWS):
        out[lo:lo + FIRST_USE_CHUNK_ROWS] = remap[codes[lo:lo + FIRST_USE_CHUNK_ROWS]]
    return out, [table[i] for i in used]


FIRST_USE_CHUNK_ROWS = 1 << 16


def _in_range(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per event: ts and dur finite and in range (NaN compares False everywhere)."""
    return (ts >= 0) & (ts < MAX_TS_US) & (dur >= 0) & (dur <= MAX_DUR_US)


def _usable(ts: Any, dur: Any) -> bool:
    try:
        return bool(0 <= ts < MAX_TS_US and 0 <= dur <= MAX_DUR_US)
    except TypeError:  # None, or a value that is no number
        return False


def cap_name(name: str) -> str:
    """A name cut to NAME_CAP_CHARS for the rules and the tables, saying how long it was."""
    if len(name) <= NAME_CAP_CHARS:
        return name
    return f"{name[:NAME_CAP_CHARS]}…[cut: {len(name):,} chars]"


@dataclass
class ParsedTrace:
    """One trace's kept events as numpy arrays (`cat`, `name`, `collective` as codes); built without
    pandas so a loader process stays small, `frame()` makes the DataFrame."""

    columns: dict[str, np.ndarray]
    names: list[str]
    collectives: list[str]
    top: dict[str, Any]
    """The trace's top-level metadata (everything but traceEvents)."""
    stats: dict[str, Any]
    """cat_counts, n_events_total, n_bad_dur, bad_dur_examples, n_bad_other, n_names_capped,
    n_huge_ids, unknown_cats."""

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        c = self.columns
        # One column at a time, each original let go once narrowed, to bound the peak memory.
        for k in list(c):
            c[k] = narrow_ints(c[k])
        data: dict[str, Any] = dict(c)
        data["cat"] = pd.Categorical.from_codes(c["cat"], categories=list(KEPT_CATS))
        data["name"] = pd.Categorical.from_codes(c["name"], categories=self.names)
        data["collective"] = pd.Categorical.from_codes(c["collective"], categories=self.collectives)
        # copy=False: one block per column, so each column can be let go alone.
        return pd.DataFrame({k: data[k] for k in SLIM_COLUMNS}, copy=False)


_CAT_INDEX = {c: i for i, c in enumerate(KEPT_CATS)}
_CPU_OP = _CAT_INDEX["cpu_op"]
_PYFN = _CAT_INDEX["python_function"]
_KEEP_ALL = frozenset(KEPT_CATS) | frozenset(CAT_ALIASES)
_FRAME_CATS_ALL = frozenset({"python_function"})
_FRAME_CATS_GPU = frozenset({"python_function", "cpu_op", "Operator"})
_KEEP_ALL_NO_PYFN = _KEEP_ALL - _FRAME_CATS_ALL
_KEEP_GPU_NO_FRAMES = _KEEP_ALL - _FRAME_CATS_GPU
_NO_ARGS = _Args()
_get_cat = attrgetter("cat")
_get_name = attrgetter("name")


def _kept_struct(cat: str, gpu_frame: bool = False) -> type:
    fields = [("name", Any, None), ("pid", Any, None), ("tid", Any, None),
              ("ts", float | None, None), ("dur", float | None, None)]
    if cat == "python_function" or gpu_frame:
        # Frames carry no ids stepscope uses: leave their args unparsed.
        return msgspec.defstruct(f"_Ev_{cat}{'_frame' if gpu_frame else ''}", fields, tag=cat,
                                 tag_field="cat", gc=False, module=__name__, namespace={"args": None})
    return msgspec.defstruct(f"_Ev_{cat}", fields + [("args", _Args | None, None)],
                             tag=cat, tag_field="cat", gc=False, module=__name__)


# One struct per category, tagged by `cat`; skipped categories decode into empty structs. An unknown `cat`
# fails the chunk, which is decoded again with the generic `_Event`.
_TYPE_CI: dict[type, int] = {}
_tagged_types: list[type] = []
for _cat in list(KEPT_CATS) + list(CAT_ALIASES):
    _t = _kept_struct(_cat)
    _TYPE_CI[_t] = _CAT_INDEX[CAT_ALIASES.get(_cat, _cat)]
    _tagged_types.append(_t)
_UNREAD_TYPES: set[type] = set()
for _cat in sorted(IGNORED_CATS - set(KEPT_CATS)):
    _fields = [("ts", Any, None), ("dur", Any, None)] if _cat in UNREAD_DEVICE_CATS else []
    _tagged_types.append(msgspec.defstruct(f"_Skip_{_cat.replace(' ', '_')}", _fields, tag=_cat,
                                           tag_field="cat", gc=False, module=__name__,
                                           namespace={"cat": _cat} if _fields else None))
    if _fields:
        _UNREAD_TYPES.add(_tagged_types[-1])
_TYPES_ALL = frozenset(_TYPE_CI)
_PYFN_TYPE = next(t for t, ci in _TYPE_CI.items() if ci == _PYFN)
_TYPES_GPU = frozenset(t for t, ci in _TYPE_CI.items() if ci != _CPU_OP)
_TYPES_ALL_NO_PYFN = _TYPES_ALL - {_PYFN_TYPE}
_tagged_decoder = msgspec.json.Decoder(list[Union[tuple(_tagged_types)]])
# On a GPU trace cpu_ops are only context frames: decode them without their args.
_CPU_OP_TAGS = ("cpu_op",) + tuple(a for a, c in CAT_ALIASES.items() if c == "cpu_op")
_CPU_FRAME_TYPES = [_kept_struct(c, gpu_frame=True) for c in _CPU_OP_TAGS]
for _t in _CPU_FRAME_TYPES:
    _TYPE_CI[_t] = _CPU_OP
_tagged_decoder_gpu = msgspec.json.Decoder(list[Union[tuple(
    [t for t in _tagged_types if _TYPE_CI.get(t) != _CPU_OP] + _CPU_FRAME_TYPES)]])
_TYPES_GPU_NO_FRAMES = _TYPES_GPU - {_PYFN_TYPE}
_FRAME_TYPES_ALL = frozenset({_PYFN_TYPE})
_FRAME_TYPES_GPU = frozenset([_PYFN_TYPE, *_CPU_FRAME_TYPES])
_KNOWN_OR_NONE = KNOWN_CATS | {None}


def _decode_into(col: _Collector, region) -> None:
    """Decode a `[...]` region into the collector, fastest decoder first; raises msgspec.DecodeError only
    for malformed JSON."""
    try:
        events = (_tagged_decoder_gpu if col.seen_device else _tagged_decoder).decode(region)
        col.add_tagged(events)
        return
    except msgspec.ValidationError:
        pass
    try:
        col.add(_events_decoder.decode(region))
    except msgspec.ValidationError:
        col.add_untyped(_any_decoder.decode(region))


def read_trace(path: str | Path, *, progress: Callable[[int], None] | None = None
               ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Stream one trace file. Returns (slim events, {"top": metadata, "stats": load stats})."""
    parsed = parse_trace(path, progress=progress)
    return parsed.frame(), {"top": parsed.top, "stats": parsed.stats}


def parse_trace(path: str | Path, *, progress: Callable[[int], None] | None = None,
                keep_cpu_ops: bool | None = None, processes: int | None = None) -> ParsedTrace:
    """Stream one trace file into numpy arrays of its kept events; raises TraceError for a truncated gzip,
    invalid JSON or a non-trace.

    `keep_cpu_ops=None` decides from the header: Kineto writes CPU events before the first kernel, so a
    GPU trace skips `cpu_op` from the start. A large trace is split over `processes`, each decompressing
    the whole stream and decoding every n-th chunk; any boundary doubt falls back to one process.
    """
    path = Path(path)
    require_regular_file(path)
    n = split.split_count(path, processes)
    shares = split.parse_split(path, n, parse_share, keep_cpu_ops, progress) if n > 1 else None
    if shares is None:
        shares = [parse_share(path, 0, 1, keep_cpu_ops, progress)]
    if keep_cpu_ops is None and any(sh.seen_device for sh in shares) \
            and not any(sh.has_device for sh in shares):
        logger.info("%s: deviceProperties names a GPU but the trace holds no device work; "
                    "reading it again keeping its cpu_ops", path)
        return parse_trace(path, progress=progress, keep_cpu_ops=True, processes=processes)
    return _parsed_from_shares(shares)



def parse_share(path: Path, share: int, of: int, keep_cpu_ops: bool | None,
                progress: Callable[[int], None] | None) -> _Share:
    """Decode every `of`-th chunk of the trace, starting with chunk `share`."""
    col = _Collector()
    segments: list[tuple[int, int, int]] = []
    with open_stream(path, threaded=of == 1) as stream:
        buf, pos, header = _read_header(stream, path, keep_cpu_ops, col)
        consumed = 0  # decompressed bytes before buf[0], for error offsets
        eof = False
        chunk_no = 0
        while True:
            data = _read(stream, path, CHUNK_BYTES)
            if _blank_after(buf, data):
                continue  # a whitespace run is never buffered (error offsets then count it out)
            if data:
                del buf[:pos - 1]
                consumed += pos - 1
                pos = 1
                buf += data
                if progress is not None:
                    progress(len(data))
            else:
                eof = True
            try:
                pos, chunk_no = _decode_next(col, buf, pos, chunk_no, share, of, segments, path, consumed)
            except _ArrayEnded as ended:
                if of > 1:  # only one process reads the trailer: let it read the whole trace
                    raise split.SplitFailed() from None
                tail = bytes(buf[ended.at:]) + _read_rest(stream, path, TRAILER_MAX_BYTES)
                return col.share(segments, _top_metadata(header, tail, path, consumed + ended.at))
            if eof:
                break
        if share != 0:
            return col.share(segments, None)
        rows = len(col.ts)
        tail = _decode_last(col, bytes(buf[pos:]), path)
        segments.append((chunk_no, rows, len(col.ts)))
    meta = _top_metadata(header, tail, path, consumed + len(buf))
    return col.share(segments, meta)


def _blank_after(buf: bytearray, data: bytes) -> bool:
    """Whether `data` is only JSON whitespace after whitespace, so it can be skipped unbuffered."""
    return (bool(data) and data[0] in _WS and data[-1] in _WS and bool(buf) and buf[-1] in _WS
            and not data.translate(None, _WS))


def _read_rest(stream, path: Path, limit: int) -> bytes:
    """The rest of the stream (the keys after traceEvents), whitespace runs skipped, at most `limit`."""
    out = bytearray()
    while data := _read(stream, path, CHUNK_BYTES):
        if _blank_after(out, data):
            continue
        out += data
        if len(out) > limit:
            raise TraceError(f"more than {limit >> 20} MB of metadata after traceEvents", where=str(path),
                             hint="this is not a Kineto trace, or a crafted one: Kineto writes a few keys there")
    return bytes(out)


def _read_header(stream, path: Path, keep_cpu_ops: bool | None, col: _Collector
                 ) -> tuple[bytearray, int, bytes | None]:
    """(buffer, offset of the first event, the header before traceEvents or None for the
    bare-array form). A GPU header (deviceProperties) makes the collector drop cpu_ops."""
    buf = bytearray()
    while True:
        data = _read(stream, path, CHUNK_BYTES)
        if _blank_after(buf, data):
            continue
        buf += data
        head = buf.lstrip()[:1]
        if head and head not in (b"{", b"["):
            raise TraceError("not a JSON trace (it does not start with '{' or '[')",
                             where=str(path), hint="pass Kineto .json / .json.gz traces")
        if head == b"[":
            # Chrome's "JSON array" form: the whole file is the event list.
            return buf, buf.index(b"[") + 1, None
        m = _KEY_RE.search(buf)
        if m:
            header = bytes(buf[:m.end() - 1])
            if keep_cpu_ops is None and _GPU_HEADER_RE.search(header):
                col.seen_device = True  # i.e. drop cpu_ops from the first event on
            return buf, m.end(), header
        if not data or len(buf) > TRAILER_MAX_BYTES:
            raise TraceError(
                "no traceEvents array: this JSON is not a Kineto / Chrome trace",
                where=str(path),
                hint="pass the *.pt.trace.json(.gz) files the profiler wrote")


def _decode_next(col: _Collector, buf: bytearray, pos: int, chunk_no: int, share: int, of: int,
                 segments: list[tuple[int, int, int]], path: Path, consumed: int) -> tuple[int, int]:
    """Decode buf[pos:] up to its last event boundary when the chunk is this share's; returns (offset
    after it, next chunk number), unchanged when no complete event is buffered yet."""
    hi = len(buf)
    attempts = 0
    while True:
        b = _last_boundary(buf, pos, hi)
        if b is None:
            return pos, chunk_no
        end, nxt = b
        if chunk_no % of != share:  # another process decodes this chunk
            return nxt, chunk_no + 1
        rows = len(col.ts)
        if _decode_region(col, buf, pos, end, of > 1, path, consumed, attempts):
            if of > 1:
                segments.append((chunk_no, rows, len(col.ts)))
            return nxt, chunk_no + 1
        attempts += 1
        hi = end - 1


def _decode_region(col: _Collector, buf: bytearray, pos: int, end: int, in_split: bool, path: Path,
                   consumed: int, attempts: int) -> bool:
    """Decode buf[pos:end+1] in place (its bounding bytes turned into `[` `]`, no copy); False when the
    cut fell inside a nested object."""
    saved = buf[end]
    buf[pos - 1] = 0x5B  # '['
    buf[end] = 0x5D  # ']'
    try:
        with memoryview(buf) as mv, mv[pos - 1:end + 1] as region:
            try:
                _decode_into(col, region)
                return True
            except (msgspec.DecodeError, RecursionError) as exc:
                if in_split:
                    raise split.SplitFailed() from None
                if isinstance(exc, RecursionError):
                    raise _too_deep(path, consumed + pos, consumed + end) from None
                m = _BYTE_RE.search(str(exc))
                at = int(m.group(1)) if m else -1  # no offset: a value refused ("Number out of range")
                if not m and "truncated" in str(exc):
                    at = len(region)  # the region ends inside an event: the cut fell in a nested object
                if "trailing characters" in str(exc):
                    # traceEvents ended inside this region and top-level keys follow; msgspec's offset is one
                    # past the first trailing character.
                    _decode_into(col, region[:at - 1])
                    raise _ArrayEnded(pos - 1 + at - 1) from None
                # An error well before the cut is real damage; one at the cut means the cut fell inside a
                # nested object.
                if at < len(region) - 2 or attempts > 20:
                    _decode_lenient(col, region, path, consumed + pos + max(at, 0), exc)
                    return True
                return False
    finally:
        buf[end] = saved


class _ArrayEnded(Exception):
    """traceEvents closed inside a decoded region; `at`: where the rest of the object starts."""

    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at


def _too_deep(path: Path, lo: int, hi: int) -> TraceError:
    where = (f"in the events between bytes {lo:,} and {hi:,} of the decompressed trace" if lo >= 0
             else "in the last events of traceEvents")
    return TraceError(
        f"JSON nested deeper than the parser's limit {where} (Kineto nests an event 3 levels deep)",
        where=str(path),
        hint="the file is crafted or damaged: remove the deeply nested value (usually inside an "
             "event's args), or capture the trace again")


def _decode_lenient(col: _Collector, region, path: Path, offset: int, exc: Exception) -> None:
    """The region again with Python's json, which reads the NaN/Infinity/1e400 real exporters write; those
    events are then dropped and counted."""
    import json

    try:
        items = json.loads(bytes(region))
    except RecursionError:
        raise _too_deep(path, offset, offset + len(region)) from None
    except ValueError:
        raise _malformed(path, offset, exc) from None
    col.add_untyped(items if isinstance(items, list) else [])


def _decode_last(col: _Collector, rest: bytes, path: Path) -> bytes:
    """Decode the last event(s) before the closing bracket; return what follows the array."""
    s = rest.lstrip()
    if s.startswith(b"]"):
        return s[1:]
    idx = -1
    while True:
        idx = rest.find(b"]", idx + 1)
        if idx < 0:
            raise TraceError(
                "the JSON ends inside the traceEvents array (the file is truncated)",
                where=str(path),
                hint="copy the trace again once the profiler has finished writing it")
        try:
            _decode_into(col, b"[" + rest[:idx + 1])
        except msgspec.DecodeError:
            continue
        except RecursionError:
            raise _too_deep(path, -1, -1) from None
        return rest[idx + 1:]


def _top_metadata(header: bytes | None, tail: bytes, path: Path, offset: int) -> dict[str, Any]:
    """The trace's top-level keys (everything but traceEvents)."""
    try:
        meta = {} if header is None else _any_decoder.decode(header + b"[]" + tail)
    except msgspec.DecodeError as exc:
        raise _malformed(path, offset, exc) from None
    if not isinstance(meta, dict):
        raise TraceError("not a Kineto trace (top level is not an object)", where=str(path))
    meta.pop("traceEvents", None)
    return meta
