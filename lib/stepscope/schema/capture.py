"""Stage 04 (`04_profiler_capture/`): the profiler capture (`stepscope.capture`)."""

from __future__ import annotations

from stepscope.schema._base import Record, Setting
from stepscope.thresholds import BUNCHED_FLAG_SHARE, BUNCHED_TTFT_SHARE, STALLED_LEVEL_SHARE


class CaptureFile(Record, kw_only=True):
    path: str
    """Relative to `04_profiler_capture/`."""
    rank: int | None = None
    bytes: int | None = None
    sha256: str | None = None
    kind: str = "trace"
    """`trace`, `frontend_trace`, `profiler_table` or `frontend_table`."""


class StartProfileBody(Record, kw_only=True):
    """The JSON body of `POST /start_profile`: SGLang's (`num_steps`, ...), or vLLM's bounded
    window of a load capture (`delay_iterations`, `max_iterations`); vLLM's batch-1 capture
    sends none."""

    num_steps: int | None = None
    """SGLang: engine steps to record before it stops by itself."""
    delay_iterations: int | None = None
    """vLLM (load capture): engine steps to skip before recording."""
    max_iterations: int | None = None
    """vLLM (load capture): engine steps to record before it stops by itself."""
    activities: list[str] = []
    with_stack: bool = False
    record_shapes: bool = False
    output_dir: str | None = None


class CaptureManifest(Record, kw_only=True):
    engine: str | None = None
    engine_version: str | None = None
    base_url: str | None = None
    profiler_dir: str | None = None
    profiler_dir_source: str | None = None
    """Where `profiler_dir` came from (server.json, params)."""
    profiler_settings: dict[str, Setting] = {}
    """with_stack, record_shapes, ... as the server was configured."""
    start_profile_body: StartProfileBody | None = None
    tp: int | None = None
    ranks_expected: list[int] = []
    ranks_found: list[int] = []
    missing_ranks: list[int] = []
    partial: bool = False
    """True when not every expected rank's trace was complete."""
    requests: int | None = None
    """Sequential batch-1 requests sent while the profiler ran."""
    output_len: int | None = None
    input_len: int | None = None
    warmup_requests: int | None = None
    stop_profile_s: float | None = None
    """How long /stop_profile took, s."""
    started_at: str | None = None
    stopped_at: str | None = None
    notes: list[str] = []
    files: list[CaptureFile] = []


class CaptureLatency(Record, kw_only=True):
    """Client-side latency of the capture's requests (the sweep's metric definitions)."""

    n_requests: int | None = None
    n_completed: int | None = None
    n_failed: int = 0
    input_len: int | None = None
    output_len: int | None = None
    ttft_ms_mean: float | None = None
    ttft_ms_median: float | None = None
    tpot_ms_mean: float | None = None
    """Mean TPOT over the capture's requests, ms: what stage 05 sets beside a step's span."""
    tpot_ms_median: float | None = None
    e2el_ms_mean: float | None = None
    e2el_ms_median: float | None = None
    bunched_chunk_share: float | None = None
    """Share of inter-chunk gaps under 0.05 ms (the sweep's definition): chunks held back and
    delivered together. Absent in run folders written before it was recorded."""
    merged_token_share: float | None = None
    """Share of output tokens that arrived inside another token's chunk (the sweep's definition)."""
    stall_total_s: float | None = None
    """Time the stream was silent for over `STALL_GAP_S` at a stretch (the sweep's server-wide
    stall, at batch 1), s. Absent in run folders written before it was recorded."""
    stall_share: float | None = None
    """`stall_total_s` over the captured requests' wall time (first start to last end)."""
    definitions: str | None = None

    def bunched(self) -> bool:
        """Most chunks arrived bunched (BUNCHED_FLAG_SHARE), or the median TTFT took most of the
        end-to-end time (BUNCHED_TTFT_SHARE), so one burst carried most tokens."""
        if self.bunched_chunk_share is not None and self.bunched_chunk_share > BUNCHED_FLAG_SHARE:
            return True
        ttft, e2el = self.ttft_ms_median, self.e2el_ms_median
        return ttft is not None and e2el is not None and e2el > 0 and ttft > BUNCHED_TTFT_SHARE * e2el

    def stalled(self) -> bool:
        """The stream stopped for more than STALLED_LEVEL_SHARE of the capture (the sweep's rule
        for a level): its mean TPOT carries the stall, which the trace's steps may not."""
        return self.stall_share is not None and self.stall_share > STALLED_LEVEL_SHARE

    def tpot_is_delivery(self) -> bool:
        """The client-side TPOT measures delivery, not decode: bursts shrink it, stalls grow it,
        whatever the step costs."""
        return self.bunched() or self.stalled()
