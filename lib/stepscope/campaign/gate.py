"""The regression gate behind `stepscope compare A B --fail-on-regression`.

A regression is a delta (B against A) outside its noise band, in the bad direction: output
throughput down, or TPOT, TTFT, the decode step, a category's time per step or a level's
share of time lost to server-wide stalls up (a stalled level's other readings are not
compared, so the stalls themselves are). The deltas, their bands and the rules that stop a
reading from being judged come from the one engine, `stepscope.report.deltas`, which
`compare`'s tables and the campaign report render too: the three judge alike by construction.
"""

from __future__ import annotations

from pathlib import Path

from stepscope.report.artifacts import load_run_artifacts
from stepscope.report.deltas import run_deltas
from stepscope.report.noise import Delta
from stepscope.wording import fmt_num as f

METRIC_WORDS = {"output_throughput_tok_s": "output throughput (tok/s)", "tpot_ms_median": "TPOT median (ms)",
                "ttft_ms_median": "TTFT median (ms)", "tpot_capture_ms": "batch-1 TPOT during capture (ms)",
                "decode_step_ms": "decode step time (ms)", "category_ms_per_step": "time per decode step (ms)",
                "stall_pct": "share of the level lost to server-wide stalls (%)"}


def regressions(run_a: str | Path, run_b: str | Path) -> list[Delta]:
    """Every gated quantity (`METRIC_WORDS`) that got worse from A to B beyond its noise band."""
    ds = run_deltas("B", [load_run_artifacts(Path(run_a))], [load_run_artifacts(Path(run_b))], base_name="A")
    return [d for d in ds if d.metric in METRIC_WORDS and d.judgement == "worse"]


def regression_message(d: Delta) -> str:
    what = METRIC_WORDS.get(d.metric, d.metric)
    where = f"{d.where} " if d.metric == "category_ms_per_step" else ""
    at = "" if d.metric == "category_ms_per_step" else f" at {d.where}"
    return (f"regression: {where}{what}{at}: A {f(d.baseline)} → B {f(d.value)} "
            f"(Δ {f(d.delta)}, outside the noise band ±{f(d.band)} from {d.band_source})")
