"""The verdict's findings, and `06_writeup/verdict.json`: the serialized verdict itself, which the
CLI, `compare` and campaigns read. Times are ms, ceilings × (Amdahl), shares %.
"""

from __future__ import annotations

from stepscope.schema._base import Record, Setting
from stepscope.schema.load import ExpertGrowth
from stepscope.thresholds import (BETWEEN_STEPS_SHARE, COMM_EXPOSED_SHARE, COMM_HIDDEN_SHARE, DEVICE_BOUND_IDLE_SHARE,
                                  HOST_AHEAD_LAUNCH_DELAY_US, HOST_BOUND_MICRO_IDLE_SHARE, HOST_GAP_IDLE_SHARE,
                                  LAUNCH_BOUND_IDLE_SHARE, LOW_CONFIDENCE_STEPS, MACRO_GAP_US, OVERLAP_RATIO,
                                  PREDICTION_TOLERANCE, STALL_GAP_SHARE, TPOT_GAP_SHARE)


class TraceIdentity(Record, frozen=True):
    """What the trace is: kind, engine, device, batch, TP, and how many steps were judged."""

    kind: str
    step_label: str
    source: str
    """`trace_info` (stage 05 detected it), `step counts` (inferred from an older summary) or
    `none` (stage 05 analysed no rank: nothing is known of the trace)."""
    engine: str | None = None
    device_name: str | None = None
    device_count: int | None = None
    batch_size: float | None = None
    """Requests per step, the median over steps: a whole number unless two middle steps differ."""
    batch_source: str | None = None
    tp: int | None = None
    tp_source: str | None = None
    tp_disagreement: bool = False
    world_size: int | None = None
    ranks_present: int | None = None
    n_steps: int | None = None
    n_judged_steps: int | None = None
    low_confidence: bool = False
    min_steps: int = LOW_CONFIDENCE_STEPS
    graph_replay: bool | None = None
    weight_formats_named: tuple[dict[str, Setting], ...] = ()
    """`trace_info.weight_formats_named`: formats the GEMM kernels' names state, most time first."""
    evidence: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """`trace_info.kind_evidence`: (kind, what was found) pairs, the evidence the kind rests on."""
    model_passes: int | None = None
    """Non-LLM inference: the denoiser's forward passes in the trace."""
    mixed: dict[str, float | None] | None = None
    """`trace_info.mixed`: prefill requests and tokens beside decode requests, per mixed step."""
    host_only_of_gpu_job: tuple[str, ...] = ()
    """`trace_info.host_only_of_gpu_job`: the host ops (NCCL, CUDA runtime) that say a trace
    with no device activity recorded a job that ran on GPUs."""

    @property
    def analysed(self) -> bool:
        return self.source != "none"

    @property
    def has_decode(self) -> bool:
        return self.kind in ("decode", "mixed")

    @property
    def takes_decode_verdict(self) -> bool:
        """Only decode steps get the decode verdict's what-if (speculative decoding): a mixed
        step's GEMMs are a prefill's, and other kinds emit no token per step."""
        return self.kind == "decode"

    def evidence_for(self, kind: str) -> tuple[str, ...]:
        return dict(self.evidence).get(kind, ())

    @property
    def ranks_missing(self) -> bool:
        return bool(self.world_size and self.ranks_present is not None and self.ranks_present < self.world_size)


class SpecDecodeSeen(Record, frozen=True):
    """The run already decodes speculatively: some decode steps verify drafted tokens."""

    n_verify_steps: int
    n_decode_steps: int
    scored_tokens_per_verify_step: float | None
    verify_step_ms: float | None
    plain_step_ms: float | None
    accepted_tokens: int | None = None
    """Drafted tokens the server accepted over the profiled requests (its /metrics counters)."""
    draft_tokens: int | None = None
    acceptance_pct: float | None = None
    tokens_per_decode_step: float | None = None
    """Tokens emitted per decode step, every step counted (the server's counters)."""
    ms_per_token: float | None = None
    """The decode step (the verdict's basis) over `tokens_per_decode_step`: what a token costs."""


class StepBasis(Record, frozen=True):
    """The denominator of every share and Amdahl ceiling."""

    denominator: str | None
    """`period` (step start to next step start), `span`, `union` or `capture TPOT`."""
    step_ms: float | None
    reason: str | None = None
    """Why the period was not used, when it was not."""


class Dominant(Record, frozen=True):
    category: str
    ms_per_step: float
    share_pct: float | None
    step_ms: float | None
    denominator: str | None
    n_steps: int | None
    step_label: str


class Communication(Record, frozen=True):
    """Whether communication runs exposed or hidden under compute."""

    status: str
    """`none`, `exposed`, `partly hidden`, `hidden` or `unknown` (no exposed time)."""
    comm_ms: float | None = None
    exposed_ms: float | None = None
    exposed_pct: float | None = None
    exposed_threshold_pct: float = 100 * COMM_EXPOSED_SHARE
    hidden_threshold_pct: float = 100 * COMM_HIDDEN_SHARE


class CommSplit(Record, frozen=True):
    """Communication's cost split into transfer and ranks waiting for each other."""

    status: str
    """`split` (every rank matched), `ranks missing`, `not matched` (stage 05 gave no matching)."""
    transfer_ms: float | None = None
    wait_ms: float | None = None
    skew_p90_us: float | None = None
    """The p90 arrival skew of `skew_category`'s instances (one kind of collective: an all-reduce's
    and an all-gather's skews are not pooled); stage 05's pooled figure only for old runs."""
    skew_category: str | None = None
    """The collective whose ranks wait longest in all (stage 05's `by_category`), else None."""
    straggler_rank: int | None = None
    world_size: int | None = None
    ranks_present: int | None = None
    n_instances: int | None = None
    """Matched instances in the judged steps: the ones the per-step figures sum."""
    clock_flag: bool = False
    least_wait_rank: int | None = None
    least_wait_ms: float | None = None
    most_wait_rank: int | None = None
    most_wait_ms: float | None = None
    """The ranks that wait least and most per step (stage 05's `wait_ms_per_step_by_rank`): the
    mean over ranks describes no rank, and rank 0's exposed time is one rank's."""


class Boundness(Record, frozen=True):
    """Host-bound, device-bound, one stall, or between."""

    status: str
    """`device-bound`, `host gap` (host-bound: one gap per step, in a host frame, holds most of the
    idle of a mostly idle step), `host-bound` (short gaps), `stall`, `host-ahead gaps`, `mixed`,
    `undetermined`."""
    device_word: str
    """`device` or `CPU worker`."""
    step_ms: float
    busy_ms: float
    idle_pct: float
    busy_pct: float
    denominator: str | None
    micro_idle_pct: float | None = None
    macro_idle_pct: float | None = None
    between_steps_pct: float | None = None
    """Period minus span, as % of the period: time between steps, outside the step's device work."""
    largest_gap_ms: float | None = None
    """The longest gap in any judged step (one step's, not a per-step mean)."""
    macro_pct_of_idle: float | None = None
    """Mean macro idle per step as % of the mean idle per step: both per-step means, so a
    single long gap in one step of many does not pass for the steps' idle."""
    gap_before: str | None = None
    gap_after: str | None = None
    gap_host_call: str | None = None
    """What the host was doing during the largest gap (e.g. a blocking copy), when stage 05 found it."""
    launch_delay_median_us: float | None = None
    host_gap_ms: float | None = None
    """Each step's one long gap (its largest, a macro gap), mean per step (stage 05's `host_gap`)."""
    host_gap_pct_of_idle: float | None = None
    """Those gaps over the steps' idle (period minus busy), %."""
    host_frame: str | None = None
    """The host frame most of those gaps lie in: what the host ran while the device waited."""
    host_frame_steps: int | None = None
    """Steps whose gap lies in `host_frame`, of `n_steps`."""
    n_steps: int | None = None
    python_frames: int | None = None
    """Python frames the profiler recorded inside such a gap (median): Python-stack tracing ran
    during it, at its own cost per Python call, so the gap may be shorter untraced."""
    graph_replay: bool | None = None
    cpu: bool = False
    device_bound_pct: float = 100 * DEVICE_BOUND_IDLE_SHARE
    idle_heavy_pct: float = 100 * LAUNCH_BOUND_IDLE_SHARE
    micro_threshold_pct: float = 100 * HOST_BOUND_MICRO_IDLE_SHARE
    macro_gap_ms: float = MACRO_GAP_US / 1e3
    """A gap at least this long is macro idle (stage 05's split)."""
    stall_threshold_pct: float = 100 * STALL_GAP_SHARE
    host_gap_idle_pct: float = 100 * HOST_GAP_IDLE_SHARE
    host_ahead_us: float = HOST_AHEAD_LAUNCH_DELAY_US


class Plateau(Record, frozen=True):
    """Knee and plateau of the load sweep, or the plain fact that none was reached."""

    reached: bool
    knee_concurrency: int | None = None
    plateau_tok_s: float | None = None
    best_tok_s: float | None = None
    best_concurrency: int | None = None
    knee_gain_pct: float | None = None
    stall_pct: float | None = None
    """The largest share of a level's time lost to server-wide stalls, from the knee on (every
    level when no plateau was reached), when above STALLED_LEVEL_SHARE: the plateau is low by
    up to it, or the growth that says none was reached may be the stalls'."""
    stall_concurrency: int | None = None


class Lever(Record, frozen=True):
    category: str
    exposed_ms: float
    ceiling_x: float
    step_ms: float
    denominator: str | None
    transfer_ms: float | None = None
    """A collective matched across ranks: its transfer per step (last arrival to completion,
    stage 05's `collectives_matched.by_category`); the rest of its exposed time is waiting."""
    transfer_ceiling_x: float | None = None
    """Amdahl of a faster collective: the exposed time cut by at most `transfer_ms`. Ranks
    waiting for each other keep waiting however fast the transfer."""
    coherent: bool | None = None
    """Stage 05's mark (category_levers.csv): False for a grab-bag no one fix reaches; None
    where the run folder has no category_levers.csv (older stepscope)."""
    n_names: int | None = None
    top_kernels: tuple[str, ...] = ()
    """Its largest kernels (up to LEVER_TOP_KERNELS), largest first."""
    top_share_pct: float | None = None
    """The share of the category's summed time those kernels hold, %."""
    module: str | None = None
    """The module path holding most of its time, where the trace has module frames."""
    module_share_pct: float | None = None
    """That module's share of the category's summed time, %."""


class Agreement(Record, frozen=True):
    quantity: str
    trace_ms: float
    predicted_ms: float
    ratio: float
    agree: bool
    tolerance_pct: float = 100 * PREDICTION_TOLERANCE
    trace_implementation: str | None = None
    """What the trace ran: for communication the collectives in words with the largest name,
    for GEMM time the largest GEMM kernel's name."""
    micro_backend: str | None = None
    """Communication: what stage 03 timed (`gloo`, `nccl`)."""
    same_implementation: bool | None = None
    """False when the engine ran collectives stage 03 did not time; None when unknown."""


class Component(Record, frozen=True):
    """One part of a micro-predicted step beside the trace's: GEMM, collective transfer,
    collective wait, attention (with KV writes) or the rest."""

    name: str
    trace_ms: float
    predicted_ms: float
    off: bool
    """Beyond its band: the two differ by more than PREDICTION_TOLERANCE of the larger."""


class StepPrediction(Record, frozen=True):
    """The micro-predicted step against the trace's, whole and by component: GEMMs from stage 02, the
    collectives' transfer (no wait) from stage 03, the rest the trace's own."""

    trace_ms: float
    predicted_ms: float
    agree: bool
    components: tuple[Component, ...]
    offsetting: bool
    """The total agrees only because errors cancel: components are off both ways, and their
    gaps, taken at their sizes, add up to more than the total's band."""
    denominator: str | None = None
    tolerance_pct: float = 100 * PREDICTION_TOLERANCE


class RooflineFinding(Record, frozen=True):
    category: str
    time_ms_per_step: float | None
    achieved_gbps: float | None
    pct_peak_bw: float | None
    achieved_tflops: float | None
    pct_peak_flops: float | None
    device: str | None
    peak_known: bool
    micro_gbps: float | None = None
    """Stage 02's bandwidth at the same shapes, beside the trace's."""
    micro_vs_trace: float | None = None
    """Trace GB/s over stage 02's GB/s."""
    at_peak_ms: float | None = None
    """What the category's bytes and FLOPs need at the device's peaks, ms per step: its time x
    the larger of its two % of peak / 100 (the roofline). None when no peak is known."""
    at_peak_ceiling_x: float | None = None
    """Amdahl on the step basis of kernels at the roofline: the category's exposed time cut by
    at most (time - at_peak_ms). A tighter bound than removing the category, for the same fix."""
    step_ms: float | None = None
    denominator: str | None = None


class BetweenSteps(Record, frozen=True):
    """The period minus the span: host work between steps that no kernel fix reaches; ceiling period / span."""

    gap_ms: float
    period_ms: float
    span_ms: float
    gap_pct: float
    ceiling_x: float
    n_intervals: int | None = None
    threshold_pct: float = 100 * BETWEEN_STEPS_SHARE
    host_frame: str | None = None
    """The host frame holding most of the device's gaps between steps (stage 05's
    `between_steps`), e.g. a DataLoader's `__next__`: what the host ran then."""
    host_frame_intervals: int | None = None
    """Intervals whose gap lies in `host_frame`, of `n_intervals`."""


class GapLever(Record, frozen=True):
    """Idle inside the step as a lever (the short gaps between kernels, or the long ones), with its
    ceiling on the category levers' basis."""

    kind: str
    """`short gaps` or `long gaps`."""
    idle_ms: float
    step_ms: float
    denominator: str | None
    ceiling_x: float
    macro_gap_ms: float = MACRO_GAP_US / 1e3
    """Where short ends and long begins (stage 05's split)."""
    cpu: bool = False
    """A CPU trace: the gaps lie between ops, not kernels."""


class BiggestLever(Record, frozen=True):
    """The lever with the highest Amdahl ceiling of all: a category's exposed time, the time
    between steps, or a kind of gap inside the step. Only it is called the biggest."""

    name: str
    ceiling_x: float
    kind: str
    """`category`, `between steps` or the GapLever's kind."""


class TpotGap(Record, frozen=True):
    tpot_ms: float
    step_ms: float
    denominator: str
    gap_ms: float
    gap_pct: float
    threshold_pct: float = 100 * TPOT_GAP_SHARE


class Overlap(Record, frozen=True):
    kernel_sum_ms: float
    union_ms: float
    overstate_pct: float
    threshold_pct: float = 100 * (OVERLAP_RATIO - 1)


class Guard(Record, frozen=True):
    """One invariant a verdict rests on (`report.guards`): whether it holds, the numbers judged, and the
    claims withdrawn when it fails."""

    invariant: str
    """`share_at_most_step`, `busy_at_most_period`, `below_peak`, `clocks_agree`,
    `classes_add_up`, `communication_has_collectives`, `steady_state`, `lever_coherent`, `steps_match_architecture`,
    `kind_takes_verdict`, `device_work_recorded`, `steps_apart`."""
    holds: bool
    values: tuple[tuple[str, Setting], ...] = ()
    """(name, value) pairs the check read, units in the names."""
    withdrawn: tuple[str, ...] = ()
    """The verdict's claims withdrawn: field names (`levers`, `comm_split`, ...), or
    `lever:<category>`, `roofline:<category>`, `transfer` for one part of one."""
    subject: str | None = None
    """What the check was about when it is one of several (a category)."""

    def value(self, name: str) -> Setting:
        return dict(self.values).get(name)


class Caveat(Record, frozen=True):
    """One reason to read the verdict with care: what it is, what it rests on and which part of
    the run it concerns. `report.prose.caveat_text` words it; nothing here is English."""

    code: str
    """The verdict's own, in the order they matter: `not_analysed`, `host_only`, `not_decode`,
    `claims_withdrawn`, `ranks_missing`, `low_confidence`, `tpot_gap`, `offsetting_agreement`,
    `prediction_disagrees`, `overlap`, `plateau_stalls`, `spec_decode`; then the artifacts': what
    the client's latencies measure and the sweep's stalls (`tpot_is_delivery`, `sweep_delivery`,
    `sweep_stalls`), then flags and checks: `other_share`, `catch_all`, `unattributed_events`, `no_step_marker`,
    `fallback_steps`, `collectives_mismatch`, `collectives_unchecked`, `trace_flag`, `sweep_flag`,
    `client_bound`, `server_died`, `sweep_failures`, `capture_failures`, `capture_ranks_missing`,
    `capture_partial`, `stage_not_measured`, `stage_failed`, `unreadable_artifact`."""
    concerns: str
    """The part of the run it is about: `trace`, `sweep`, `micro`, `capture` or `run` (a stage, a file)."""
    finding: str | None = None
    """The verdict's field it rests on (`identity`, `guards`, `tpot_gap`, `step_prediction`,
    `agreements`, `overlap`, `plateau`, `spec_decode`); None when it rests on a flag or a check
    of the artifacts, which `values` then holds."""
    subject: str | None = None
    """Which one of that field or flag: a failed guard's invariant, an agreement's quantity, a
    stage-05 flag's code, a stage id."""
    values: tuple[tuple[str, Setting], ...] = ()
    """What the flag or check read, units in the names (a share, a rank, a flag's message)."""

    def value(self, name: str) -> Setting:
        return dict(self.values).get(name)


class KindCategory(Record, frozen=True):
    """One category of a kind's steps: its busy time per step and its share of the kind's span."""

    category: str
    ms_per_step: float
    pct_of_span: float | None


class KindApart(Record, frozen=True):
    """One step kind besides the judged one, read on its own steps (never pooled with them)."""

    kind: str
    n_steps: int
    span_ms: float
    """The kind's mean step span (first to last device work), the denominator of `top`'s shares."""
    top: tuple[KindCategory, ...]
    """Its largest categories first."""


class LevelAnatomy(Record, frozen=True):
    """One captured level's decode steps, as the plateau finding reads them."""

    concurrency: int
    period_ms: float | None
    category_ms: dict[str, float]
    """ms per decode step by category, mean over the level's decode steps."""
    server: dict[str, float | None] = {}
    """The sweep level's /metrics at this concurrency (`report.load.level_server_view`)."""


class LoadGrowth(Record, frozen=True):
    """What the step does between the levels either side of the knee (or the lowest and highest
    captured): the category that grows, its ms there, the server's state, the levers' ceilings."""

    category: str | None
    slope_ms_per_request: float | None
    slope_se_ms: float | None
    below: LevelAnatomy
    above: LevelAnatomy
    knee_concurrency: int | None
    shifted_levers: tuple[tuple[str, float, float], ...] = ()
    """(category, share of the period below, above) for shares that moved by LOAD_LEVER_SHIFT or more."""
    experts: ExpertGrowth | None = None
    """The routed experts beside D(M) (load_anatomy.json), for an MoE."""


class Verdict(Record, frozen=True):
    """Every finding of one run's verdict: what the data says, before any sentence is written."""

    identity: TraceIdentity
    basis: StepBasis
    spec_decode: SpecDecodeSeen | None = None
    dominant: Dominant | None = None
    communication: Communication | None = None
    comm_split: CommSplit | None = None
    boundness: Boundness | None = None
    overlap: Overlap | None = None
    tpot_gap: TpotGap | None = None
    levers: tuple[Lever, ...] = ()
    between_steps: BetweenSteps | None = None
    gap_levers: tuple[GapLever, ...] = ()
    biggest: BiggestLever | None = None
    agreements: tuple[Agreement, ...] = ()
    roofline: tuple[RooflineFinding, ...] = ()
    roofline_reason: str | None = None
    """Why stage 05 computed no roofline row (no architecture, a CPU trace), when it says."""
    step_prediction: StepPrediction | None = None
    plateau: Plateau | None = None
    load_growth: LoadGrowth | None = None
    """The step under load either side of the knee (`report.load`), when stage 04 captured load levels."""
    guards: tuple[Guard, ...] = ()
    """Every invariant checked, holding or not; the failing ones' claims are already withdrawn."""
    kinds_apart: tuple[KindApart, ...] = ()
    """Every step kind but the judged one, read on its own steps (`report.kinds`): a prefill
    step's all-reduce is said of the prefill step, never pooled into the decode figures."""
    caveats: tuple[Caveat, ...] = ()
    """Every reason to read the verdict with care, the one that changes a decision most first
    (`report.verdict.caveats`): the headline says the first of the verdict's own."""

    @property
    def failed_guards(self) -> tuple[Guard, ...]:
        return tuple(g for g in self.guards if not g.holds)



class VerdictSentence(Record, kw_only=True):
    finding: str
    """The finding a sentence was written from: `dominant`, `lever`, `between_steps`,
    `gap_lever`, `caveat:<code>`, or another finding's name (`boundness`, `communication`, ...)."""
    text: str
    """The sentence as the report prints it (markdown: `**` marks emphasis)."""


class VerdictFile(Verdict, frozen=True, kw_only=True):
    """`06_writeup/verdict.json`: the run's Verdict as computed, and every sentence written from it."""

    headline: tuple[VerdictSentence, ...] = ()
    """The report's "In short": at most three sentences (dominant cost, biggest lever with
    its ceiling, the caveat that matters most), each with the finding it came from."""
    sentences: tuple[VerdictSentence, ...] = ()
    """The report's verdict section, in order."""
