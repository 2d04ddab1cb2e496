"""The sweep on the console: a line per finished level and the closing level table, both from levels.csv's
columns (`run.level_row`), so the console says what the file says."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from stepscope.wording import fmt_num

TABLE_TITLE = " Serving Benchmark Result, per level "
"""The banner above the end-of-run table, as vLLM's `bench serve` banners its result."""

TABLE_COLUMNS = (("level", "level", 8), ("load", "load", 10), ("ok", "ok", 6), ("failed", "failed", 6),
                 ("request_throughput_rps", "req/s", 7), ("output_throughput_tok_s", "out tok/s", 10),
                 ("ttft_ms_median", "TTFT p50", 9), ("ttft_ms_p99", "TTFT p99", 9),
                 ("tpot_ms_median", "TPOT p50", 9), ("tpot_ms_p99", "TPOT p99", 9))
"""(levels.csv column or derived key, header, width) of the end-of-run table; latencies in ms."""


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _count(v: Any) -> int:
    x = _num(v)
    return 0 if math.isnan(x) else int(x)


def load_words(row: Mapping[str, Any]) -> str:
    """`c=4`, `2.5 req/s`, or a ramp's name: the level's load as vLLM's flags name it."""
    if row.get("mode") == "concurrency" and not math.isnan(_num(row.get("concurrency"))):
        return f"c={int(_num(row['concurrency']))}"
    if row.get("mode") == "rate" and not math.isnan(_num(row.get("request_rate"))):
        return f"{fmt_num(_num(row['request_rate']))} req/s"
    return str(row.get("level"))


def level_flags(row: Mapping[str, Any]) -> list[str]:
    """What makes a level's numbers suspect, in a few words each (summary.json's flags say why)."""
    flags = []
    complete = row.get("complete")
    if complete is not None and not (isinstance(complete, float) and math.isnan(complete)) and not bool(complete):
        flags.append("server stopped answering")
    if _count(row.get("n_timed_out")):
        flags.append(f"{_count(row.get('n_timed_out'))} timed out")
    if bool(row.get("client_bound")):
        flags.append(f"client-bound ({fmt_num(_num(row.get('client_cpu_pct')))} % of a core)")
    if _count(row.get("stall_count")):
        flags.append(f"{_count(row.get('stall_count'))} server-wide stall(s)")
    return flags


def level_line(row: Mapping[str, Any], tag: str = "") -> str:
    """One finished level (a levels.csv row) in a line: load, requests ok and failed, output
    tok/s, TTFT and TPOT p50/p99, and its flags."""
    ms = {k: fmt_num(_num(row.get(k))) for k in ("ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99")}
    flags = level_flags(row)
    return (f"  level {row.get('level')}{f' [{tag}]' if tag else ''} ({load_words(row)}): "
            f"{_count(row.get('n_completed'))} ok, {_count(row.get('n_failed'))} failed; "
            f"{fmt_num(_num(row.get('output_throughput_tok_s')))} output tok/s; "
            f"TTFT p50 {ms['ttft_ms_median']} ms, p99 {ms['ttft_ms_p99']} ms; "
            f"TPOT p50 {ms['tpot_ms_median']} ms, p99 {ms['tpot_ms_p99']} ms"
            + (f"; flags: {', '.join(flags)}" if flags else ""))


def levels_table_lines(levels: pd.DataFrame, where: str = "01_macro_sweep/levels.csv") -> list[str]:
    """The end-of-run table: one row per level with throughput, TTFT and TPOT (ms); [] for no level."""
    if not len(levels):
        return []
    head = "  ".join(f"{h:>{w}}" if i > 1 else f"{h:<{w}}" for i, (_, h, w) in enumerate(TABLE_COLUMNS))
    lines = [f"{TABLE_TITLE:=^{len(head)}}", head]
    for _, r in levels.iterrows():
        cells = {"load": load_words(r), "ok": fmt_num(_count(r["n_completed"])),
                 "failed": fmt_num(_count(r["n_failed"])), "level": str(r["level"])}
        vals = [cells[k] if k in cells else fmt_num(_num(r.get(k))) for k, _, _ in TABLE_COLUMNS]
        lines.append("  ".join(f"{v:>{w}}" if i > 1 else f"{v:<{w}}"
                               for i, (v, (_, _, w)) in enumerate(zip(vals, TABLE_COLUMNS))))
    lines.append(f"{'':=^{len(head)}}")
    lines.append(f"  (latencies in ms; every column, percentile and level in {where})")
    return lines


def run_table_lines(stage_dir: Path) -> list[str]:
    """`levels_table_lines` of stage 01's levels.csv in `stage_dir`; [] when there is none or
    it cannot be read (stage 01's own check names a bad file)."""
    from stepscope import schema

    path = Path(stage_dir) / "levels.csv"
    if not path.is_file():
        return []
    try:
        levels = schema.check_frame(pd.read_csv(path), schema.LevelRow, str(path))
    except (schema.ArtifactError, ValueError, OSError):
        return []
    return levels_table_lines(levels)
