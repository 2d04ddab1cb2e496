"""What speculative decoding would do to a measured decode step: a model with explicit inputs.

Each part of the step grows with the tokens a verify step scores by its own law (`LAWS`), and
TPOT = (verify + k × draft per token) / a (docs/verdict.md#the-speculative-decoding-what-if).
`predict_spec_decode_tpot` is pure and lists every default it fell back to in
`Prediction.assumptions`; `spec_baseline` builds its input from a run folder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from stepscope.errors import StepscopeError
from stepscope.palette import GEMM_CATEGORIES
from stepscope.report.artifacts import RunArtifacts, num
from stepscope.wording import fmt_num

TOKEN_CATEGORIES = frozenset({"attention", "kv_cache_write", "logits", "sampling", "all_gather"})
"""Work proportional to the tokens scored: each verified token reads and writes its own. (The
LM head is a GEMM, `lm_head` in GEMM_CATEGORIES: it follows stage 02's curve.)"""
SIZE_CATEGORIES = frozenset({"all_reduce", "other_collective", "communication"})
"""Collectives whose message is [tokens, hidden]: their time follows the latency-vs-size curve."""

EXPERT_CATEGORIES = frozenset({"fused_moe"})
"""The routed experts: their time follows the distinct experts touched, D(M)."""

LAWS = {"gemm": "stage 02's GEMM time at the verify tokens / at the measured tokens",
        "experts": "distinct experts touched, D(verify tokens) / D(measured tokens), D(M) = E·(1 − (1 − k/E)^M)",
        "tokens": "tokens scored (× M)",
        "message size": "stage 03's all-reduce time at the M-times larger message / at the measured one",
        "unchanged": "unchanged (per-step work that does not grow with tokens)"}


@dataclass(frozen=True)
class Part:
    """One part of the measured step: a category's exposed time, or the idle remainder."""

    name: str
    ms: float
    law: str
    """A key of `LAWS`."""


@dataclass(frozen=True)
class SpecBaseline:
    """The measured decode step and the curves that say how its parts grow with tokens."""

    step_ms: float
    step_basis: str
    """`period`, `capture TPOT` or `span`: what `step_ms` is."""
    parts: tuple[Part, ...]
    """Sums to `step_ms` (the last part is the idle / unattributed remainder)."""
    batch: float | None = None
    """Requests per decode step, measured; None falls back to 1 (listed as an assumption)."""
    gemm_us_by_tokens: dict[int, float] | None = None
    """Stage 02: GEMM µs per decode step at M tokens."""
    allreduce_us_by_bytes: dict[int, float] | None = None
    """Stage 03: one all-reduce's µs at a message size in bytes."""
    allreduce_bytes_per_token: float | None = None
    """Message bytes of one all-reduce per token scored (hidden x dtype size)."""
    concurrency: int | None = None
    """The load level whose trace gave the step (stage 04's c<C> capture); None for the batch-1
    capture. Its `batch` is then the decode requests per step that trace measured."""
    experts: tuple[int, int] | None = None
    """(routed experts E, top-k) of an MoE, for the routed experts' law; None for a dense model or
    when the architecture is unknown (the experts then follow stage 02's GEMM curve)."""


@dataclass(frozen=True)
class ScaledPart:
    name: str
    base_ms: float
    scale: float
    ms: float
    law: str
    source: str
    """`measured` (a stage's curve) or `default: ...` (what was assumed instead)."""


@dataclass(frozen=True)
class Prediction:
    acceptance_length: float
    draft_tokens: int
    verify_tokens: int
    """M: tokens scored per request in a verify step (k + 1)."""
    batch: float
    baseline_ms: float
    verify_ms: float
    draft_ms: float
    tpot_ms: float
    tok_s_per_stream: float
    speedup: float
    parts: tuple[ScaledPart, ...]
    assumptions: tuple[str, ...] = field(default=())

    @property
    def draft_per_token_ms(self) -> float:
        """What one drafted token costs, ms."""
        return self.draft_ms / self.draft_tokens


def _interp(curve: dict[int, float], x: float, log_x: bool = False) -> tuple[float, bool]:
    """The curve at x (linear between points, in log x for sizes), and whether x was outside."""
    xs = sorted(curve)
    ys = [curve[k] for k in xs]
    fx = (lambda v: math.log(v)) if log_x else (lambda v: float(v))
    X = [fx(v) for v in xs]
    t = fx(x)
    if len(xs) == 1:
        return ys[0], x != xs[0]
    if t <= X[-1] and t >= X[0]:
        return float(np.interp(t, X, ys)), False
    # Beyond the grid: extend the nearest slope; clamping would make a larger M cost nothing more.
    i = (0, 1) if t < X[0] else (-2, -1)
    slope = (ys[i[1]] - ys[i[0]]) / (X[i[1]] - X[i[0]])
    return float(max(ys[i[0]] + slope * (t - X[i[0]]), 0.0)), True


def _scale(part: Part, base: SpecBaseline, batch: float, m: int) -> tuple[float, str]:
    tokens0, tokens1 = batch, batch * m
    if part.law == "tokens":
        return float(m), "law (no measurement needed)"
    if part.law == "experts" and base.experts is not None:
        from stepscope.model.shapes import distinct_experts

        e, k = base.experts
        d0, d1 = float(distinct_experts(e, k, tokens0)), float(distinct_experts(e, k, tokens1))
        return (d1 / d0 if d0 > 0 else 1.0), f"law: D(M) with E = {e}, top-{k}: {fmt_num(d0)} → {fmt_num(d1)} experts per layer"
    if part.law in ("gemm", "experts"):
        c = base.gemm_us_by_tokens
        if not c:
            return 1.0, "default: ×1, no GEMM prediction from stage 02 (decode GEMMs read weights, so a few more rows cost little)"
        y0, out0 = _interp(c, tokens0)
        y1, out1 = _interp(c, tokens1)
        src = "measured" + (" (extrapolated beyond stage 02's M grid)" if out0 or out1 else "")
        return _at_least_one(y1 / y0 if y0 > 0 else 1.0, src)
    if part.law == "message size":
        c, per_tok = base.allreduce_us_by_bytes, base.allreduce_bytes_per_token
        if not c or not per_tok:
            return 1.0, "default: ×1, no latency-vs-size curve from stage 03 (small messages are latency-bound)"
        y0, out0 = _interp(c, tokens0 * per_tok, log_x=True)
        y1, out1 = _interp(c, tokens1 * per_tok, log_x=True)
        src = "measured" + (" (extrapolated beyond stage 03's sizes)" if out0 or out1 else "")
        return _at_least_one(y1 / y0 if y0 > 0 else 1.0, src)
    return 1.0, "assumed: launch-bound or host work, unchanged"


def _at_least_one(ratio: float, src: str) -> tuple[float, str]:
    """More tokens or a larger message never cost less: a measured ratio below 1 (timing noise
    between nearly equal points, e.g. gloo at 256 B and 768 B) is read as ×1, and said."""
    if ratio >= 1.0:
        return ratio, src
    return 1.0, f"{src}; its ×{fmt_num(ratio)} below 1 is noise between near-equal points: ×1"


def predict_spec_decode_tpot(baseline: SpecBaseline, acceptance_length: float, draft_ms_per_token: float,
                             draft_tokens: int | None = None) -> Prediction:
    """Projected TPOT with speculative decoding from a measured decode step: `acceptance_length` a
    (1 ≤ a ≤ k + 1), the draft's ms per drafted token, `draft_tokens` k (default ceil(a)).
    StepscopeError when the inputs cannot describe a verify step."""
    a = float(acceptance_length)
    k = int(draft_tokens) if draft_tokens is not None else max(int(math.ceil(a)), 1)
    if k < 1 or not 1.0 <= a <= k + 1:
        raise StepscopeError(f"acceptance length {a:g} is impossible with {k} drafted tokens",
                             where="predict_spec_decode_tpot",
                             hint="a verify step emits between 1 and k + 1 tokens; raise draft_tokens")
    if draft_ms_per_token < 0 or baseline.step_ms <= 0:
        raise StepscopeError("draft cost and step time must be positive", where="predict_spec_decode_tpot",
                             hint=f"got draft {draft_ms_per_token} ms/token, step {baseline.step_ms} ms")
    m = k + 1
    assumptions = []
    batch = baseline.batch
    if batch is None:
        batch = 1
        assumptions.append("batch: default 1 request per step (the trace gave no batch)")
    elif baseline.concurrency is not None:
        assumptions.append(f"batch: {fmt_num(batch)} decode requests per step, as measured in the "
                           f"c={baseline.concurrency} load trace")
    assumptions.append(f"k = {k} drafted tokens per step" + ("" if draft_tokens is not None else
                                                              " (default: ceil(acceptance))"))
    parts = []
    for p in baseline.parts:
        s, src = _scale(p, baseline, batch, m)
        law = p.law if p.law != "experts" or baseline.experts is not None else "gemm"
        parts.append(ScaledPart(name=p.name, base_ms=p.ms, scale=s, ms=p.ms * s, law=LAWS[law], source=src))
        if src.startswith("default") and p.ms > 0 and p.law != "unchanged":
            assumptions.append(f"{p.name}: {src}")
    verify = sum(p.ms for p in parts)
    draft = k * draft_ms_per_token
    tpot = (verify + draft) / a
    return Prediction(acceptance_length=a, draft_tokens=k, verify_tokens=m, batch=batch,
                      baseline_ms=baseline.step_ms, verify_ms=verify, draft_ms=draft, tpot_ms=tpot,
                      tok_s_per_stream=1000.0 / tpot, speedup=baseline.step_ms / tpot,
                      parts=tuple(parts), assumptions=tuple(assumptions))


# --------------------------------------------------------------------------- from a run folder


def _law(category: str) -> str:
    if category in EXPERT_CATEGORIES:
        return "experts"
    if category in GEMM_CATEGORIES:
        return "gemm"
    if category in TOKEN_CATEGORIES:
        return "tokens"
    if category in SIZE_CATEGORIES:
        return "message size"
    return "unchanged"


def spec_baseline(a: RunArtifacts, totals: dict[str, Any], decode: pd.DataFrame | None,
                  batch: float | None = None) -> SpecBaseline | None:
    """A decode trace's step on stage 05's basis as a `SpecBaseline`: the categories' exposed times
    and the rest, which no law changes. None for other kinds, whose step the model does not describe."""
    info = a.trace_summary.trace_info if a.trace_summary is not None else None
    if info is not None and info.kind not in (None, "decode"):
        return None
    basis, step, _ = a.step_basis()
    if not step:  # a summary with no step times at all: the capture's TPOT is then the only step there is
        step, basis = totals.get("tpot_capture_ms"), "capture TPOT"
    if not step or decode is None or not len(decode):
        return None
    col = "exposed_ms_mean"
    parts = [Part(name=str(r["category"]), ms=float(r[col]), law=_law(str(r["category"])))
             for _, r in decode.iterrows() if num(r[col])]
    rest = step - sum(p.ms for p in parts)
    parts.append(Part(name="idle and between steps", ms=max(rest, 0.0), law="unchanged"))
    gemm_curve, ar_curve, per_tok = _micro_curves(a)
    return SpecBaseline(step_ms=float(step), step_basis=basis, parts=tuple(parts), batch=batch,
                        gemm_us_by_tokens=gemm_curve, allreduce_us_by_bytes=ar_curve,
                        allreduce_bytes_per_token=per_tok, experts=experts_of(a))


def experts_of(a: RunArtifacts) -> tuple[int, int] | None:
    """(routed experts, top-k) of the run's model: stage 05's load anatomy when it read them,
    else the params' architecture; None for a dense model or when neither can say."""
    e = a.load_summary.experts if a.load_summary is not None else None
    if e is not None:
        return e.n_routed_experts, e.top_k
    try:
        from stepscope.config import params_from_dict
        from stepscope.model import architecture_from_params

        arch = architecture_from_params(params_from_dict(a.params or {}, "params.yaml"))
    except (StepscopeError, OSError, ValueError):
        return None  # no model named, or its config is not here: the experts follow the GEMM curve
    return (arch.n_routed_experts, arch.top_k) if arch.is_moe else None


def _micro_curves(a: RunArtifacts) -> tuple[dict[int, float] | None, dict[int, float] | None, float | None]:
    """Stage 02's GEMM µs per step by M, stage 03's all-reduce µs by message bytes, and the
    all-reduce's bytes per token; each None where its stage left nothing."""
    gemm = a.gemm_prediction.gemm_us_per_decode_step if a.gemm_prediction is not None else {}
    gemm_curve = {int(float(k)): float(v) for k, v in gemm.items() if num(v)}
    ar_curve, per_tok = None, None
    c = a.collectives
    if c is not None:
        ar = c[(c["op"].astype(str) == "all_reduce") & c["time_us_rank_median"].notna()]
        if (ar["mode"] == "eager").any():
            ar = ar[ar["mode"] == "eager"]
        if len(ar):
            ar_curve = {int(s): float(g["time_us_rank_median"].median()) for s, g in ar.groupby("size_bytes")}
    if a.comm_prediction is not None and a.comm_prediction.size_bytes:
        # stage 03 sizes one all-reduce at batch 1: [1 token, hidden] x dtype bytes
        per_tok = float(a.comm_prediction.size_bytes)
    return gemm_curve or None, ar_curve, per_tok


def load_baselines(a: RunArtifacts) -> list[SpecBaseline]:
    """One baseline per captured load level above batch 1 (load_anatomy.csv), at the batch its trace
    measured: its decode steps' mean period, their categories' ms (unions, so overlap counts twice:
    an upper bound) and the rest."""
    table = a.load_anatomy
    if table is None or not len(table):
        return []
    dec = table[(table["step_kind"] == "decode") & (table["concurrency"] > 1)]
    gemm_curve, ar_curve, per_tok = _micro_curves(a)
    experts = experts_of(a)
    out = []
    for c, t in dec.groupby("concurrency", sort=True):
        groups = t.drop_duplicates("decode_requests")
        n = groups["n_steps"].astype(float)
        periods = groups["period_ms"].astype(float)
        if not n.sum() or periods.isna().all():
            continue
        ok = periods.notna()
        step = float((periods[ok] * n[ok]).sum() / n[ok].sum())
        batch = float((groups["decode_requests"].astype(float) * n).sum() / n.sum())
        weight = t["decode_requests"].map(dict(zip(groups["decode_requests"], n / n.sum())))
        by_cat = (t["ms_per_step"].astype(float) * weight).groupby(t["category"]).sum()
        parts = [Part(name=str(k), ms=float(v), law=_law(str(k))) for k, v in by_cat.items() if v > 0]
        parts.sort(key=lambda p: -p.ms)
        parts.append(Part(name="idle and between steps", ms=max(step - sum(p.ms for p in parts), 0.0), law="unchanged"))
        out.append(SpecBaseline(step_ms=step, step_basis="period", parts=tuple(parts), batch=batch,
                                gemm_us_by_tokens=gemm_curve, allreduce_us_by_bytes=ar_curve,
                                allreduce_bytes_per_token=per_tok, concurrency=int(c), experts=experts))
    return out


def whatif_table(baseline: SpecBaseline, acceptance_lengths: tuple[float, ...],
                 draft_cost_fractions: tuple[float, ...], verify_extra_tokens: int = 1) -> list[Prediction]:
    """Predictions over the params' grid: k = ceil(a) + verify_extra_tokens - 1 drafted tokens,
    the draft costing the stated fraction of the measured step per drafted token."""
    out = []
    for acc in acceptance_lengths:
        k = max(int(math.ceil(acc)) + int(verify_extra_tokens) - 1, 1)
        for frac in draft_cost_fractions:
            out.append(predict_spec_decode_tpot(baseline, acc, frac * baseline.step_ms, draft_tokens=k))
    return out
