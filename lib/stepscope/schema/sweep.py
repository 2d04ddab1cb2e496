"""Stage 01 (`01_macro_sweep/`): `levels.csv` and `summary.json` (`stepscope.sweep`)."""

from __future__ import annotations

from stepscope.schema._base import Record, Row, Setting


class SweepFailure(Record, kw_only=True):
    level: str
    request_id: str | int | None = None
    http_status: int | None = None
    error: str | None = None


class SloBoundary(Record, kw_only=True):
    """The SLO boundary of one load mode (closed loop: concurrency; open loop: req/s)."""

    boundary_level: str | None = None
    """The highest level, counted up from the lowest, at which at least `min_share` of requests
    met every bound; null when even the lowest missed."""
    boundary_load: float | None = None
    """Its concurrency or request rate (req/s)."""
    first_miss_level: str | None = None
    """The first level above it that missed; null when every level met the SLO."""
    first_miss_load: float | None = None
    passes_above_miss: list[str] = []
    """Levels above the first miss that met the SLO again (not taken as the boundary)."""
    n_levels: int = 0
    output_tok_s: float | None = None
    """Output tok/s at the boundary level."""
    goodput_tok_s: float | None = None
    """Output tok/s of the requests that met the SLO, at the boundary level."""
    goodput_rps: float | None = None


class SloSummary(Record, kw_only=True):
    bounds_ms: dict[str, float] = {}
    """{ttft_ms|tpot_ms|itl_ms|e2el_ms: bound in ms} (params `sweep.slo`)."""
    min_share: float = 0.9
    """Share of a level's requests that must meet the SLO (params `sweep.slo.min_share`)."""
    concurrency: SloBoundary | None = None
    rate: SloBoundary | None = None


class SloSearchMode(Record, kw_only=True):
    """The SLO search along one load mode: the bracket the planned levels left, and what the
    extra levels made of it."""

    planned_boundary_load: float | None = None
    """The boundary's concurrency or req/s among the planned levels alone."""
    planned_first_miss_load: float | None = None
    boundary_load: float | None = None
    """The refined boundary, over planned and search levels (as `slo.<mode>.boundary_load`)."""
    first_miss_load: float | None = None
    levels: list[str] = []
    """The extra levels measured along this mode, in the order the bisection chose them."""
    stopped: str = ""
    """Why the search stopped here, in words (adjacent concurrencies, rates within
    `min_rate_step_share`, the `max_extra_levels` budget, no bracket to refine)."""


class SloSearchSummary(Record, kw_only=True):
    """`sweep.slo_search`: bisection between the SLO-boundary level and the first miss."""

    max_extra_levels: int = 3
    levels: list[str] = []
    """Every extra level, in the order measured (also `slo_search` true in levels.csv)."""
    reused: list[str] = []
    """Those kept from an earlier run under --resume (same identity), not measured again."""
    concurrency: SloSearchMode | None = None
    rate: SloSearchMode | None = None


class PlannedLevel(Record, kw_only=True):
    name: str
    mode: str
    concurrency: int | None = None
    request_rate: float | None = None
    n_requests: int = 0
    slo_search: bool = False
    """An extra level the SLO search chose (written here before it is measured)."""


class SweepPlan(Record, kw_only=True):
    """`01_macro_sweep/plan.json`: the levels this sweep measures, planned ones first, then the
    SLO search's as it chooses them; --resume keeps only levels listed here (same identity)."""

    levels: list[PlannedLevel] = []


class SweepSummary(Record, kw_only=True):
    knee_concurrency: int | None = None
    """The first level beyond which no level adds `knee_gain` output tok/s per doubling of
    concurrency; null when every level still gained that much (no plateau reached)."""
    plateau_output_tok_s: float | None = None
    """Output tok/s at the knee; null exactly when `knee_concurrency` is null."""
    knee_gain: float = 0.1
    """The gain per doubling that defines the knee (params `sweep.knee_gain`)."""
    gains_per_doubling: dict[str, float] = {}
    """{concurrency: relative output tok/s gain per doubling beyond it}."""
    c1_ttft_ms_median: float | None = None
    """Median TTFT at concurrency 1, ms."""
    c1_tpot_ms_median: float | None = None
    """Median TPOT at concurrency 1, ms."""
    n_levels: int | None = None
    died_at_level: str | None = None
    """The level during which the server died; later levels are absent."""
    died_message: str | None = None
    timed_out_at_level: str | None = None
    """The level the liveness watchdog ended (no token on any open stream for
    `sweep.silence_timeout_s`); `died_message` then says whether /health still answered."""
    failures: list[SweepFailure] = []
    """The first 50 failed requests."""
    n_failures: int = 0
    flags: list[str] = []
    """Data-quality flags in words (no knee, bunched chunks, client-bound levels)."""
    reused_levels: list[str] = []
    """Levels kept from an earlier run of this stage (`stepscope run --resume` only: finished,
    with the same settings and server), not measured this time; the console names them."""
    slo: SloSummary | None = None
    """Goodput's SLO and the SLO-boundary level per load mode; null when `sweep.slo` is unset."""
    slo_search: SloSearchSummary | None = None
    """The SLO search's extra levels and the bracket it refined; null when `sweep.slo_search` is unset."""


class LevelRow(Row, kw_only=True):
    """One sweep level (a concurrency, or a request rate), measured requests only.

    Each latency (TTFT, TPOT, ITL, E2EL; ms) has mean, median, p90, p99, std (population, as
    vLLM's), min and max, and one `<metric>_ms_p<P>` column per other percentile in
    `sweep.percentiles` (default 25, 50, 75, 90, 95, 99: p25, p75 and p95 are added; p50 is
    the median; 99.9 is spelled `p99.9`, as vLLM spells it)."""

    level: str
    """`c0004` (closed loop, concurrency 4) or `r2.5` (open loop, 2.5 req/s)."""
    mode: str
    """`concurrency` or `rate`."""
    concurrency: float | None
    """Closed loop: requests in flight; empty for open loop."""
    request_rate: float | None
    """Open loop: Poisson arrival rate, requests/s; empty for closed loop."""
    n_requests: int
    n_completed: int
    n_failed: int
    duration_s: float | None
    """First dispatch to last completion."""
    request_throughput_rps: float | None
    output_throughput_tok_s: float | None
    total_throughput_tok_s: float | None
    """Input + output tokens per second."""
    total_input_tokens: int | None = None
    """Prompt tokens of the completed requests (vLLM's `total_input_tokens`)."""
    total_output_tokens: int | None = None
    """Output tokens of the completed requests (usage; chunks where the server sent none)."""
    output_tok_s_per_user: float | None = None
    """Output tok/s one user sees: per completed request output tokens / E2EL (TTFT included),
    averaged over requests (GuideLLM's per-request rate). AIPerf's "output token throughput per
    user" is 1000 / TPOT instead (decode only): from `requests.csv` or the TPOT columns."""
    goodput_rps: float | None = None
    """Requests per second that completed within every `sweep.slo` bound (vLLM's goodput)."""
    goodput_tok_s: float | None = None
    """Output tok/s of those requests."""
    slo_met_share: float | None = None
    """Share of measured requests (failed ones count as missing) meeting every bound (0-1)."""
    slo_ttft_share: float | None = None
    """Share meeting the TTFT bound (0-1); empty when it is not set."""
    slo_tpot_share: float | None = None
    slo_itl_share: float | None = None
    """Share whose longest inter-chunk gap is within the ITL bound (0-1)."""
    slo_e2el_share: float | None = None
    ttft_ms_mean: float | None
    ttft_ms_median: float | None
    ttft_ms_p90: float | None
    ttft_ms_p99: float | None
    tpot_ms_mean: float | None
    """Per request (E2EL - TTFT) / (tokens - 1); then mean, median, p90, p99 over requests."""
    tpot_ms_median: float | None
    tpot_ms_p90: float | None
    tpot_ms_p99: float | None
    itl_ms_mean: float | None = None
    """Gaps between token-bearing chunks, pooled over requests."""
    itl_ms_median: float | None = None
    itl_ms_p90: float | None = None
    itl_ms_p99: float | None = None
    e2el_ms_mean: float | None = None
    e2el_ms_median: float | None = None
    e2el_ms_p90: float | None = None
    e2el_ms_p99: float | None = None
    ttft_ms_std: float | None = None
    ttft_ms_min: float | None = None
    ttft_ms_max: float | None = None
    ttft_ms_p25: float | None = None
    ttft_ms_p75: float | None = None
    ttft_ms_p95: float | None = None
    tpot_ms_std: float | None = None
    tpot_ms_min: float | None = None
    tpot_ms_max: float | None = None
    tpot_ms_p25: float | None = None
    tpot_ms_p75: float | None = None
    tpot_ms_p95: float | None = None
    itl_ms_std: float | None = None
    itl_ms_min: float | None = None
    itl_ms_max: float | None = None
    itl_ms_p25: float | None = None
    itl_ms_p75: float | None = None
    itl_ms_p95: float | None = None
    e2el_ms_std: float | None = None
    e2el_ms_min: float | None = None
    e2el_ms_max: float | None = None
    e2el_ms_p25: float | None = None
    e2el_ms_p75: float | None = None
    e2el_ms_p95: float | None = None
    littles_concurrency: float | None = None
    """Mean requests in flight by Little's law (throughput x mean E2EL)."""
    peak_output_tok_s_1s: float | None = None
    """Most output tokens in any 1 s window."""
    bunched_chunk_share: float | None = None
    """Share of inter-chunk gaps under 0.05 ms (0-1): output delivered in bursts."""
    merged_token_share: float | None = None
    """Share of output tokens that arrived in another token's chunk (0-1)."""
    stall_count: int | None = None
    """Server-wide stalls: every stream in flight silent at once for over `thresholds.STALL_GAP_S`."""
    stall_total_s: float | None = None
    """Their summed length, s."""
    stall_max_s: float | None = None
    """The longest, s."""
    stall_share: float | None = None
    """stall_total_s / duration_s (0-1)."""
    input_tokens_p50: float | None = None
    """Median prompt length of the completed requests, tokens (server usage)."""
    input_tokens_p90: float | None = None
    output_tokens_p50: float | None = None
    output_tokens_p90: float | None = None
    prefix_cache_hit_rate: float | None = None
    """Prompt tokens the prefix cache served / prompt tokens looked up during the level (0-1,
    from /metrics counters); empty when the server exposes none."""
    gpu_sm_clock_drop_share: float | None = None
    """Largest fall of a GPU's SM clock below its own maximum during the level (0-1, NVML)."""
    gpu_memory_used_share_max: float | None = None
    """The fullest GPU memory during the level (0-1)."""
    gpu_power_w_max: float | None = None
    """The highest power draw of a GPU during the level, W."""
    client_cpu_pct: float | None = None
    """The load generator's CPU use, % of one core."""
    client_bound: bool | None = None
    """The load generator may have limited this level."""
    server_running_max: float | None = None
    """Most requests running, from the server's /metrics."""
    server_waiting_max: float | None = None
    kv_cache_usage_max: float | None = None
    """0-1."""
    complete: bool | None = None
    """False: the server died during this level."""
    n_timed_out: int | None = None
    """Requests (warm-up included) the liveness watchdog ended as timeouts: no token on any open
    stream for `sweep.silence_timeout_s`."""
    silent_s: float | None = None
    """How long every open stream had been silent when the watchdog ended the level, s; empty
    when it did not."""
    silence_health: str | None = None
    """What /health said then: `alive_not_answering` (200) or `not_answering`; empty otherwise."""
    source: str | None = None
    """`stepscope`, or the imported `vllm bench serve` file."""
    slo_search: bool | None = None
    """True: an extra level the SLO search chose by bisection (`sweep.slo_search`), not planned."""


class GpuTelemetryRow(Row, kw_only=True):
    """One NVML reading of one GPU during a sweep level or a profiled capture window
    (`stepscope.sweep.gpu_telemetry`)."""

    level: str
    """The sweep level (`c0004`), or `capture` / `capture-c0004` for stage 04's windows."""
    gpu: int
    """NVML device index."""
    t_s: float
    """Seconds since the level's measurement (or the capture's window) began."""
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    gpu_util_pct: float | None = None
    """Share of the sample period a kernel ran (NVML's definition), %."""
    mem_util_pct: float | None = None
    """Share of the sample period device memory was read or written, %."""


class GpuTelemetryInfo(Record, kw_only=True):
    available: bool = False
    reason: str | None = None
    """Why there is no telemetry (no nvidia-ml-py, no driver, no GPU, turned off); null when there is."""
    n_samples: int = 0
    n_gpus: int = 0
    period_s: float = 0.5


class AiperfStats(Record, kw_only=True):
    """One metric's block in AIPerf's `profile_export_aiperf.json` (schema 1.4); an absent key does not
    apply to the metric, as AIPerf omits it."""

    unit: str
    avg: float | None = None
    min: float | None = None
    max: float | None = None
    std: float | None = None
    count: int | None = None
    sum: float | None = None
    p1: float | None = None
    p5: float | None = None
    p10: float | None = None
    p25: float | None = None
    p50: float | None = None
    p75: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


class AiperfExport(Record, kw_only=True):
    """`01_macro_sweep/aiperf/<level>/profile_export_aiperf.json`: one level in the keys and units
    of AIPerf's summary export (schema 1.4), for tools that read AIPerf's. The per-request metrics
    are over the level's successful measured requests; `warmup_metrics` over its warm-ups. A
    metric with no sample is absent."""

    schema_version: str
    """AIPerf's export schema this file follows (`1.4`)."""
    aiperf_version: str | None = None
    """Null: stepscope wrote it, not AIPerf (`producer`)."""
    producer: str
    benchmark_id: str
    """`stepscope-<run>-<level>`."""
    was_cancelled: bool = False
    input_config: dict[str, Setting] = {}
    """The level's traffic: model, concurrency or rate, endpoint, streaming."""
    error_summary: list[dict[str, Setting]] = []
    """Per distinct error of a failed request: `error` and `count`."""
    request_latency: AiperfStats | None = None
    time_to_first_token: AiperfStats | None = None
    inter_token_latency: AiperfStats | None = None
    input_sequence_length: AiperfStats | None = None
    output_sequence_length: AiperfStats | None = None
    output_token_throughput_per_user: AiperfStats | None = None
    request_count: AiperfStats | None = None
    error_request_count: AiperfStats | None = None
    request_throughput: AiperfStats | None = None
    output_token_throughput: AiperfStats | None = None
    benchmark_duration: AiperfStats | None = None
    warmup_metrics: dict[str, AiperfStats] | None = None


class VllmBenchResult(Record, kw_only=True):
    """`01_macro_sweep/vllm_bench/<level>.vllm.json`: one level in the keys and units of `vllm bench
    serve --save-result` (vLLM 0.32.0, `vllm/benchmarks/serve.py`), those stepscope measures.
    Besides the keys below: `mean_`, `median_`, `std_` and `p<P>_` `<metric>_ms` for TTFT,
    TPOT, ITL and E2EL, one `p<P>` per `sweep.percentiles` (`p99_ttft_ms`, `p99.9_itl_ms`).
    A latency with no sample is null (vLLM writes 0)."""

    label: str | None = None
    """`stepscope <level>`."""
    model_id: str | None = None
    """The served model name the requests named."""
    num_prompts: int | None = None
    """Measured requests sent (warm-ups not counted)."""
    request_rate: float | str | None = None
    """Open loop: req/s; closed loop: `"inf"` (vLLM's spelling with --max-concurrency)."""
    burstiness: float | None = None
    max_concurrency: int | None = None
    """Closed loop: requests in flight; null for open loop."""
    duration: float | None = None
    """s, first dispatch to last completion."""
    completed: int | None = None
    failed: int | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    request_throughput: float | None = None
    """Completed requests/s."""
    request_goodput: float | None = None
    """Requests/s within every `sweep.slo` bound; null without an SLO (as vLLM without --goodput)."""
    output_throughput: float | None = None
    """Output tok/s."""
    total_token_throughput: float | None = None
    """Input + output tok/s."""
    max_output_tokens_per_s: float | None = None
    """Most output tokens in one whole second (vLLM counts one per chunk; here a chunk weighs its tokens)."""
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    median_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    median_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    median_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None


class SweepRequestRow(Row, kw_only=True):
    """`01_macro_sweep/requests.csv`: one measured request of a sweep level (AIPerf's
    per-request export), warm-ups left out. Latencies in ms, as `stepscope.sweep.metrics` defines them."""

    level: str
    mode: str
    concurrency: float | None
    request_rate: float | None
    request_id: int
    success: bool
    """Completed with at least one token-bearing chunk."""
    error: str | None = None
    http_status: float | None = None
    """Empty when the request got no HTTP status (a reset, a timeout)."""
    input_tokens: int
    output_tokens: int
    """usage.completion_tokens; the chunk count when the server sent no usage; 0 when it failed."""
    output_tokens_from_usage: bool | None = None
    n_chunks: int | None = None
    start_s: float
    """Dispatch, on the client's monotonic clock (time.perf_counter, s): only differences mean something."""
    end_s: float | None = None
    """The response's end, same clock."""
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    """(E2EL - TTFT) / (output tokens - 1); empty for one output token."""
    e2el_ms: float | None = None
    output_tok_s: float | None = None
    """Output tokens / E2EL (s): this request's rate, whose mean is levels.csv `output_tok_s_per_user`."""
