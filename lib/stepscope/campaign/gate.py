"""The regression gate behind `stepscope compare A B --fail-on-regression`: a delta outside its noise
band in the bad direction, judged by `report.deltas` as compare and the campaign report are
(docs/campaigns.md#the-regression-gate).
"""

from __future__ import annotations

from pathlib import Path

from stepscope.report.artifacts import load_run_artifacts
from stepscope.report.deltas import run_deltas
from stepscope.report.noise import Delta
from stepscope.wording import fmt_num as f
from stepscope.wording import quantity_words

GATED = frozenset({"output_throughput_tok_s", "tpot_ms_median", "ttft_ms_median", "tpot_capture_ms", "decode_step_ms",
                   "category_ms_per_step", "stall_pct"})
"""The engine's quantities the gate fails on (`report.deltas.run_deltas` computes more)."""


def regressions(run_a: str | Path, run_b: str | Path) -> list[Delta]:
    """Every gated quantity (`GATED`) that got worse from A to B beyond its noise band."""
    ds = run_deltas("B", [load_run_artifacts(Path(run_a))], [load_run_artifacts(Path(run_b))], base_name="A")
    return [d for d in ds if d.metric in GATED and d.judgement == "worse"]


def regression_message(d: Delta) -> str:
    what = quantity_words(d.metric)
    where = f"{d.where} " if d.metric == "category_ms_per_step" else ""
    at = "" if d.metric == "category_ms_per_step" else f" at {d.where}"
    return (f"regression: {where}{what}{at}: A {f(d.baseline)} → B {f(d.value)} "
            f"(Δ {f(d.delta)}, outside the noise band ±{f(d.band)} from {d.band_source})")
