"""Rank traces in, one slim DataFrame per rank out: `load_rank`, `load_ranks`.

Joins `parse`, `split` and `cache` (their public names re-exported here), decides which rank a trace is,
rejects traces with nothing to account, and loads many ranks in parallel.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from stepscope import schema
from stepscope.errors import TraceError
from stepscope.wording import flag_message
from stepscope.filenames import parse_name, rank_from_filename, sglang_stage
from stepscope.trace import split
from stepscope.trace.cache import cache_key, cache_read, cache_write
from stepscope.thresholds import BAD_EVENT_SHARE_LIMIT
from stepscope.trace.parse import (ANNOTATION_CATS, CAT_ALIASES, CHUNK_BYTES,
                                   DEVICE_CATS, IGNORED_CATS, KEPT_CATS, KNOWN_CATS, LAUNCH_CATS,
                                   LOADER_VERSION, NAME_CAP_CHARS, SLIM_COLUMNS, ParsedTrace, parse_trace,
                                   read_trace, require_regular_file)
from stepscope.trace.split import MAX_SPLIT, SPLIT_MIN_JSON_BYTES, usable_cores

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ANNOTATION_CATS", "BAD_EVENT_SHARE_LIMIT", "CAT_ALIASES", "CHUNK_BYTES", "DEVICE_CATS",
    "IGNORED_CATS", "KEPT_CATS", "KNOWN_CATS", "LAUNCH_CATS", "LOADER_VERSION", "MAX_SPLIT",
    "SLIM_COLUMNS", "SPLIT_MIN_JSON_BYTES", "ParsedTrace", "RankTrace", "cache_key",
    "default_workers", "load_rank", "load_ranks", "parse_name", "parse_trace",
    "rank_from_filename", "read_trace", "usable_cores",
]

logger = logging.getLogger(__name__)


@dataclass
class RankTrace:
    """One rank's slim event table plus what the file said about itself."""

    rank: int
    path: Path
    events: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    flags: list[schema.Flag] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return self.meta.get("mode", "gpu")


# --------------------------------------------------------------------------- one rank


def new_flag(code: str, severity: str, message: str | None = None, **values: Any) -> schema.Flag:
    """One of stage 05's flags with the values its sentence is written from (`wording.flag_message`)."""
    flag = schema.Flag(code=code, severity=severity, message=message or "", **values)
    if message is None:
        flag.message = flag_message(flag)
    return flag


def load_rank(path: str | Path, *, rank: int | None = None, cache_dir: str | Path | None = None,
              allow_no_rank: bool = False) -> RankTrace:
    """Load one rank trace, from the Parquet cache when read before. Rank: `rank` if given, else
    `distributedInfo.rank`, else the file name; `allow_no_rank` lets a lone file be 0."""
    path = Path(path)
    key, cached = _from_cache(path, cache_dir, rank, allow_no_rank)
    if cached is not None:
        return cached
    return _from_parsed(path, parse_trace(path), key, cache_dir, rank, allow_no_rank)


def _from_cache(path: Path, cache_dir: str | Path | None, rank: int | None,
                allow_no_rank: bool) -> tuple[str | None, RankTrace | None]:
    """(cache key, the rank from the Parquet cache or None); (None, None) without a cache.
    TraceError first for a path that is no regular file: the cache key reads it."""
    require_regular_file(path)
    if cache_dir is None:
        return None, None
    key = cache_key(path)
    hit = cache_read(Path(cache_dir), key)
    if hit is None:
        return key, None
    return key, _finish(path, hit[0], hit[1], rank, allow_no_rank, from_cache=True)


def _from_parsed(path: Path, parsed: ParsedTrace, key: str | None, cache_dir: str | Path | None,
                 rank: int | None, allow_no_rank: bool) -> RankTrace:
    df = parsed.frame()
    meta = _summarize_meta(path, parsed.top, parsed.stats)
    if key is not None and cache_dir is not None:
        cache_write(Path(cache_dir), key, df, meta)
    return _finish(path, df, meta, rank, allow_no_rank, from_cache=False)


def _summarize_meta(path: Path, top: dict[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
    dist = top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else {}
    dev = top.get("deviceProperties")
    first = dev[0] if isinstance(dev, list) and dev and isinstance(dev[0], dict) else None
    device_name = first.get("name") if first else None
    return {
        "file": str(path),
        "bytes": path.stat().st_size,
        "dist_rank": dist.get("rank"),
        "world_size": dist.get("world_size"),
        "backend": dist.get("backend"),
        "device_name": device_name,
        # The first device's properties, for stepscope.hardware.lookup_device (some ROCm
        # traces leave the name empty; the properties still identify the part).
        "device_properties": first,
        "device_count": len(dev) if isinstance(dev, list) else 0,
        "vllm_version": top.get("vllm_version"),
        "base_time_ns": top.get("baseTimeNanoseconds"),
        **stats,
    }


def _finish(path: Path, df: pd.DataFrame, meta: dict[str, Any], rank: int | None,
            allow_no_rank: bool, *, from_cache: bool) -> RankTrace:
    flags: list[schema.Flag] = []
    meta = dict(meta)
    meta["file"] = str(path)
    meta["from_cache"] = from_cache
    if rank is not None:
        meta["rank_source"] = "given"
    elif isinstance(meta.get("dist_rank"), int):
        rank = meta["dist_rank"]
        meta["rank_source"] = "distributedInfo.rank"
    elif (pf := parse_name(path)).rank is not None:
        rank = pf.rank
        meta["rank_source"] = f"file name ({pf.rank_source})"
    elif allow_no_rank:
        rank = 0
        meta["rank_source"] = "assumed (single file)"
        flags.append(new_flag("rank_assumed", "info", file=path.name))
    else:
        raise TraceError(
            "cannot tell which rank this trace belongs to: no distributedInfo.rank and "
            "no rank in the file name",
            where=str(path),
            hint="rename it to include rank<N> (e.g. trace_rank0.json.gz)")
    meta["rank"] = int(rank)
    from stepscope.trace.codes import in_values  # pandas: not in a parse process

    n_dev = int(in_values(df["cat"], DEVICE_CATS).sum())  # isin: int64 codes, 12 bytes an event
    n_cpu = int((df["cat"] == "cpu_op").sum())
    n_work = n_dev if n_dev else n_cpu
    unknown = meta.get("unknown_cats") or {}
    if meta.get("n_events_total", 0) == 0:
        raise TraceError("the trace holds no events (traceEvents is empty)", where=str(path),
                         hint="the profiler was stopped before any step ran; capture again "
                              "with requests in flight between /start_profile and /stop_profile")
    if n_work == 0:
        if unknown:
            listing = ", ".join(f"{c!r} ({n})" for c, n in sorted(unknown.items()))
            raise TraceError(f"no device or cpu_op events; only unknown event categories {listing}",
                             where=str(path),
                             hint="this is not a Kineto trace stepscope can read, or a newer "
                                  "format: add the category mapping to stepscope.trace.load")
        raise TraceError("the trace holds no device events (kernel/memcpy/memset) and no cpu_op "
                         "events, so there is no work to account", where=str(path),
                         hint="capture with the CUDA activity enabled (or CPU ops on a CPU build)")
    flags.extend(_bad_work_events(path, int(rank), meta, n_work))
    flags.extend(_dropped_or_cut_flags(rank, meta))
    if unknown:
        flags.append(new_flag("unknown_event_category", "warning", rank=int(rank),
                              categories={str(c): int(n) for c, n in unknown.items()}))
    if meta.get("unread_device"):
        flags.append(new_flag("unread_device_work", "warning", rank=int(rank), cpu=n_dev == 0, top_names=[
            schema.NamedTime(name=str(c), sum_us=float(v["dur_us"]), count=int(v["n_events"]))
            for c, v in sorted(meta["unread_device"].items())]))
    meta["mode"] = "gpu" if n_dev else "cpu"
    return RankTrace(rank=int(rank), path=path, events=df, meta=meta, flags=flags)


_BAD_WORK = ("a missing or negative duration, or a non-numeric, non-finite or out-of-range duration or "
             "timestamp")


def _bad_work_events(path: Path, rank: int, meta: dict[str, Any], n_work: int) -> list[schema.Flag]:
    """The flag for work events dropped for an unusable ts or dur; TraceError beyond BAD_EVENT_SHARE_LIMIT of
    the rank's work (damaged, not ragged)."""
    bad = int(meta.get("n_bad_dur", 0))
    if not bad:
        return []
    share = bad / (n_work + bad)
    ex = "; ".join(meta.get("bad_dur_examples") or [])
    if share > BAD_EVENT_SHARE_LIMIT:
        raise TraceError(
            f"{bad:,} of {n_work + bad:,} work events ({share:.2%}) have {_BAD_WORK} (e.g. {ex}): over the "
            f"{BAD_EVENT_SHARE_LIMIT:.0%} of its work events a rank may lose (thresholds.BAD_EVENT_SHARE_LIMIT)",
            where=str(path), hint="the trace is damaged (profiler buffer overflow?); capture again")
    return [new_flag("bad_durations", "warning",
                     f"rank {rank}: dropped {bad:,} work events ({share:.2%} of them; a rank is refused above "
                     f"{BAD_EVENT_SHARE_LIMIT:.0%}) with {_BAD_WORK} (e.g. {ex})",
                     rank=rank, n_events=bad, share=share, limit_share=BAD_EVENT_SHARE_LIMIT)]


def _dropped_or_cut_flags(rank: int, meta: dict[str, Any]) -> list[schema.Flag]:
    """Flags for what the parser dropped or cut besides work events (`parse._Collector`)."""
    out = []
    if n := int(meta.get("n_bad_other") or 0):
        out.append(new_flag("bad_timestamps", "warning", rank=int(rank), n_events=n))
    if n := int(meta.get("n_names_capped") or 0):
        out.append(new_flag("names_capped", "warning", rank=int(rank), n_events=n, limit_chars=NAME_CAP_CHARS))
    if n := int(meta.get("n_huge_ids") or 0):
        out.append(new_flag("ids_out_of_range", "warning", rank=int(rank), n_events=n))
    return out


# --------------------------------------------------------------------------- many ranks


def _guarded(path: Path, fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """(fn(), None), or (None, message) when it fails: one odd file must not stop the others."""
    try:
        return fn(), None
    except TraceError as exc:
        return None, exc.render()
    except Exception as exc:  # noqa: BLE001
        return None, (f"{path}: unexpected {type(exc).__name__} while reading: {exc}\n"
                      "  fix: this looks like a stepscope bug; please report it with the file")


def _parse_worker(path: Path, processes: int) -> tuple[ParsedTrace | None, str | None]:
    # Runs in a loader process: it parses only, and sends numpy arrays back, so the
    # worker never builds (or pickles) a DataFrame.
    return _guarded(path, lambda: parse_trace(path, processes=processes))


def default_workers(paths: list[Path], memory_budget_bytes: int | None = None) -> int:
    """Processes for loading: at most the usable cores and what the memory budget allows (parsing peaks at
    ~0.25x the JSON size; 0.4x plus 64 MB per rank leaves headroom)."""
    if memory_budget_bytes is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            avail = 4 << 30
        memory_budget_bytes = int(avail * 0.5)
    biggest = max((split.json_size_estimate(p) for p in paths), default=1)
    per_rank = 0.4 * biggest + (64 << 20)
    by_mem = max(1, int(memory_budget_bytes // per_rank))
    return max(1, min(len(paths), split.usable_cores(), by_mem))


def load_ranks(paths: Iterable[str | Path], *, cache_dir: str | Path | None = None,
               workers: int | None = None, memory_budget_bytes: int | None = None,
               progress: bool = True) -> tuple[list[RankTrace], list[schema.Flag]]:
    """Load many rank traces in parallel; a bad file never stops the others. (ranks sorted by rank, flags): an
    unreadable file becomes an error flag, a second file claiming a rank is flagged."""
    from stepscope import progress as _progress

    paths = [Path(p) for p in paths]
    allow_no_rank = len(paths) == 1
    results: dict[Path, tuple[RankTrace | None, str | None]] = {}
    bar = _progress.bar(total=len(paths), desc="load traces", unit="rank", disable=not progress)
    # Cache hits are read here (Parquet, well under a second each); only misses are parsed.
    keys: dict[Path, str | None] = {}
    todo: list[Path] = []
    for p in paths:
        if p.is_file() and p.stat().st_size == 0:  # say so, rather than "not a trace"
            results[p] = (None, TraceError("empty file (0 bytes)", where=str(p),
                                           hint="the profiler did not finish writing it: capture again").render())
            bar.update()
            continue
        found, err = _guarded(p, lambda p=p: _from_cache(p, cache_dir, None, allow_no_rank))
        if err is None and found[1] is None:  # a cache miss: parse it below
            keys[p] = found[0]
            todo.append(p)
            continue
        results[p] = (None if err else found[1], err)
        bar.update()

    def finish(p: Path, parsed: ParsedTrace | None, err: str | None) -> None:
        results[p] = (None, err) if parsed is None else _guarded(
            p, lambda: _from_parsed(p, parsed, keys[p], cache_dir, None, allow_no_rank))
        bar.update()

    if workers is None:
        workers = default_workers(todo, memory_budget_bytes) if todo else 1
    workers = max(1, min(workers, len(todo)))
    # Cores left over by the rank-level processes split each trace further.
    per_trace = max(1, min(split.MAX_SPLIT, split.usable_cores() // workers))
    if workers == 1:
        for p in todo:
            finish(p, *_parse_worker(p, per_trace))
    else:
        import multiprocessing as mp

        # fork: the workers share the parent's imported modules instead of importing
        # their own copies (each would cost ~40 MB of private memory).
        ctx = mp.get_context("fork") if hasattr(os, "fork") else None
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            try:  # the submits too: an interrupt between them must not leave a worker waiting
                futs = {pool.submit(_parse_worker, p, per_trace): p for p in todo}
                for fut in as_completed(futs):
                    finish(futs[fut], *fut.result())
            except BaseException:  # Ctrl-C: do not wait for the other ranks' parses
                split.stop_workers(pool)
                raise
    bar.close()
    return _one_per_rank(paths, results)


def _one_per_rank(paths: list[Path], results: dict[Path, tuple[RankTrace | None, str | None]]
                  ) -> tuple[list[RankTrace], list[schema.Flag]]:
    """(ranks sorted by rank, flags): unreadable files and duplicate ranks become flags; of
    SGLang's per-stage pair (DECODE, EXTEND) of one rank the DECODE trace is kept."""
    flags: list[schema.Flag] = []
    ranks: dict[int, RankTrace] = {}
    for p in paths:  # input order decides which duplicate wins
        rt, err = results[p]
        if err is not None:
            flags.append(new_flag("rank_unreadable", "error", err))
            continue
        assert rt is not None
        if rt.rank not in ranks:
            ranks[rt.rank] = rt
            flags.extend(rt.flags)
            continue
        first = ranks[rt.rank].path
        stages = {sglang_stage(first), sglang_stage(p)}
        if None not in stages and len(stages) == 2:
            # SGLang writes one trace per stage and rank: decode is what stage 05 reads.
            keep, other = (rt, ranks[rt.rank]) if sglang_stage(p) == "DECODE" else (ranks[rt.rank], rt)
            ranks[rt.rank] = keep
            if keep is rt:
                flags.extend(rt.flags)
            flags.append(new_flag("sglang_stage_split", "info",
                               f"rank {rt.rank}: SGLang wrote {keep.path.name} and "
                               f"{other.path.name}; the DECODE trace is analysed"))
            continue
        flags.append(new_flag(
            "duplicate_rank", "error",
            str(TraceError(f"claims rank {rt.rank}, like {first.name} (from "
                           f"{rt.meta.get('rank_source')}); it was left out",
                           where=str(p),
                           hint="pass one trace per rank; remove the stale copy"))))
    return [ranks[r] for r in sorted(ranks)], flags
