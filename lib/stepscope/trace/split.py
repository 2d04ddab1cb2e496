"""One trace parsed by several processes: how many, running them, merging what they read.

Each process decompresses the whole stream (a fifth of the cost) and decodes every n-th chunk; the shares
merge into file order, identical to one process's result. Imports nothing from `parse`, which imports it.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from stepscope.trace.widths import narrow_ints

if TYPE_CHECKING:
    from stepscope.trace.parse import _Share

logger = logging.getLogger(__name__)

MAX_SPLIT = 4
"""Most processes for one trace: each also decompresses the whole stream."""
SPLIT_MIN_JSON_BYTES = 64 << 20
"""Smaller traces parse in well under a second in one process."""


class SplitFailed(Exception):
    """A chunk boundary may be wrong: parse in one process instead."""


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def json_size_estimate(p: Path) -> int:
    """Bytes of JSON in a trace file from the gzip trailer's ISIZE (modulo 2**32, so the smallest size at or
    above the compressed one), not a ratio: tiny events compress 300x."""
    size = p.stat().st_size
    with open(p, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b" or size < 18:
            return size
        fh.seek(size - 4)
        isize = int.from_bytes(fh.read(4), "little")
    while isize < size:
        isize += 1 << 32
    return isize


def split_count(path: Path, processes: int | None) -> int:
    """Processes to parse this trace with (1: no split)."""
    if processes is None:
        processes = min(MAX_SPLIT, usable_cores())
    if processes <= 1 or not hasattr(os, "fork") or json_size_estimate(path) < SPLIT_MIN_JSON_BYTES:
        return 1
    return processes


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """End a pool's workers now: leaving its `with` would wait for every share, and Ctrl-C must end the
    analysis within a second."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def parse_split(path: Path, n: int, parse_share: Callable[..., _Share], keep_cpu_ops: bool | None,
                progress: Callable[[int], None] | None) -> list[_Share] | None:
    """Shares 1..n-1 in forked processes while this one parses share 0; None: fall back. Columns come through
    a pipe straight into arrays, never pickled (a pickle held each share twice)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    workers: list[tuple[Any, Any]] = []
    try:
        for i in range(1, n):
            receiving, sending = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_send_share, args=(sending, parse_share, path, i, n, keep_cpu_ops),
                               daemon=True)
            workers.append((proc, receiving))
            proc.start()
            sending.close()  # the child's end: a child that dies then reads as an end of file here
    except (OSError, ValueError) as exc:
        _stop(workers)
        logger.info("%s: cannot fork parsing processes (%s); parsing in one", path, exc)
        return None
    try:
        shares = [parse_share(path, 0, n, keep_cpu_ops, progress)]
        shares += [_receive_share(conn, path) for _, conn in workers]
    except SplitFailed:
        _stop(workers)
        logger.info("%s: a chunk cut fell inside an event; parsing in one process", path)
        return None
    except BaseException:  # Ctrl-C, or a share's own error: the others are not waited for
        _stop(workers)
        raise
    for proc, conn in workers:
        proc.join()
        conn.close()
    return shares


def _stop(workers: list[tuple[Any, Any]]) -> None:
    """End the parsing processes now (an interrupt, an error or a fallback)."""
    for proc, conn in workers:
        if proc.pid is not None and proc.is_alive():
            proc.terminate()
        conn.close()
    for proc, _ in workers:
        if proc.pid is not None:
            proc.join()


def _send_share(conn: Any, parse_share: Callable[..., _Share], path: Path, share: int, of: int,
                keep_cpu_ops: bool | None) -> None:
    """In a parsing process: parse one share, then send it, its columns one at a time, each
    let go once sent."""
    try:
        sh = parse_share(path, share, of, keep_cpu_ops, None)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
        try:
            conn.send(("error", exc))
        except Exception:  # an exception that does not pickle: its type and text
            conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
        return
    arrays, sh.arrays = sh.arrays, {}
    conn.send(("share", sh, [(col, a.dtype.str, len(a)) for col, a in arrays.items()]))
    for col in list(arrays):
        a = np.ascontiguousarray(arrays.pop(col))
        conn.send_bytes(memoryview(a).cast("B"))
        del a
    conn.close()


def _receive_share(conn: Any, path: Path) -> _Share:
    """A share sent by `_send_share`, its columns read into arrays made for them."""
    from stepscope.errors import TraceError

    try:
        kind, *rest = conn.recv()
        if kind == "error":
            raise rest[0]
        sh, columns = rest
        for col, dtype, n in columns:
            a = np.empty(n, dtype=dtype)
            if n:
                conn.recv_bytes_into(a)
            else:
                conn.recv_bytes()
            sh.arrays[col] = a
    except EOFError:
        raise TraceError("a parsing process ended before sending its share of the trace (killed, "
                         "perhaps for memory)", where=str(path),
                         hint="free memory (or give the machine more) and run again; a trace that is over "
                              "stepscope's budget is refused with a message (--memory-budget-gb)") from None
    return sh


def merge_shares(shares: list[_Share], columns: tuple[str, ...]
                 ) -> tuple[dict[str, np.ndarray], list[str], list[str]]:
    """One set of columns in file order, names, collectives and string ids renumbered; consumes the shares'
    arrays column by column so the merge holds the table once."""
    if len(shares) == 1:
        sh = shares[0]
        return sh.arrays, sh.names, sh.colls
    names: dict[str, int] = {}
    colls: dict[str, int] = {"": 0}
    ids: dict[Any, int] = {}
    pieces: list[tuple[int, int, int, int]] = []  # (chunk number, share, first row, end row)
    for i, sh in enumerate(shares):
        a = sh.arrays
        name_map = narrow_ints(np.array([names.setdefault(n, len(names)) for n in sh.names], dtype=np.int64))
        coll_map = narrow_ints(np.array([colls.setdefault(c, len(colls)) for c in sh.colls], dtype=np.int64))
        if len(a["name"]):
            a["name"] = name_map[a["name"]]
            a["collective"] = coll_map[a["collective"]]
        for key, local in sh.ids.items():
            glob = ids.setdefault(key, -2 - len(ids))
            if glob != local:
                for c in ("pid", "tid"):
                    a[c] = np.where(a[c] == local, np.array(glob, dtype=np.min_scalar_type(glob)), a[c])
        pieces.extend((chunk, i, lo, hi) for chunk, lo, hi in sh.segments)
    pieces.sort()
    total = sum(hi - lo for _, _, lo, hi in pieces)
    arrays: dict[str, np.ndarray] = {}
    for col in columns:
        # the widest of the shares' widths (each share narrowed its own); an empty one has none
        out = np.empty(total, dtype=np.result_type(*[sh.arrays[col].dtype for sh in shares
                                                     if len(sh.arrays[col])] or [shares[0].arrays[col].dtype]))
        pos = 0
        for _, i, lo, hi in pieces:
            out[pos:pos + hi - lo] = shares[i].arrays[col][lo:hi]
            pos += hi - lo
        arrays[col] = out
        for sh in shares:
            del sh.arrays[col]
    return arrays, list(names), list(colls)
