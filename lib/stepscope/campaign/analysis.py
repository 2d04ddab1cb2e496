"""The campaign's numbers: every variant against the baseline, and the baseline's models against
what each variant measured, as typed values the report renders (docs/campaigns.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from stepscope import schema
from stepscope.server_metrics import SpecDecodeStats, stats_from_json
from stepscope.config import WriteupParams
from stepscope.report import whatif as wi
from stepscope.report.analysis import capture_tpot_is_delivery
from stepscope.report.artifacts import RunArtifacts, load_run_artifacts, num
from stepscope.report.deltas import changed_findings, run_deltas, verdict_fields
from stepscope.report.noise import Delta, make_delta, repeat_band, step_spread_se  # noqa: F401  (the campaign's API)
from stepscope.report.noise import mean_of as _mean
from stepscope.report.build import ReportContext, report_context, writeup_params_from
from stepscope.schema.verdict import Verdict
from stepscope.trace import account
from stepscope.wording import capture_delivery

MACRO_COLUMNS = {"output_throughput_tok_s": "output tok/s", "tpot_ms_median": "TPOT median (ms)",
                 "ttft_ms_median": "TTFT median (ms)"}


# --------------------------------------------------------------------------- loading


@dataclass
class VariantRun:
    key: str
    variant: str
    repeat: int
    run_dir: Path
    status: str
    artifacts: RunArtifacts
    ctx: ReportContext
    spec_capture: SpecDecodeStats | None
    spec_sweep: SpecDecodeStats | None
    reused: dict[str, str]
    spec_capture_window: str | None = None
    """What `spec_capture`'s counters span (`SpecDecodeWindow.window`)."""


@dataclass
class Campaign:
    campaign_dir: Path
    record: schema.CampaignRecord
    baseline: str
    variants: list[str]
    descriptions: dict[str, str | None]
    runs: dict[str, list[VariantRun]]
    writeup: WriteupParams
    """The baseline's writeup params (what-if draft costs and verify tokens)."""

    def first(self, variant: str) -> VariantRun | None:
        return self.runs[variant][0] if self.runs.get(variant) else None


def _spec_window(run_dir: Path, stage: str) -> schema.SpecDecodeWindow | None:
    p = run_dir / "campaign_metrics" / f"{stage}.spec_decode.json"
    return schema.read(p, schema.SpecDecodeWindow) if p.is_file() else None


def _spec(window: schema.SpecDecodeWindow | None) -> SpecDecodeStats | None:
    if window is None or window.spec_decode is None:
        return None
    return stats_from_json(schema.to_builtins(window.spec_decode))


def load_run(run_dir: Path, variant: str, key: str, repeat: int = 1, status: str = "ok",
             reused: dict[str, str] | None = None) -> VariantRun:
    """One run folder, read through the report's artifact reader and derived once."""
    a = load_run_artifacts(run_dir)
    ctx = report_context(a, writeup_params_from(a))
    capture = _spec_window(run_dir, "04_profiler_capture")
    return VariantRun(key, variant, repeat, run_dir, status, a, ctx, _spec(capture),
                      _spec(_spec_window(run_dir, "01_macro_sweep")), reused or {},
                      capture.window if capture is not None else None)


def pair(run_a: Path, run_b: Path) -> Campaign:
    """Two run folders as a campaign of a baseline (A) and one variant (B): `compare`'s view."""
    a, b = load_run(Path(run_a), "A", "A#1"), load_run(Path(run_b), "B", "B#1")
    rec = schema.CampaignRecord(campaign_id=f"{Path(run_a).name} vs {Path(run_b).name}", baseline="A",
                                variants=["A", "B"])
    return Campaign(Path(run_b), rec, "A", ["A", "B"], {}, {"A": [a], "B": [b]}, writeup_params_from(a.artifacts))


def load_campaign(campaign_dir: str | Path) -> Campaign:
    """Read `campaign.json` and every run folder it lists (runs not yet started are left out)."""
    campaign_dir = Path(campaign_dir)
    rec = schema.read(campaign_dir / "campaign.json", schema.CampaignRecord)
    runs: dict[str, list[VariantRun]] = {v: [] for v in rec.variants}
    descriptions: dict[str, str | None] = {}
    for r in rec.runs:
        descriptions.setdefault(r.variant, r.description)
        d = campaign_dir / r.run_dir
        if r.status == "pending" or not d.is_dir():
            continue
        runs[r.variant].append(load_run(d, r.variant, r.key, r.repeat, r.status, r.reused))
    base = runs.get(rec.baseline) or []
    wp = writeup_params_from(base[0].artifacts) if base else WriteupParams()
    return Campaign(campaign_dir, rec, rec.baseline, list(rec.variants), descriptions, runs, wp)


# --------------------------------------------------------------------------- noise


# --------------------------------------------------------------------------- per variant


def levels_table(runs: list[VariantRun]) -> pd.DataFrame | None:
    """Per concurrency: the macro metrics averaged over the variant's repeats."""
    frames = [r.artifacts.levels for r in runs if r.artifacts.levels is not None]
    frames = [f[f["concurrency"].notna()] for f in frames if "concurrency" in f]
    if not frames:
        return None
    cols = [c for c in MACRO_COLUMNS if all(c in f for f in frames)]
    allf = pd.concat([f[["concurrency", *cols]] for f in frames], ignore_index=True)
    out = allf.groupby("concurrency", as_index=False)[cols].mean()
    out["n_runs"] = allf.groupby("concurrency")["concurrency"].count().to_numpy()
    for share, pct in (("bunched_chunk_share", "bunched_pct_max"), ("stall_share", "stall_pct_max")):
        if all(share in f for f in frames):
            worst = pd.concat([f[["concurrency", share]] for f in frames], ignore_index=True)
            out[pct] = 100 * worst.groupby("concurrency")[share].max().to_numpy()
    out["concurrency"] = out["concurrency"].astype(int)
    return out


def category_values(runs: list[VariantRun]) -> dict[str, list[tuple[float, float | None]]]:
    """Per category: (ms per step mean, its standard error) for each run."""
    out: dict[str, list[tuple[float, float | None]]] = {}
    for r in runs:
        dec = r.ctx.decode
        if dec is None:
            continue
        n = r.ctx.totals.get("n_decode_steps")
        for _, row in dec.iterrows():
            se = step_spread_se(num(row.get("ms_per_step_median")), num(row.get("ms_per_step_p90")),
                                int(n) if n else None)
            out.setdefault(str(row["category"]), []).append((float(row["ms_per_step_mean"]), se))
    return out


def capture_tpot(r: VariantRun) -> float | None:
    """The batch-1 TPOT the client measured during capture; None when it measures delivery."""
    cl = r.artifacts.capture_latency
    if capture_delivery_why(r) is not None:
        return None
    return num(r.ctx.totals.get("tpot_capture_ms")) or (cl.tpot_ms_mean if cl is not None else None)


def capture_delivery_why(r: VariantRun) -> str | None:
    """Why the run's capture TPOT measures delivery, not decode (`wording.capture_delivery`), or None."""
    if not capture_tpot_is_delivery(r.artifacts):
        return None
    return capture_delivery(r.artifacts.capture_latency)


def step_ms(r: VariantRun) -> float | None:
    return num(r.ctx.totals.get("step_ms"))


def category_table(c: Campaign) -> pd.DataFrame:
    """Decode ms per step by category (rows) and variant (columns), means over repeats; 0 where
    a variant ran none of a category."""
    data = {v: {cat: _mean([x for x, _ in vals]) for cat, vals in category_values(c.runs[v]).items()}
            for v in c.variants if c.runs.get(v)}
    df = pd.DataFrame(data).fillna(0.0)
    if len(df):
        df = df.loc[df.max(axis=1).sort_values(ascending=False).index]
    df.index.name = "category"
    return df


# --------------------------------------------------------------------------- deltas


CAMPAIGN_METRICS = frozenset({*MACRO_COLUMNS, "stall_pct", "tpot_capture_ms", "decode_step_ms",
                              "category_ms_per_step"})
"""The engine's quantities the campaign tabulates (`report.deltas.run_deltas` computes more)."""


def deltas(c: Campaign) -> list[Delta]:
    """Every compared quantity of every variant against the baseline, with its band: the one
    engine's (`report.deltas`), which `compare` and the gate render too."""
    base = [r.artifacts for r in c.runs.get(c.baseline) or []]
    out: list[Delta] = []
    for v in c.variants:
        runs = c.runs.get(v) or []
        if v == c.baseline or not runs or not base:
            continue
        out += [d for d in run_deltas(v, base, [r.artifacts for r in runs], base_name=c.baseline)
                if d.metric in CAMPAIGN_METRICS]
    return out


def deltas_frame(ds: list[Delta]) -> pd.DataFrame:
    return pd.DataFrame([{"variant": d.variant, "metric": d.metric, "where": d.where, "baseline": d.baseline,
                          "value": d.value, "delta": d.delta, "ratio": d.ratio, "band": d.band,
                          "band_source": d.band_source, "real": d.real, "better": d.better,
                          "judgement": d.judgement, "reason": d.reason, "unit": d.unit,
                          "not_comparable": d.not_comparable} for d in ds])


# --------------------------------------------------------------------------- verdicts


def verdict_changes(base: Verdict, other: Verdict) -> list[tuple[str, Any, Any]]:
    """The verdict fields that differ (`report.deltas.verdict_fields`): (field, baseline value, variant value)."""
    return changed_findings(verdict_fields(base), verdict_fields(other),
                            ("dominant", "communication", "bound", "biggest_lever"))


# --------------------------------------------------------------------------- predictions


@dataclass(frozen=True)
class AssumptionCheck:
    """One assumption of the what-if beside what the variant measured; `effect_ms_per_token` is how far
    the predicted TPOT moves when it (and those before it) take their measured values."""

    assumption: str
    assumed: float | None
    measured: float | None
    unit: str
    effect_ms_per_token: float | None = None
    band_ms: float | None = None
    """The measured TPOT's noise band, which the effect is judged against."""

    @property
    def contradicted(self) -> bool | None:
        """The measured value moves the prediction by more than the noise band (the prediction's own
        agreement test); None without an effect or a band."""
        if self.effect_ms_per_token is None or self.band_ms is None:
            return None
        return abs(self.effect_ms_per_token) > self.band_ms


BESIDE_STEPS = ("the draft and any other per-step overhead outside the decode steps cost the stated fraction "
                "of a step")
MEASURED_BY_CLIENT = "capture TPOT (client)"
MEASURED_BY_TRACE = "trace: decode step / tokens per step"


@dataclass(frozen=True)
class SpecPrediction:
    """The baseline's speculative-decoding what-if fed the variant's measured acceptance."""

    variant: str
    acceptance: float
    """Tokens per decode step the variant measured (/metrics, capture window)."""
    draft_tokens: int
    """k fed to the model: the variant's mean draft tokens per draft, rounded."""
    draft_cost_fraction: float
    baseline_step_ms: float
    baseline_step_basis: str
    predicted_tpot_ms: float
    predicted_verify_ms: float
    measured_tpot_ms: float | None
    band_ms: float | None
    band_source: str
    checks: tuple[AssumptionCheck, ...] = field(default_factory=tuple)
    model_assumptions: tuple[str, ...] = field(default_factory=tuple)
    """What the model fell back to (its own list)."""
    model: str = "report.whatif.predict_spec_decode_tpot"
    measured_as: str = MEASURED_BY_CLIENT
    """Which TPOT `measured_tpot_ms` is: the client's in the capture, or, where that measures
    delivery (`CaptureLatency.tpot_is_delivery`), the trace's decode step per token."""
    beside_steps_rel: float | None = None
    """What the measured TPOT leaves beside the trace's decode steps, as a share of them:
    a × measured TPOT / (the trace's mean decode step) − 1. Negative beyond
    `TPOT_GAP_SHARE`: the two readings of TPOT disagree. None without the trace's steps."""

    @property
    def ratio(self) -> float | None:
        """Measured / predicted TPOT."""
        return self.measured_tpot_ms / self.predicted_tpot_ms if self.measured_tpot_ms else None

    @property
    def agrees(self) -> bool | None:
        if self.measured_tpot_ms is None or self.band_ms is None:
            return None
        return abs(self.measured_tpot_ms - self.predicted_tpot_ms) <= self.band_ms

    @property
    def gap_ms(self) -> float | None:
        """Measured − predicted TPOT (ms per token)."""
        return self.measured_tpot_ms - self.predicted_tpot_ms if self.measured_tpot_ms is not None else None

    @property
    def offsetting(self) -> bool:
        """Agrees within noise only because assumptions beyond noise pull both ways."""
        effects = [k.effect_ms_per_token for k in self.checks if k.contradicted]
        return bool(self.agrees) and any(e > 0 for e in effects) and any(e < 0 for e in effects)


def _trace_spec(r: VariantRun) -> dict | None:
    s = r.artifacts.decode.spec_decode
    return schema.to_builtins(s) if s is not None else None


def baseline_model(r: VariantRun) -> wi.SpecBaseline | None:
    """The baseline run's what-if input, as its own report built it."""
    w = r.ctx.whatif
    return w.baseline if w is not None else wi.spec_baseline(r.artifacts, r.ctx.totals, r.ctx.decode)


def spec_predictions(c: Campaign) -> list[SpecPrediction]:
    base = c.runs.get(c.baseline) or []
    model = baseline_model(base[0]) if base else None
    if model is None:
        return []
    out = []
    for v in c.variants:
        runs = c.runs.get(v) or []
        stats = _speculating(runs)
        if v == c.baseline or not stats:
            continue
        acc = _mean([s.tokens_per_decode_step for s in stats])
        per_draft = _mean([s.draft_tokens / s.drafts for s in stats])
        if acc is None or not per_draft:
            continue
        k = max(int(round(per_draft)), 1)
        measured, d, measured_as = _measured_tpot(v, base, runs)
        for frac in c.writeup.draft_cost_fractions:
            p = wi.predict_spec_decode_tpot(model, min(acc, k + 1.0), frac * model.step_ms, draft_tokens=k)
            checks, beside_rel = _spec_checks(runs, model.step_ms, p, measured, d.band, stats)
            out.append(SpecPrediction(v, acc, k, frac, model.step_ms, model.step_basis, p.tpot_ms, p.verify_ms,
                                      measured, d.band, d.band_source, checks, p.assumptions,
                                      measured_as=measured_as, beside_steps_rel=beside_rel))
    return out


def _measured_tpot(v: str, base: list[VariantRun], runs: list[VariantRun]) -> tuple[float | None, Delta, str]:
    """The variant's TPOT against the baseline's with its band: the capture's, else (it measures
    delivery) the trace's decode step per token."""
    d = make_delta(v, "tpot_capture_ms", "capture", [capture_tpot(r) for r in base],
                   [capture_tpot(r) for r in runs], False)
    if d.value is not None or not all(capture_delivery_why(r) for r in runs):
        return d.value, d, MEASURED_BY_CLIENT
    d = _per_token_delta(v, base, runs)
    return d.value, d, MEASURED_BY_TRACE


def _per_token_delta(v: str, base: list[VariantRun], runs: list[VariantRun]) -> Delta:
    return make_delta(v, "trace_ms_per_token", "trace", [step_ms(r) for r in base],
                      [trace_ms_per_token(r, r.spec_capture) for r in runs], False)


def _speculating(runs: list[VariantRun]) -> list[SpecDecodeStats]:
    return [r.spec_capture for r in runs if r.spec_capture is not None and r.spec_capture.speculating]


def trace_per_token_delta(c: Campaign, v: str) -> tuple[Delta, float | None] | None:
    """A speculating variant's decode step per token against the baseline's step, with its band and the
    mean tokens per step; None when it does not speculate (step and token are then the same)."""
    runs = c.runs.get(v) or []
    stats = _speculating(runs)
    if not stats:
        return None
    return (_per_token_delta(v, c.runs.get(c.baseline) or [], runs),
            _mean([s.tokens_per_decode_step for s in stats]))


def _spec_checks(runs: list[VariantRun], base_ms: float, p: wi.Prediction, measured_tpot: float | None,
                 band_ms: float | None,
                 stats: list[SpecDecodeStats]) -> tuple[tuple[AssumptionCheck, ...], float | None]:
    """Each assumption of the what-if beside what the variant measured, with its effect on the
    predicted TPOT, and `SpecPrediction.beside_steps_rel`. The order splits the gap exactly
    (docs/campaigns.md); a value the data do not give keeps the model's and adds nothing."""
    tr = [t for t in (_trace_spec(r) for r in runs) if t]
    vms = _mean([num(t.get("verify_step_ms")) for t in tr])
    pms = _mean([num(t.get("plain_step_ms")) for t in tr])
    # the share that goes with V and P is the trace's own count; else the server's counters
    share, share_from = _mean([t["n_verify_steps"] / t["n_decode_steps"] for t in tr if t.get("n_decode_steps")]), "trace"
    if share is None:
        share, share_from = _mean([s.draft_step_share for s in stats]), "server counters"
    a, s_ = p.acceptance_length, (share if share is not None else 1.0)
    v_ms = vms if vms is not None else p.verify_ms
    p_ms = pms if pms is not None else base_ms

    checks: list[AssumptionCheck] = []

    def check(text: str, assumed: float, measured: float | None, unit: str, effect_ms: float | None) -> None:
        checks.append(AssumptionCheck(text, assumed, measured, unit,
                                      effect_ms / a if effect_ms is not None else None, band_ms))

    check("every decode step verifies a draft (the model charges the verify cost and the draft to every step)",
          1.0, share, f"share of decode steps ({share_from})",
          (1.0 - s_) * (base_ms - p.verify_ms) if share is not None else None)
    if vms is not None:
        check(f"a verify step (M = {p.verify_tokens} tokens) costs the baseline step with each part scaled by "
              "its law", p.verify_ms / base_ms, vms / base_ms, "x baseline step", s_ * (vms - p.verify_ms))
    if pms is not None and s_ < 1.0:
        check("a step that drafted nothing costs the baseline step", 1.0, pms / base_ms, "x baseline step",
              (1.0 - s_) * (pms - base_ms))
    if not measured_tpot:
        return tuple(checks), None
    steps_ms = s_ * v_ms + (1.0 - s_) * p_ms
    beside_steps_ms = measured_tpot * a - steps_ms
    check(BESIDE_STEPS, p.draft_ms / base_ms, beside_steps_ms / base_ms, "x baseline step",
          beside_steps_ms - p.draft_ms)
    return tuple(checks), (beside_steps_ms / steps_ms if vms is not None else None)


@dataclass(frozen=True)
class CeilingCheck:
    """A variant that removes categories: the baseline's Amdahl ceiling for them beside the measured speed-up."""

    variant: str
    removed: tuple[str, ...]
    ceiling_x: float
    measured_x: float
    band_x: float | None
    band_source: str
    moved_up: tuple[tuple[str, float, float], ...]
    """Other categories that grew beyond noise: (category, baseline ms, variant ms)."""
    moved_down: tuple[tuple[str, float, float], ...]
    base_step_ms: float = 0.0
    variant_step_ms: float = 0.0
    removed_exposed_ms: float = 0.0
    """The removed categories' exposed time per step in the baseline (what the ceiling removes)."""

    @property
    def unexplained_ms(self) -> float:
        """Step time saved beyond the removed categories and the other categories that shrank."""
        shrunk = sum(a - b for _, a, b in self.moved_down)
        return self.base_step_ms - self.variant_step_ms - self.removed_exposed_ms - shrunk

    @property
    def within(self) -> bool | None:
        if self.band_x is None:
            return None
        return self.measured_x <= self.ceiling_x + self.band_x

    @property
    def reaches(self) -> bool | None:
        if self.band_x is None:
            return None
        return abs(self.measured_x - self.ceiling_x) <= self.band_x


def ceiling_checks(c: Campaign, ds: list[Delta]) -> list[CeilingCheck]:
    base = c.runs.get(c.baseline) or []
    if not base:
        return []
    b0 = base[0]
    amdahl = b0.ctx.amdahl
    bstep = _mean([step_ms(r) for r in base])
    if amdahl is None or not bstep:
        return []
    exposed = dict(zip(amdahl["category"].astype(str), amdahl["exposed_ms"].astype(float)))
    bcats = {k: _mean([x for x, _ in v]) for k, v in category_values(base).items()}
    out = []
    for v in c.variants:
        runs = c.runs.get(v) or []
        if v == c.baseline or not runs:
            continue
        vcats = {k: _mean([x for x, _ in vals]) for k, vals in category_values(runs).items()}
        removed = tuple(sorted(k for k, ms in bcats.items() if ms and ms > 0 and not vcats.get(k)))
        if not removed:
            continue
        gone = sum(exposed.get(k, 0.0) for k in removed)
        if gone >= bstep:
            continue
        ceiling = account.ceiling_x(bstep, gone)
        d = make_delta(v, "decode_step_ms", "step", [step_ms(r) for r in base], [step_ms(r) for r in runs], False)
        if not d.value:
            continue
        measured = bstep / d.value
        # the band of the step time, carried into the speed-up (first order)
        band_x = measured * (d.band / d.value) if d.band is not None else None
        moved = [x for x in ds if x.variant == v and x.metric == "category_ms_per_step" and x.real
                 and x.where not in removed and x.baseline is not None and x.value is not None]
        out.append(CeilingCheck(v, removed, ceiling, measured, band_x, d.band_source,
                                tuple((x.where, x.baseline, x.value) for x in moved if x.delta > 0),
                                tuple((x.where, x.baseline, x.value) for x in moved if x.delta < 0),
                                bstep, d.value, gone))
    return out


def trace_ms_per_token(r: VariantRun, s: SpecDecodeStats | None) -> float | None:
    """TPOT from the trace under speculative decoding: the mean decode step over /metrics' tokens per step."""
    t = _trace_spec(r)
    step = num((t or {}).get("decode_step_ms"))
    tps = s.tokens_per_decode_step if s is not None else None
    return step / tps if step and tps else None


def spec_table(c: Campaign) -> pd.DataFrame | None:
    """Acceptance (from /metrics) and verify steps (from the trace), per variant that speculates."""
    rows = []
    for v in c.variants:
        for r in c.runs.get(v) or []:
            s, t = r.spec_capture, _trace_spec(r)
            if (s is None or not s.speculating) and not t:
                continue
            rows.append({"run": r.key, "window": r.spec_capture_window or "whole stage",
                         "drafts": s.drafts if s else None,
                         "draft_tokens": s.draft_tokens if s else None,
                         "accepted": s.accepted_tokens if s else None,
                         "acceptance_rate": s.acceptance_rate if s else None,
                         "per_position": ", ".join(f"{k}: {v:g}" for k, v in s.accepted_per_position.items()) if s else None,
                         "tokens_per_verify_step": s.tokens_per_verify_step if s else None,
                         "tokens_per_decode_step": s.tokens_per_decode_step if s else None,
                         "counter_decode_steps": s.decode_steps if s else None,
                         "trace_decode_steps": (t or {}).get("n_decode_steps"),
                         "trace_verify_steps": (t or {}).get("n_verify_steps"),
                         "trace_plain_steps": (t or {}).get("n_plain_steps"),
                         "trace_scored_tokens_per_step": (t or {}).get("scored_tokens_per_step"),
                         "verify_step_ms": (t or {}).get("verify_step_ms"),
                         "plain_step_ms": (t or {}).get("plain_step_ms"),
                         "trace_ms_per_token": trace_ms_per_token(r, s),
                         "capture_tpot_ms": capture_tpot(r)})
    return pd.DataFrame(rows) if rows else None
