"""The regression gate behind `stepscope compare A B --fail-on-regression`.

A regression is a delta (B against A) outside its noise band, in the bad direction: output
throughput down, or TPOT, TTFT, the decode step, a category's time per step or a level's
share of time lost to server-wide stalls up (a stalled level's other readings are not
compared, so the stalls themselves are). Bands
come from `stepscope.campaign.analysis` (step-to-step spread where the artifacts carry one,
else the fixed relative band), so the gate and the campaign report judge alike.
"""

from __future__ import annotations

from pathlib import Path

from stepscope.campaign.analysis import Delta, deltas, pair
from stepscope.report.numbers import fmt_num as f

METRIC_WORDS = {"output_throughput_tok_s": "output throughput (tok/s)", "tpot_ms_median": "TPOT median (ms)",
                "ttft_ms_median": "TTFT median (ms)", "tpot_capture_ms": "batch-1 TPOT during capture (ms)",
                "decode_step_ms": "decode step time (ms)", "category_ms_per_step": "time per decode step (ms)",
                "stall_pct": "share of the level lost to server-wide stalls (%)"}


def regressions(run_a: str | Path, run_b: str | Path) -> list[Delta]:
    """Every quantity that got worse from A to B beyond its noise band."""
    return [d for d in deltas(pair(Path(run_a), Path(run_b))) if d.better is False]


def regression_message(d: Delta) -> str:
    what = METRIC_WORDS.get(d.metric, d.metric)
    where = f"{d.where} " if d.metric == "category_ms_per_step" else ""
    at = "" if d.metric == "category_ms_per_step" else f" at {d.where}"
    return (f"regression: {where}{what}{at}: A {f(d.baseline)} → B {f(d.value)} "
            f"(Δ {f(d.delta)}, outside the noise band ±{f(d.band)} from {d.band_source})")
