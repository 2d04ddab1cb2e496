"""The step under load: the sweep's /metrics, the load captures, the step anatomy against batch size
and where each captured level's time went."""

from __future__ import annotations

from stepscope.schema._base import Record, Row
from stepscope.schema.capture import StartProfileBody


class ServerMetricsRow(Row, kw_only=True):
    """One scrape of the server's /metrics during a sweep level or a load capture."""

    level: str
    """The sweep level (`c0016`), or `capture-c0016` for stage 04's capture at concurrency 16."""
    phase: str
    """`warmup`, `measure` (the level's measured requests) or `capture` (the profiled window)."""
    t_s: float
    """Seconds since the level's first scrape."""
    scrape_ms: float
    """How long the scrape took, client-side (request to full body), ms: what a scrape costs."""
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    """0-1 (vLLM's `kv_cache_usage_perc` is a fraction despite its name)."""
    preemptions_total: float | None = None
    """Cumulative over the server's life; difference two rows for a window."""
    prefix_cache_hits_total: float | None = None
    """Cumulative, tokens."""
    prefix_cache_queries_total: float | None = None
    """Cumulative, tokens."""
    iteration_tokens_count: float | None = None
    """Cumulative engine steps counted by vLLM's iteration-tokens histogram."""
    iteration_tokens_sum: float | None = None
    """Cumulative tokens those steps processed (prefill and decode)."""
    queue_time_count: float | None = None
    """Cumulative requests that left the scheduler's queue."""
    queue_time_sum_s: float | None = None
    """Their summed time in the queue, s."""
    generation_tokens_total: float | None = None


class ServerMetricsInfo(Record, kw_only=True):
    """How `server_metrics.csv` was taken, and what the server did not expose."""

    interval_s: float
    """Time between scrapes (a scrape starts this long after the previous one ended)."""
    n_scrapes: int = 0
    scrape_ms_median: float | None = None
    scrape_ms_p90: float | None = None
    scrape_bytes_median: float | None = None
    """Size of one /metrics answer, bytes."""
    missing: list[str] = []
    """Columns of ServerMetricsRow that no scrape carried: the server does not expose them
    under the names stepscope reads (`stepscope.server_metrics.SAMPLE_SERIES`)."""


class LoadAnatomyRow(Row, kw_only=True):
    """One category of one group of steps of one captured concurrency (reference rank)."""

    concurrency: int
    """The capture's requests in flight (1: stage 04's batch-1 capture)."""
    step_kind: str
    """`decode`, `mixed` (prefill chunks and decodes in one step) or `prefill`."""
    decode_requests: int
    """Requests each step of the group decodes (the annotation's own count)."""
    prefill_tokens: float
    """Prefill tokens per step, mean over the group (0 for decode steps)."""
    n_steps: int
    category: str
    ms_per_step: float
    """The category's interval union per step, mean over the group's steps, ms."""
    share_of_period: float | None
    """ms_per_step / period_ms (0-1)."""
    period_ms: float | None
    """Step start to next step start, mean over the group's steps that have a next step, ms."""
    busy_ms: float | None = None
    """Union of all the step's work, mean, ms."""


class LoadFit(Record, kw_only=True):
    """ms per decode step of one category against decode requests per step: a + b * batch,
    least squares over the decode steps of every captured level."""

    category: str
    measure: str = "union"
    """What is fitted: `union` (the category's interval union per step), or for a collective
    matched across ranks `transfer` (last arrival to completion, summed over the step's
    instances) and `wait` (this rank's arrival to the last arrival: rank skew, never named
    as what grows)."""
    n_steps: int
    n_batches: int
    """Distinct batch sizes among those steps (a slope needs two)."""
    intercept_ms: float | None = None
    slope_ms_per_request: float | None = None
    slope_se_ms: float | None = None
    """Standard error of the slope (ordinary least squares), ms per request."""
    ms_at_batch_min: float | None = None
    """Mean ms per step at the smallest batch seen, ms."""
    ms_at_batch_max: float | None = None
    batch_min: int | None = None
    batch_max: int | None = None


class LoadLevel(Record, kw_only=True):
    """One captured concurrency: what its steps held, and the throughput they imply."""

    concurrency: int
    trace_dir: str
    """Relative to the run folder."""
    n_steps: int
    n_decode_steps: int
    n_mixed_steps: int
    n_prefill_steps: int = 0
    decode_requests_mean: float | None = None
    """Decode requests per step, mean over decode and mixed steps."""
    decode_requests_max: int | None = None
    period_ms_mean: float | None = None
    """Mean step period over all steps with a next step, ms."""
    busy_share: float | None = None
    """Summed busy time over summed period (0-1); the rest is gaps between and inside steps."""
    output_tokens: int = 0
    """Tokens the window's steps generated (decode tokens of decode and mixed steps)."""
    window_s: float | None = None
    """First step start to last step start (summed periods), s."""
    predicted_output_tok_s: float | None = None
    """output_tokens / window_s: the throughput the trace implies."""
    measured_output_tok_s: float | None = None
    """The sweep's output tok/s at this concurrency (levels.csv), when it has the level."""
    capture_output_tok_s: float | None = None
    """The capture client's tokens over its own window, tok/s (profiler overhead included)."""
    band_rel: float | None = None
    """Relative noise band the two throughputs are judged within (report.noise)."""
    agrees: bool | None = None
    explanations: list[str] = []
    """Where the data can say why trace and sweep disagree (mixed steps, gaps, queueing,
    client-bound level, profiler overhead)."""


class ExpertLevel(Record, kw_only=True):
    """The routed experts at one captured level: fused_moe ms per decode step beside D(M)."""

    concurrency: int
    n_steps: int
    """Decode steps of the level."""
    decode_requests_mean: float
    """M, mean over those steps."""
    expert_layers: float
    """D(M)·MoE layers, mean over the steps, with D(M) = E·(1 − (1 − k/E)^M) the expected
    distinct experts M tokens touch in one layer."""
    ms_mean: float
    """fused_moe's interval union per decode step, mean, ms."""
    ms_se: float | None = None
    """Standard error of that mean, ms (None with one step)."""
    us_per_expert_layer: float | None = None
    """ms_mean / expert_layers, µs: the cost of one distinct expert in one layer."""
    us_per_expert_layer_se: float | None = None


class ExpertGrowth(Record, kw_only=True):
    """fused_moe (the routed experts) against the distinct experts touched: least squares of ms
    per decode step on D(M)·MoE layers over the decode steps of every captured level."""

    category: str = "fused_moe"
    n_routed_experts: int
    top_k: int
    n_moe_layers: int
    n_steps: int
    n_batches: int
    intercept_ms: float | None = None
    slope_ms_per_expert_layer: float | None = None
    """ms per step per distinct expert per MoE layer (the fit's slope)."""
    slope_se_ms: float | None = None
    by_level: list[ExpertLevel] = []
    follows_distinct_experts: bool | None = None
    """Every level's us_per_expert_layer within LOAD_SLOPE_SIGMAS combined standard errors of the
    lowest level's: the experts' time grows with the experts touched, not with the tokens.
    None with fewer than two levels that have a spread."""


class LoadAnatomySummary(Record, kw_only=True):
    """`05_categorize/load_anatomy.json`: the levels, the fits, the fastest-growing category."""

    rank: int | None = None
    levels: list[LoadLevel] = []
    fits: list[LoadFit] = []
    fastest_category: str | None = None
    """The category whose ms per step grows fastest with batch (largest slope, beyond twice
    its standard error; a collective by its transfer, never its wait); null when no slope
    clears its spread."""
    experts: ExpertGrowth | None = None
    """The routed experts beside D(M); null for a dense model or without an architecture."""
    notes: list[str] = []


class LoadReconciliationLevel(Record, kw_only=True):
    """One captured sweep level's wall time cut into measured parts, its steps as its own streams
    saw them, and its trace's steps beside them (trace.load_reconcile)."""

    concurrency: int
    level_s: float
    """First measured request's start to last one's end, s (the sweep's `duration_s`)."""
    parts: dict[str, float]
    """name -> seconds, summing to level_s: `decode_steps`, `prefill_mixed_steps` (the level's own
    steps, each owning the engine time since the step before it), `stalls`, `client_overhead`,
    `ramp_up`, `turnaround`, `drain` and `unexplained` (engine time after the last step seen)."""
    unexplained_share: float
    adds_up: bool
    """|unexplained| within `tolerance_share` of level_s, and steps_found within it of
    engine_iterations where the engine counted them."""
    n_requests: int
    prefills: float
    """Requests whose first token arrived with the level's concurrency in flight."""
    decode_tokens: float
    """Their other tokens received then."""
    decode_steps: float
    """Steps the level's streams saw in its engine time without a first token (a step partly
    outside engine time counts by its share inside)."""
    prefill_mixed_steps: float
    """Steps with a first token, counted the same way."""
    level_decode_period_ms: float | None = None
    """The decode steps' part over their count, ms: the level's own mean, without the profiler."""
    level_prefill_period_ms: float | None = None
    """The prefill and mixed steps' part over their count, ms."""
    level_prefills_per_step: float | None = None
    """First tokens per prefill or mixed step in the level (its mix, beside prefills_per_step)."""
    steps_found: float = 0.0
    """Steps the client saw over the whole level (a merged delivery counts its steps)."""
    engine_iterations: float | None = None
    """The engine's own iteration count over the level (vLLM's `iteration_tokens_total` count
    across the level's /metrics scrapes), to set beside steps_found."""
    steps_agree: bool | None = None
    """steps_found within `tolerance_share` of engine_iterations; null without the counter."""
    traced_steps_s: float | None = None
    """The level's engine-time tokens priced at its trace's steps (their mix and median
    periods), s: beside the steps' two parts, what the trace's steps would have taken."""
    decode_period_ms: float | None = None
    """Median period of the decode steps in the level's trace, ms."""
    decode_tokens_per_step: float | None = None
    """Decode tokens a decode step of the trace emitted, mean."""
    prefill_period_ms: float | None = None
    """Median period of the trace's prefill and mixed steps, ms (an increment over a decode
    step where prefill_steps_borrowed)."""
    prefills_per_step: float | None = None
    """Prefills per prefill or mixed step in the trace, mean."""
    prefill_step_decode_tokens: float = 0.0
    """Decode tokens a prefill or mixed step of the trace emits beside its prefills, mean."""
    prefill_steps_borrowed: bool = False
    """The level's window held no prefill or mixed step: another captured level's gave them."""
    profiler_cost_ms_per_step: float | None = None
    """The batch-1 capture's client TPOT (profiled) less the sweep's c=1 TPOT, ms: the profiler's
    cost per step plus any change in the machine between stages 01 and 04; 0 when the profiled
    run was faster, null without both."""
    records: str
    """The sweep level's records, relative to the run folder."""


class LoadReconciliation(Record, kw_only=True):
    """`05_categorize/load_reconciliation.json`: each captured level's time, part by part."""

    tolerance_share: float
    """A level adds up when its unexplained part is within this share of its time."""
    levels: list[LoadReconciliationLevel] = []


class LoadWindow(Record, kw_only=True):
    """`04_profiler_capture/c<C>/load_window.json`: how one load level was profiled and what the
    client saw over exactly that window."""

    concurrency: int
    window_method: str
    """`max_iterations` (vLLM stopped by itself after `load_steps` steps), `num_steps` (SGLang's
    own stop), or `timed` (no trace appeared within `capture.load_window_s`: /stop_profile ended it)."""
    start_profile_body: StartProfileBody | None = None
    load_steps: int | None = None
    window_s: float
    """/start_profile sent to the window's end (the first trace file seen, or the timed stop), s."""
    token_chunks: int = 0
    """Token-bearing chunks the client received in the window (merged chunks carry more tokens)."""
    capture_output_tok_s: float | None = None
    """token_chunks / window_s: the client's throughput over the window (a floor when chunks merge)."""
    requests_overlapping: int = 0
    requests_failed: int = 0
    started_at: str | None = None
    stop_status: int | None = None
    notes: list[str] = []


class MicroCurveReconciled(Record, kw_only=True):
    """One reconciled sweep level rebuilt with its decode steps at the micro-predicted step, and the
    prediction's error by component."""

    level_s: float
    """The level's time, s (`load_reconciliation.json`'s)."""
    decode_steps: float
    """The level's decode steps (`load_reconciliation.json`'s)."""
    decode_tokens_per_step: float | None = None
    """Decode requests a decode step of the level's trace held (the prediction assumes the concurrency)."""
    trace_step_ms: float
    """The level's traced decode period (median over its decode steps), ms."""
    trace_ms: dict[str, float]
    """component -> ms per decode step in the level's trace: `gemm`, `comm` and `attention_kv` (each its
    categories' interval union, mean over the level's decode steps) and `rest` (the traced period less those)."""
    error_ms: dict[str, float]
    """component -> traced less predicted, ms per step; they sum to trace_step_ms less the predicted step."""
    parts: dict[str, float]
    """name -> seconds, summing to level_s: the level's measured `prefill_mixed_steps`, `stalls`,
    `client_overhead`, `ramp_up`, `turnaround` and `drain`; `decode_steps_predicted` (decode_steps × the
    predicted step); `error_gemm`, `error_comm`, `error_attention_kv` and `error_rest` (decode_steps × each
    error_ms); `level_pace` (the level's decode steps' part less decode_steps × trace_step_ms: the level
    ran at its own pace, not the trace's); `unexplained` (the reconciliation's own remainder)."""
    predicted_level_s: float
    """level_s less the error parts and level_pace: the level had its decode steps taken the predicted step, s."""
    agree: bool | None = None
    """The predicted decode step and the traced one agree within PREDICTION_TOLERANCE."""
    off_components: list[str] = []
    """Components whose prediction is off its traced time beyond PREDICTION_TOLERANCE."""
    offsetting: bool = False
    """The step agrees only because components are off both ways (an offsetting agreement)."""


class MicroCurveLevel(Record, kw_only=True):
    """The decode step predicted at one closed-loop sweep concurrency M from the micro-benchmarks,
    before any load trace, and the sweep's measured throughput beside it."""

    concurrency: int
    gemm_ms: float | None = None
    """Stage 02's GEMM time per decode step at M (linear between the batches it timed), ms."""
    comm_ms: float | None = None
    """Stage 03's collectives per decode step, timed at `comm_from_batch`, ms."""
    comm_from_batch: int | None = None
    """The largest batch stage 03 timed at or below M (its time is held from there)."""
    comm_implementation: str | None = None
    """The collective implementation the time is of (`CommPrediction.implementation`)."""
    attention_kv_ms: float
    """The batch-1 trace's attention and KV-cache writes × M, ms."""
    rest_ms: float
    """The batch-1 period less its GEMM, collective, attention and KV-write time, held at every M, ms."""
    step_ms: float | None = None
    """The sum of the four, ms; null without stage 02's or stage 03's time."""
    predicted_tok_s: float | None = None
    """M / step_ms: every request in flight decodes one token per step."""
    measured_tok_s: float | None = None
    """The sweep's output tok/s at M (levels.csv)."""
    reconciled: MicroCurveReconciled | None = None
    """The level's time rebuilt from the prediction; null where stage 05 reconciled no capture of M."""


class MicroCurve(Record, kw_only=True):
    """`05_categorize/micro_curve.json`: the micro-predicted decode step at each sweep concurrency,
    and each reconciled level's time rebuilt from it, part by part."""

    method: str
    batch1_period_ms: float
    """The batch-1 trace's decode period (the median over categories of union / share of period), ms."""
    comm_implementation: str | None = None
    comm_implementation_reason: str | None = None
    comm_matches_trace: bool | None = None
    """`CommPrediction.matches_trace` after stage 05 re-pointed it at the trace's implementation."""
    levels: list[MicroCurveLevel] = []
