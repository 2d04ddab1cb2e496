"""Stage 01 (`01_macro_sweep/`): `levels.csv` and `summary.json` (`stepscope.sweep`)."""

from __future__ import annotations

from stepscope.schema._base import Record, Row


class SweepFailure(Record, kw_only=True):
    level: str
    request_id: str | int | None = None
    http_status: int | None = None
    error: str | None = None


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
    failures: list[SweepFailure] = []
    """The first 50 failed requests."""
    n_failures: int = 0
    flags: list[str] = []
    """Data-quality flags in words (no knee, bunched chunks, client-bound levels)."""


class LevelRow(Row, kw_only=True):
    """One sweep level (a concurrency, or a request rate), measured requests only."""

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
    source: str | None = None
    """`stepscope`, or the imported `vllm bench serve` file."""
