"""The one comparison engine: a baseline's run folder against a variant's, as typed deltas that
`compare`, its regression gate and the campaign report render without judging again; the rules
that set a reading aside live here once (docs/campaigns.md#noise-bands).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, Sequence

import pandas as pd

from stepscope import schema
from stepscope.report import analysis as an
from stepscope.report.artifacts import RunArtifacts, num
from stepscope.report.noise import Delta, make_delta, mean_of, step_spread_se
from stepscope.thresholds import BUNCHED_FLAG_SHARE, STALLED_LEVEL_SHARE
from stepscope.wording import capture_not_compared_words, not_compared_words, slo_differs_words

REASONS = ("stalled", "bunched", "capture_delivery", "other_slo")
"""The reason codes a `Delta.reason` takes (why its two readings are not judged)."""

MACRO_METRICS = ("output_throughput_tok_s", "goodput_tok_s", "total_throughput_tok_s", "request_throughput_rps",
                 "goodput_rps", "ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99", "itl_ms_median",
                 "e2el_ms_median")
"""The sweep's per-level readings compared (levels.csv columns)."""

HIGHER_IS_BETTER = frozenset({"output_throughput_tok_s", "goodput_tok_s", "total_throughput_tok_s",
                              "request_throughput_rps", "goodput_rps"})

DELIVERY_METRICS = frozenset({"ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99", "itl_ms_median"})
"""Per-token latencies that measure delivery, not decode, at a level whose chunks arrived bunched."""

DECODE_TOTALS = ("kernel_sum_ms", "union_ms", "span_ms")
"""Stage 05's per-decode-step totals compared beside the step (`decode_step_ms`)."""

UNITS = {"output_throughput_tok_s": "tok/s", "goodput_tok_s": "tok/s", "total_throughput_tok_s": "tok/s",
         "request_throughput_rps": "req/s", "goodput_rps": "req/s", "stall_pct": "% of the level",
         "category_ms_per_step": "ms per decode step", "decode_step_ms": "ms", "tpot_capture_ms": "ms per token"}


def unit_of(metric: str) -> str:
    return UNITS.get(metric) or ("ms" if metric.endswith("_ms") or "_ms_" in metric else "")


def level_label(row: pd.Series) -> str:
    """A sweep level's name: `c=4`, `rate=2.0 req/s`, or a ramp's own level name."""
    rate = row.get("request_rate")
    if str(row.get("mode")) == "ramp":  # neither one concurrency nor one rate: its level name says it
        return str(row.get("level"))
    if str(row.get("mode", "concurrency")).startswith("conc") or pd.isna(rate) or math.isinf(float(rate)):
        return f"c={row.get('concurrency')}".replace(".0", "")
    return f"rate={rate} req/s"


def _levels_by_label(runs: Sequence[RunArtifacts]) -> list[dict[str, pd.Series]]:
    out = []
    for a in runs:
        lv = a.levels
        out.append({} if lv is None else {level_label(r): r for _, r in lv.iterrows()})
    return out


def _values(levels: list[dict[str, pd.Series]], label: str, col: str) -> list[float]:
    """The finite values of `col` at `label`, one per run that has it."""
    vals = [num(lv[label].get(col)) for lv in levels if label in lv]
    return [float(v) for v in vals if v is not None and math.isfinite(float(v))]


def beyond(sides: Sequence[tuple[str, list[float]]], limit: float) -> list[tuple[str, float]]:
    """(side, its worst share) for each side whose worst share exceeds `limit`."""
    return [(name, max(xs)) for name, xs in sides if xs and max(xs) > limit]


def stalled_reason(sides: Sequence[tuple[str, list[float]]], where: str) -> str | None:
    """Words for a level some side lost more than STALLED_LEVEL_SHARE of to stalls, else None."""
    runs = beyond(sides, STALLED_LEVEL_SHARE)
    return not_compared_words("stalled", runs, where) if runs else None


def bunched_reason(sides: Sequence[tuple[str, list[float]]], where: str) -> str | None:
    """Words for a level some side's chunks arrived bunched at beyond BUNCHED_FLAG_SHARE, else None."""
    runs = beyond(sides, BUNCHED_FLAG_SHARE)
    return not_compared_words("bunched", runs, where) if runs else None


def _slo(a: RunArtifacts):
    s = a.sweep_summary
    return s.slo.bounds_ms if s is not None and s.slo else None


def _level_deltas(v: str, base_name: str, base: Sequence[RunArtifacts], var: Sequence[RunArtifacts]) -> list[Delta]:
    bl, vl = _levels_by_label(base), _levels_by_label(var)
    labels = list(dict.fromkeys([k for lv in bl + vl for k in lv]))
    slos = {repr(sorted(b.items())) if isinstance(b, dict) else repr(b)  # bounds are dicts: unhashable
            for b in (_slo(a) for a in [*base, *var])}
    other_slo = slo_differs_words(_slo(base[0]), _slo(var[0])) if len(slos) > 1 else None
    out: list[Delta] = []
    for label in labels:
        stall = [(base_name, _values(bl, label, "stall_share")), (v, _values(vl, label, "stall_share"))]
        bunch = [(base_name, _values(bl, label, "bunched_chunk_share")), (v, _values(vl, label, "bunched_chunk_share"))]
        stalled, bunched = stalled_reason(stall, label), bunched_reason(bunch, label)
        for m in MACRO_METRICS:
            b, w = _values(bl, label, m), _values(vl, label, m)
            if not b and not w and (m.startswith("goodput") or not any(m in lv[label] for lv in bl + vl if label in lv)):
                continue  # goodput: neither run set an SLO; else neither run has the column
            d = make_delta(v, m, label, b, w, m in HIGHER_IS_BETTER)
            why, code = ((stalled, "stalled") if stalled else (bunched, "bunched") if bunched and m in DELIVERY_METRICS
                         else (other_slo, "other_slo") if other_slo and m.startswith("goodput") else (None, None))
            out.append(replace(d, not_comparable=why, reason=code, unit=unit_of(m)))
        if stall[0][1] and stall[1][1]:  # both runs carry the stall column (older folders do not)
            out.append(Delta(v, "stall_pct", label, 100 * mean_of(stall[0][1]), 100 * mean_of(stall[1][1]),
                             100 * STALLED_LEVEL_SHARE, f"fixed {100 * STALLED_LEVEL_SHARE:g} points (STALLED_LEVEL_SHARE)",
                             False, unit=unit_of("stall_pct")))
    return out


def capture_tpot_ms(a: RunArtifacts, totals: dict) -> float | None:
    """The batch-1 TPOT the client measured during the capture (stage 05's, else the capture's mean)."""
    cl = a.capture_latency
    return num(totals.get("tpot_capture_ms")) or (cl.tpot_ms_mean if cl is not None else None)


def _category_values(a: RunArtifacts, totals: dict) -> dict[str, tuple[float, float | None]]:
    """Per category: (ms per decode step, mean; its standard error from the step spread)."""
    dec = an.decode_category_table(a, totals)
    if dec is None:
        return {}
    n = totals.get("n_decode_steps")
    return {str(r["category"]): (float(r["ms_per_step_mean"]),
                                 step_spread_se(num(r.get("ms_per_step_median")), num(r.get("ms_per_step_p90")),
                                                int(n) if n else None))
            for _, r in dec.iterrows()}


def _step_deltas(v: str, base_name: str, base: Sequence[RunArtifacts], var: Sequence[RunArtifacts]) -> list[Delta]:
    tb, tv = [an.decode_step_totals(a) for a in base], [an.decode_step_totals(a) for a in var]
    d = make_delta(v, "tpot_capture_ms", "capture (batch 1)", [capture_tpot_ms(a, t) for a, t in zip(base, tb)],
                   [capture_tpot_ms(a, t) for a, t in zip(var, tv)], False)
    why = next((capture_not_compared_words(name, a.capture_latency) for name, runs in ((base_name, base), (v, var))
                for a in runs if an.capture_tpot_is_delivery(a)), None)
    out = [replace(d, not_comparable=why, reason="capture_delivery" if why else None, unit=unit_of(d.metric))]
    out.append(replace(make_delta(v, "decode_step_ms", "step", [num(t.get("step_ms")) for t in tb],
                                  [num(t.get("step_ms")) for t in tv], False), unit="ms"))
    out += [replace(make_delta(v, k, "step", [num(t.get(k)) for t in tb], [num(t.get(k)) for t in tv], False),
                    unit="ms") for k in DECODE_TOTALS]
    cb, cv = [_category_values(a, t) for a, t in zip(base, tb)], [_category_values(a, t) for a, t in zip(var, tv)]
    one_each = len(base) == 1 and len(var) == 1
    for cat in sorted({k for c in cb + cv for k in c}):
        # A category one run lacks is 0 ms there, known exactly.
        b, w = [c.get(cat, (0.0, 0.0)) for c in cb if c], [c.get(cat, (0.0, 0.0)) for c in cv if c]
        se = (b[0][1], w[0][1]) if one_each and b and w else (None, None)
        out.append(replace(make_delta(v, "category_ms_per_step", cat, [x for x, _ in b], [x for x, _ in w], False, se),
                           unit=unit_of("category_ms_per_step")))
    return out


def run_deltas(variant: str, base: Sequence[RunArtifacts], var: Sequence[RunArtifacts],
               base_name: str = "A") -> list[Delta]:
    """Every compared quantity of the variant's runs against the baseline's (repeats average;
    one run per side uses the step spread), each with its band, judgement and reason."""
    if not base or not var:
        return []
    return _level_deltas(variant, base_name, base, var) + _step_deltas(variant, base_name, base, var)


def _engine(a: RunArtifacts) -> str | None:
    return None if a.server is None else f"{a.server.engine} {a.server.engine_version or '(version unknown)'}"


def same_setup(a: RunArtifacts, b: RunArtifacts) -> str | None:
    """The engine both runs used when they ran identical params on it (an A/A pair), else None."""
    engine = _engine(a)
    setup_a, setup_b = ({k: v for k, v in (x.params or {}).items() if k != "run"} for x in (a, b))
    if not setup_a or setup_a != setup_b or engine is None or engine != _engine(b):
        return None
    return engine


VERDICT_FIELDS = ("dominant", "dominant_share_pct", "biggest_lever", "biggest_lever_x", "caveat")
"""The findings of `06_writeup/verdict.json` a comparison sets side by side."""


def verdict_fields(v: schema.Verdict | None) -> dict[str, object]:
    """The compared findings of one run's verdict (every value None without one): its dominant
    cost, communication, boundness, biggest lever and the caveat its headline says."""
    if v is None:
        return dict.fromkeys(VERDICT_FIELDS + ("communication", "bound"))
    from stepscope.report.verdict import headline_findings

    d, lever, caveat = v.dominant, v.biggest, headline_findings(v).caveat
    return {"dominant": d.category if d else None, "dominant_share_pct": d.share_pct if d else None,
            "communication": v.communication.status if v.communication else None,
            "bound": v.boundness.status if v.boundness else None,
            "biggest_lever": lever.name if lever else None, "biggest_lever_x": lever.ceiling_x if lever else None,
            "caveat": caveat.code if caveat else None}


def verdict_changes(a: schema.VerdictFile | None, b: schema.VerdictFile | None) -> list[tuple[str, object, object]]:
    """The named findings that differ between two verdicts: (field, A, B). Shares and ceilings
    are numbers with no band here, so only the named findings count as a change."""
    return changed_findings(verdict_fields(a), verdict_fields(b), ("dominant", "biggest_lever", "caveat"))


def changed_findings(fa: Mapping[str, object], fb: Mapping[str, object],
                     names: Sequence[str]) -> list[tuple[str, object, object]]:
    """(name, A, B) for each named finding that differs: the one rule of a changed verdict,
    for compare's verdict.json fields and the campaign's digests alike."""
    return [(k, fa.get(k), fb.get(k)) for k in names if fa.get(k) != fb.get(k)]
