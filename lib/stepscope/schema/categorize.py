"""Stage 05 (`05_categorize/`): kernel categories and exact per-step accounting (`stepscope.trace`).
All times are µs unless the key says `_ms`; keys of schema version 2 read as null in older runs."""

from __future__ import annotations

from msgspec import field

from stepscope.schema._base import Record, Row


class Stat(Record, kw_only=True):
    mean: float | None = None
    median: float | None = None
    p90: float | None = None


class PeriodStat(Stat, kw_only=True):
    n: int = 0
    """How many step-to-next-step intervals the statistics pool."""


class CountStat(Record, kw_only=True):
    median: float | None = None
    min: float | None = None
    max: float | None = None


class CategoryTotals(Record, kw_only=True):
    count: int
    """Calls (a CPU collective counts once, at its entry op)."""
    sum_us: float
    """Summed durations."""
    union_us: float
    """Interval union: time at least one of its kernels ran."""
    exposed_us: float
    """Time no higher-priority class covers (compute > communication > memory)."""


class NamedTime(Record, kw_only=True):
    name: str
    sum_us: float
    count: int


class ClassTotals(Record, kw_only=True):
    """compute_us + comm_exposed_us + memory_exposed_us == busy_us, exactly."""

    compute_us: float
    comm_exposed_us: float
    memory_exposed_us: float
    busy_us: float


class RankSummary(Record, kw_only=True):
    """One rank's whole trace."""

    rank: int
    """From `distributedInfo.rank`, else the file name."""
    file: str
    mode: str
    """`gpu` (device kernels) or `cpu` (CPU-only trace: op self time is the work)."""
    origin_us: float | None = None
    """The trace-clock instant every other time of this rank is measured from."""
    n_device_events: int
    """Work events (CPU traces: op pieces)."""
    kernel_sum_us: float
    """Summed durations of all work."""
    busy_us: float
    """Union of all work."""
    idle_us: float
    span_us: float
    """First to last work; busy_us + idle_us == span_us exactly."""
    categories: dict[str, CategoryTotals] = {}
    """{category: totals}. Exposed time is what no higher-priority class covers: compute
    first, then communication, then memory. Compute kernels can overlap each other and a
    compute category's exposed time is its whole union, so the categories' exposed times can
    add up to more than `busy_us`; `class_totals_us` adds up exactly."""
    other_share: float = 0.0
    """Time in `other` (no rule matched) / kernel sum, 0-1."""
    other_top_names: list[NamedTime] = []
    """The largest names in `other`, always shown."""
    n_steps: int = 0
    n_decode_steps: int = 0
    """Steps labelled decode that hold work."""
    step_source: str | None = None
    """`annotation:vllm`, `annotation:sglang`, `engine_frames`, `annotation:profiler_step`,
    `iteration_markers`, `benchmark_annotations`, `graph_launches` or `whole_trace`: the strongest
    source present that passed its check."""
    step_sources: list[StepSourceChoice] = []
    """Every step source the trace holds, the chosen one first, each refused or outranked one with why."""
    unattributed_events: int = 0
    """Work that belongs to no recorded step (left out of per-step figures)."""
    attribution: dict[str, int] = {}
    """{how a work row found its step: rows}."""
    excluded: dict[str, float] = {}
    """Work left out and why (CPU traces: ops on other threads or outside steps)."""
    levers: list[CategoryLeverRow] | None = None
    """This rank's categories as levers (rows of category_levers.csv)."""
    collectives_per_decode_step: dict[str, float | None] = {}
    """{all_reduce, all_gather}: medians over decode steps."""
    step_kinds: dict[str, int] | None = None
    """{step kind: count}."""
    class_totals_us: ClassTotals | None
    """Whole-trace class totals; they add up to busy_us exactly, unlike per-category exposed times."""
    catch_all_share: float | None = None
    """Share of kernel time in `unattributed_elementwise`: matched only by a catch-all rule
    (a library kernel whose op no name rule or enclosing frame tells); `other_share` is what
    no rule matched at all."""
    catch_all_top_names: list[NamedTime] | None = None
    """Its largest names."""


class StepSourceChoice(Record, kw_only=True):
    """One step source a rank's trace holds (`trace.step_sources.STEP_SOURCES`), and what became of it."""

    source: str
    """`annotation:vllm`, `engine_frames`, `graph_launches`, ... (docs/trace-analysis.md#step-sources)."""
    n_steps: int
    """Steps it yields."""
    status: str
    """`chosen`, `refused` (its steps are pieces of a coarser source's) or `outranked` (a stronger
    source was chosen)."""
    reason: str | None = None
    """Why it was refused or outranked."""
    kind_from: str | None = None
    """How its steps got their kind where no annotation says it (vLLM's frames: graph replay)."""


class StepTimes(Record, kw_only=True):
    """Per-step readings on the reference rank, each {mean, median, p90} over the steps used."""

    steps_used: str | None = None
    """`decode`, or what was used when no step is labelled decode."""
    n_steps: int = 0
    kernel_sum_ms: Stat = field(default_factory=Stat)
    union_ms: Stat = field(default_factory=Stat)
    """Busy time: the union of the step's work."""
    span_ms: Stat = field(default_factory=Stat)
    """First to last work of the step."""
    annotation_ms: Stat = field(default_factory=Stat)
    """The engine's host-side step annotation."""
    period_ms: Stat | None = None
    """Step start to the next step's start."""
    period_busy_ms: Stat | None = None
    """Where steps overlap on the device: the device's busy time within a period (any step's
    work), the reading that a period can hold, beside `union_ms`, one step's own work, which it
    cannot then. Null where steps do not overlap."""
    tpot_capture_ms: float | None = None
    """Mean TPOT the client measured during capture."""


class LargestGap(Record, kw_only=True):
    dur_ms: float | None = None
    step: int | None = None
    """The step it follows or lies in."""
    before: str | None = None
    """`category: name` of the work before the gap."""
    after: str | None = None
    host_call: str | None = None
    """The host call running during the gap, when the trace shows one."""
    host_frame: str | None = None
    """The innermost host frame holding the whole gap, its cause (e.g. a DataLoader's
    `__next__`); None when no recorded frame holds it."""
    macro: bool | None = None
    """True: at least `thresholds.MACRO_GAP_US` long (a stall); false: a micro gap. Either
    way the gap lies inside the step's work."""


class HostGapTime(Record, kw_only=True):
    """One gap per step in which the device waits on the host, over the judged steps: the
    largest gap inside each step (a macro gap), or the device's gap between consecutive steps."""

    ms_per_step: float
    """Mean per step over `n_steps` (0 for a step without such a gap)."""
    n_steps: int
    share_of_idle: float | None = None
    """Its time over the device's idle time (period minus busy) of the steps with a period,
    0-1; span minus busy where no step has one."""
    frame: str | None = None
    """The host frame (annotation, op or Python frame) holding most of its time, e.g.
    `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`; None when no recorded frame
    holds the gaps."""
    frame_ms_per_step: float | None = None
    """The gaps' time inside `frame`, per step (over `n_steps`)."""
    n_steps_in_frame: int = 0
    python_frames: int | None = None
    """Python frames (`python_function`) starting inside a gap held by `frame`, median over its
    steps, of those stepscope keeps (module and step frames; the parse drops the rest). Any at all
    says the profiler's Python tracer ran during the gap, and it adds its own cost to every Python
    call: the gap may be shorter untraced."""


class SpecDecodeSteps(Record, kw_only=True):
    """Verify steps under speculative decoding, counted from the step annotations, beside plain ones."""

    n_decode_steps: int
    n_verify_steps: int
    n_plain_steps: int
    scored_tokens_per_step: float
    """Tokens the forward pass scores per decode step (requests + drafts), all decode steps."""
    scored_tokens_per_verify_step: float
    draft_tokens_per_verify_step: float
    requests_per_step: float
    time_basis: str
    """`period` or `span`: what the step times below measure."""
    verify_step_ms: float | None = None
    plain_step_ms: float | None = None
    decode_step_ms: float | None = None


class DecodeSummary(Record, kw_only=True):
    """The decode summary on the reference rank."""

    rank: int | None = None
    """The reference rank (the lowest)."""
    steps: StepTimes = field(default_factory=StepTimes)
    """Kernel sum, union, span, annotation and period per step, beside the capture's TPOT."""
    categories: list[DecodeCategoryRow] = []
    """The reference rank's rows of decode_categories.csv."""
    amdahl: list[AmdahlRow] = []
    """The reference rank's rows of amdahl.csv."""
    period_ms: PeriodStat | None
    """Step start to next step start, over decode steps followed by a decode step."""
    denominator: str | None
    """`period` (shares and Amdahl ceilings divide by it) or `span` (one step only; see
    `denominator_reason`)."""
    denominator_reason: str | None = None
    period_from_device_n: int = 0
    """Steps of the period whose host-side period was shorter than their device busy time,
    measured on the device instead (stage 05 flags `period_from_device`)."""
    idle_micro_ms: float | None
    """Mean per step: gaps between work inside a step, each shorter than
    `thresholds.MACRO_GAP_US`."""
    idle_macro_ms: float | None
    """Mean per step: gaps inside a step of at least `thresholds.MACRO_GAP_US` (stalls).
    micro + macro = span - busy; the time between steps is period - span."""
    largest_gap: LargestGap | None = None
    """The longest gap in any decode step."""
    host_gap: HostGapTime | None = None
    """Each judged step's largest gap (a macro gap), together: per step, its share of the
    steps' idle and the host frame it lies in. The boundness finding reads it (one host gap
    holding most of the idle of a mostly idle step: host-bound)."""
    between_steps: HostGapTime | None = None
    """The device's gap between consecutive steps of the judged kind (period minus span), with the
    host frame running then (a DataLoader's `__next__` between training steps)."""
    launch_delay_us: dict[str, float | None] | None = None
    """{median, p90}: launch to kernel start (GPU traces)."""
    spec_decode: SpecDecodeSteps | None = None
    """Verify steps under speculative decoding (null when no step scored a draft)."""

    @classmethod
    def empty(cls) -> DecodeSummary:
        """The summary of a run whose stage 05 did not run: nothing measured."""
        return cls(period_ms=None, denominator=None, idle_micro_ms=None, idle_macro_ms=None)


class ObservedCollectives(Record, kw_only=True):
    """Collective calls per step on the reference rank, over the steps used."""

    steps_used: str | None = None
    """`decode`, or what was used when no step is labelled decode."""
    n_steps: int = 0
    all_reduce: CountStat = field(default_factory=CountStat)
    all_gather: CountStat = field(default_factory=CountStat)
    other_collective: CountStat = field(default_factory=CountStat)

    def per_step(self) -> dict[str, float | None]:
        """{collective: median calls per step}."""
        return {"all_reduce": self.all_reduce.median, "all_gather": self.all_gather.median,
                "other_collective": self.other_collective.median}


class ExpectedCollectives(Record, kw_only=True):
    """Collective calls per decode step the architecture implies (`stepscope.model`)."""

    all_reduce: int
    all_gather: int
    reasoning: str | None = None
    """How the counts follow from the architecture, in a sentence."""

    def per_step(self) -> dict[str, float | None]:
        """{collective: calls per decode step}."""
        return {"all_reduce": float(self.all_reduce), "all_gather": float(self.all_gather)}


class CollectivesCheck(Record, kw_only=True):
    observed: ObservedCollectives = field(default_factory=ObservedCollectives)
    expected: ExpectedCollectives | None = None
    """Null without an architecture or a TP size."""
    match: bool | None = None
    explanation: list[str] = []
    """Sentences: why the counts differ, or what was not checked."""
    rank: int | None = None
    tp: int | None = None
    """The TP size the expectation used."""
    tp_source: str | None = None
    """`params`, `trace` or `default`."""
    steps_failing: list[int] | None = None
    """Decode steps whose own all-reduce count is not the expected one (`trace.info.steps_off_architecture`):
    each is flagged (`steps_off_architecture`); null without an expectation."""


class WeightFormatNamed(Record, kw_only=True):
    """A weight format the GEMM kernels' names state (`trace.info.weight_formats_named`)."""

    format: str
    """The weights' format: `mxfp4`, `nvfp4`, `mxfp8`, `w4a16`, `fp8` or `int8`."""
    n_kernels: int
    """Kernel names stating it, among the largest kernels of each GEMM category."""
    ms_per_step: float
    """Their summed time per decode step."""
    example_kernel: str
    activations: str | None = None
    """The activation formats the same names spell out, where they do (`mxfp8` for
    TRT-LLM-gen's `..._MxE2m1MxE4m3_...`, `bf16` for matmul_ogs' `..._bf16xbf16xmxfp4_...`);
    None where the names say only the weights."""
    """The longest-running of them."""


class MixedReading(Record, kw_only=True):
    """Mixed prefill-and-decode steps, medians over them; null where the annotation is silent."""

    n_steps: int
    prefill_requests: float | None = None
    prefill_tokens: float | None = None
    decode_requests: float | None = None
    decode_tokens: float | None = None


class TraceInfo(Record, kw_only=True):
    """What the traces are."""

    kind: str | None = None
    """`decode`, `prefill`, `mixed`, `training`, `capture` (CUDA-graph capture, compile or
    warm-up: kernels recorded, not run), `diffusion`, `vision`, `encoder` (inference that is
    not an LLM's), `single_step` or `unknown`; decided from `kind_evidence` and the step labels."""
    engine: str | None = None
    """`vllm`, `sglang` or `unknown`."""
    device_name: str | None = None
    device_count: int | None = None
    batch_size: float | None = None
    """Requests per decode step from the annotations, median; null when unknown."""
    batch_source: str | None = None
    input_shape: list[int] | None = None
    """(batch, sequence) of the model's input when the trace's shapes say it, else null."""
    world_size: int | None = None
    """From `distributedInfo`."""
    ranks_present: list[int] = []
    tp: int | None = None
    tp_source: str | None = None
    """`params`, `trace` or `default`."""
    tp_disagreement: bool | None = None
    n_steps: int | None = None
    """Steps of the reference rank; null when the trace has no step marker (`step_source`
    `whole_trace`): it is read whole, as one window, and holds no steps to count."""
    step_source: str | None = None
    """Where the reference rank's steps came from (`annotation:vllm`, `graph_launches`,
    `whole_trace`, ...), as in its rank summary."""
    n_decode_steps: int | None = None
    step_kinds: dict[str, int] = {}
    judged_kind: str | None = None
    """The step kind the per-step figures describe."""
    graph_replay: bool | None = None
    """True when most device events of the judged steps were launched by graph launches
    (`cudaGraphLaunch`/`hipGraphLaunch`; launch overhead is already amortised), false when
    kernels are launched one by one, null on CPU traces."""
    graph_launched_events: int | None = None
    """Device events of the judged steps (reference rank) launched by a graph launch."""
    device_events: int | None = None
    """Device events of the judged steps (reference rank)."""
    low_confidence: bool | None = None
    """Fewer than 5 steps of the judged kind."""
    weight_formats_named: list[WeightFormatNamed] = []
    """Weight formats the GEMM kernels' names state, the most time first; empty when none
    does (which is not the same as bf16)."""
    kind_evidence: dict[str, list[str]] = {}
    """What the reference rank's events say about the kind, by kind (`capture`, `diffusion`,
    `vision`, `encoder`, `llm`, `model_passes`): annotations, runtime calls, frames and
    nn.Module classes found, with counts (e.g. "module `SD3Transformer2DModel` ×4")."""
    model_passes: int | None = None
    """Non-LLM inference: forward passes of the denoiser in the trace (a pipeline's profiler
    step holds several), when its module frames say."""
    mixed: MixedReading | None = None
    """A mixed trace's own reading (prefill beside decode), from the step annotations."""
    host_only_of_gpu_job: list[str] = []
    """A trace with no device activity whose host ops name a GPU library (NCCL collectives, CUDA
    or HIP runtime calls): what the host recorded of a job that ran on GPUs, e.g. "op
    `nccl:all_to_all` ×6". Its times are the host's, not the device's work. Empty otherwise
    (a CPU inference engine's trace names none)."""


class Percentiles(Record, kw_only=True):
    p50: float | None = None
    p90: float | None = None


class ClockFlag(Record, kw_only=True):
    """Ranks whose matched collectives end, median, further than `CLOCK_SKEW_LIMIT_US` from the
    reference rank's: their clocks disagree, so cross-rank waits are not trusted."""

    ranks: list[int]
    median_end_offset_us: dict[str, float]
    """{rank: median end offset from the reference rank}, every non-reference rank."""


class CollectiveCategoryStats(Record, kw_only=True):
    """One collective category's matched instances in the judged steps."""

    n_instances: int
    n_asymmetric: int = 0
    """Instances where a rank ended before the last arrived (no transfer time)."""
    skew_us: Percentiles = field(default_factory=Percentiles)
    transfer_us: Percentiles = field(default_factory=Percentiles)
    transfer_ms_per_step: float | None = None
    wait_ms_per_step_by_rank: dict[str, float] = {}
    after_last_arrival_ms_per_step_by_rank: dict[str, float] = {}
    straggler_rank: int | None = None
    bytes_p50: float | None = None
    busbw_gbps_p50: float | None = None


class RankReconcile(Record, kw_only=True):
    """One rank's matched collective time against its accounted collective time, ms per step."""

    matched_ms: float
    accounted_ms: float | None = None
    rel_diff: float | None = None
    agree: bool | None = None
    """Within `READINGS_AGREE_REL`; null when there is no accounted time."""
    inside_idle_ms: float | None = None
    """Inside the instances, per step: time with no recorded op."""
    inside_other_ms: float | None = None
    """Inside the instances, per step: other categories' work on the same stream or thread."""


class CollectivesMatched(Record, kw_only=True):
    """Collectives matched across ranks (instances in collective_instances.csv)."""

    world_size: int | None = None
    ranks_present: list[int] = []
    """The ranks whose traces are here."""
    complete: bool | None = None
    """Every rank of the world present, at least two."""
    reason: str | None = None
    """Why nothing was matched, else null."""
    n_instances: int | None = None
    """Instances matched in every step (collective_instances.csv)."""
    steps_used: str | None = None
    """The kind of step the per-step figures below are over (decode when there are any)."""
    n_instances_judged: int | None = None
    """Instances in the `steps_used` steps: the ones the per-step figures sum."""
    n_asymmetric: int | None = None
    transfer_ms_per_step: float | None = None
    """Sum over the judged instances of last arrival to completion, per judged step."""
    wait_ms_per_step: float | None = None
    """Mean over ranks of the time spent waiting for the others, per step. Pooled, like the
    transfer: their sum is a typical rank's and may exceed one rank's time (see the per-rank keys)."""
    wait_ms_per_step_by_rank: dict[str, float | None] | None = None
    """Per rank: its arrival to the last arrival, or to its own end if it left first."""
    after_last_arrival_ms_per_step_by_rank: dict[str, float | None] | None = None
    """Per rank: its own end minus the last arrival (its completion; 0 if it left first)."""
    matched_ms_per_step_by_rank: dict[str, float | None] | None = None
    """Per rank: wait + after, exactly its arrival-to-end time in the matched collectives."""
    reconcile: dict[str, RankReconcile] | None = None
    """Per rank {matched_ms, accounted_ms, rel_diff, agree, inside_idle_ms, inside_other_ms}: the
    matched time against the collective categories' time in the accounting; disagreement beyond
    READINGS_AGREE_REL is flagged. The difference lies inside the instances: time with no recorded
    op (`inside_idle_ms`) and other categories' work (`inside_other_ms`), ms per step."""
    skew_us: Percentiles | None = None
    """Spread of the ranks' start times per instance."""
    transfer_us: Percentiles | None = None
    straggler_rank: int | None = None
    straggler_share: float | None = None
    busbw_gbps: Percentiles | None = None
    clock_flag: ClockFlag | None = None
    """When the ranks' clocks disagree, else null."""
    count_mismatch: dict[str, dict[str, int]] | None = None
    """{category: {rank: calls}} for the categories where ranks issued different counts."""
    by_category: dict[str, CollectiveCategoryStats] | None = None


class RooflineDevice(Record, kw_only=True):
    name: str | None = None
    trace_name: str | None = None
    peak_mem_bw_gbps: float | None = None
    peak_tflops: float | None = None
    known: bool | None = None
    matched_by: str | None = None
    source: str | None = None
    """Where the peaks come from (`stepscope.hardware`, or params `hardware`)."""


class RooflineRow(Record, kw_only=True):
    category: str
    calls_per_step: float | None = None
    """Calls of the category per decode step in the trace."""
    model_gemms_per_step: float | None = None
    flops_per_step: float | None = None
    bytes_per_step: float | None = None
    """Weights at their precision + activations."""
    time_ms_per_step: float | None = None
    """The category's union per decode step."""
    achieved_tflops: float | None = None
    achieved_gbps: float | None = None
    pct_peak_bw: float | None = None
    """Null when the peak is unknown."""
    pct_peak_flops: float | None = None
    gemms: str | None = None
    source: str | None = None
    micro_gbps: float | None = None
    """Stage 02's GB/s on the same GEMMs at the same M, when it ran them."""
    micro_vs_trace: float | None = None


class Roofline(Record, kw_only=True):
    """Per category on the trace: achieved FLOP/s and bytes/s against the device's peaks."""

    device: RooflineDevice = field(default_factory=RooflineDevice)
    reason: str | None = None
    """Why there are no rows, else null."""
    rows: list[RooflineRow] = []


class Flag(Record, kw_only=True, omit_defaults=True):
    """A data-quality flag: a code, a severity, and the values `wording.flag_message` words; an older
    flag has only its `message`, shown as written."""

    code: str
    severity: str
    """`info`, `warning` or `error`."""
    message: str
    """The sentence, as `wording.flag_message` wrote it from the values below when stage 05 ran."""
    rank: int | None = None
    """The rank the flag is about."""
    ranks: list[int] | None = None
    """The ranks present (`ranks_missing`)."""
    world_size: int | None = None
    """The traces' `distributedInfo.world_size`."""
    tp: int | None = None
    """The TP size params give (`tp_disagreement`)."""
    n_steps: int | None = None
    """Steps counted: judged steps (`low_confidence`), steps timed on the device (`period_from_device`)."""
    n_events: int | None = None
    """Events counted: work unattributed, or placed by its own start (`no_launch_events`); events
    dropped (`bad_timestamps`), names cut (`names_capped`), ids unread (`ids_out_of_range`)."""
    step_kind: str | None = None
    """The judged step kind (`low_confidence`)."""
    step_source: str | None = None
    """Where the rank's steps came from (`step_fallback`, `unknown_step_annotation`)."""
    file: str | None = None
    """The trace file's name (`rank_assumed`)."""
    share: float | None = None
    """0-1: the share of kernel time in `other` (`other_share_high`), or of each token with no
    work (`span_below_tpot`)."""
    limit_share: float | None = None
    """0-1: the limit the share is over (`thresholds.OTHER_SHARE_LIMIT`)."""
    names: list[str] | None = None
    """Annotation names no known step form matches (`unknown_step_annotation`)."""
    top_names: list[NamedTime] | None = None
    """The largest names in `other` (`other_share_high`), at most three; the device event
    categories not read, with their events and summed µs (`unread_device_work`)."""
    by_reason: dict[str, int] | None = None
    """{why a work event found no step: events} (`unattributed`)."""
    categories: dict[str, int] | None = None
    """{event category the loader does not know: events ignored} (`unknown_event_category`)."""
    limit_chars: int | None = None
    """The length event names were cut to (`names_capped`: `trace.frames.NAME_CAP_CHARS`)."""
    period_ms: float | None = None
    """The mean decode step period."""
    tpot_ms: float | None = None
    """The mean TPOT the client measured during capture."""
    span_ms: float | None = None
    """The mean decode step span."""
    kernel_sum_ms: float | None = None
    """The mean summed kernel (or op) time per decode step."""
    judgement: str | None = None
    """`tpot_below` or `tpot_above`: which way the TPOT disagrees with the period (`trace.tpot`)."""
    cpu: bool | None = None
    """The trace's work is CPU ops, not device kernels (the sentence says ops, not kernels)."""
    end_offset_ms: dict[str, float] | None = None
    """{rank: the median offset of its matched collectives' ends from the reference rank's (`rank`),
    ms} for the ranks over `thresholds.CLOCK_SKEW_LIMIT_US` (`clock_disagreement`)."""


class CollectiveCalls(Record, kw_only=True):
    name: str
    calls_table: int
    """Calls the text table counts (the whole capture)."""
    calls_trace_in_steps: int
    """Calls the trace holds inside its steps."""


class TextTableCheck(Record, kw_only=True):
    """One `profiler_out` text table against the trace (`trace.text_table`)."""

    file: str
    rank: int | None = None
    rows: int | None = None
    layout: str | None = None
    """`gpu` or `cpu`."""
    self_cpu_total_us: float | None = None
    self_cuda_total_us: float | None = None
    """The footer's totals."""
    trace_kernel_sum_us: float | None = None
    rel_diff: float | None = None
    """(trace kernel sum - Self CUDA total) / Self CUDA total; flagged above 1 %."""
    flag: Flag | None = None
    note: str | None = None
    error: str | None = None
    """Why the table could not be read."""
    collective_calls: list[CollectiveCalls] = []

    def remark(self) -> str:
        """What the report says beside the row."""
        if self.flag is not None:
            return self.flag.message
        return self.error or self.note or ("within 1 %" if self.rel_diff is not None else "")


class TraceSummary(Record, kw_only=True):
    """Stage 05's summary: what other tools and CI checks read. All times are µs unless the
    key says `_ms`."""

    ranks: list[RankSummary]
    """One entry per rank."""
    decode: DecodeSummary
    """The decode summary on the reference rank."""
    collectives_check: CollectivesCheck = field(default_factory=CollectivesCheck)
    """Observed against expected collectives per decode step (2L+1 all-reduces and 1
    all-gather for vLLM at TP>1)."""
    cross_rank: list[CrossRankRow] = []
    """Rows of cross_rank.csv."""
    text_table_check: list[TextTableCheck] = []
    """The `profiler_out` tables against the trace (flagged above 1 %)."""
    flags: list[Flag] = []
    """Data-quality flags."""
    trace_info: TraceInfo | None
    """What the traces are."""
    notes: dict[str, str] = {}
    """{key: what it means, in one sentence}, e.g. `exposed_us`."""
    collectives_matched: CollectivesMatched | None
    """Collectives matched across ranks."""
    roofline: Roofline | None


# --------------------------------------------------------------------------- tables


class DecodeCategoryRow(Row, kw_only=True):
    """Per rank and category over decode steps (all steps when none is labelled decode)."""

    rank: int
    category: str
    class_: str = field(name="class")
    """`compute`, `communication` or `memory`."""
    n_steps: int | None = None
    union_ms_mean: float
    """Per-step busy time of the category, ms: mean over steps."""
    union_ms_median: float | None = None
    union_ms_p90: float | None = None
    sum_ms_mean: float | None = None
    """Summed durations per step (kernels of one category may overlap)."""
    exposed_ms_mean: float | None = None
    """Per-step time no higher-priority class covers."""
    share_of_span: float | None = None
    """union_ms_mean / mean step span, 0-1."""
    share_of_period: float | None = None
    """union_ms_mean / mean step period, 0-1."""
    exposed_share_of_busy: float | None = None
    calls_per_step: float | None = None
    us_per_call: float | None = None
    """sum / calls, µs."""


class KindCategoryRow(Row, kw_only=True):
    """Per rank, step kind and category, over that kind's steps: the kinds side by side, never
    averaged together (a prefill step's all-reduce is not a decode step's)."""

    rank: int
    kind: str
    """The steps' kind (`decode`, `prefill`, `mixed`, `training`, `warmup`, ...), or `verify` for a
    decode step that scores drafted tokens."""
    n_steps: int
    """Steps of this kind with work."""
    category: str
    class_: str = field(name="class")
    union_ms_mean: float
    """The category's busy time per step of this kind, ms (mean over its steps)."""
    exposed_ms_mean: float | None = None
    """Per step of this kind: the part no higher-priority class covers, ms."""
    sum_ms_mean: float | None = None
    """Summed durations per step of this kind, ms."""
    calls_per_step: float | None = None
    busy_ms_mean: float | None = None
    """The kind's steps' busy time (union of all their work), ms per step: the same on each of the kind's rows."""
    span_ms_mean: float | None = None
    """The kind's steps' span (first to last work), ms per step."""


class CategoryKernelRow(Row, kw_only=True):
    """The largest kernels (ops on a CPU trace) of each category, per rank, over the decode
    steps (all steps when none is labelled decode): at most `account.KERNELS_PER_CATEGORY`
    names per category, largest summed time first, categories largest first."""

    rank: int
    category: str
    class_: str = field(name="class")
    name: str
    """The kernel's (or op's) name as the trace gives it."""
    n_steps: int
    count: int
    """Calls over the `n_steps` steps."""
    calls_per_step: float
    sum_ms_per_step: float
    """Summed durations per step, ms (the kernel's own time; overlaps not removed)."""
    us_per_call: float
    share_of_category: float
    """sum / the category's summed time over the same steps, 0-1."""
    n_names: int
    """Distinct names in the category; more than the rows shown when it exceeds the cap."""
    decided_by: str | None = None
    """What put it in the category (most of its calls): `name`, `catch-all`, or `inside <op or
    module>` (e.g. `inside nn.Module: Qwen2RMSNorm`), for the kernels a context rule placed."""
    module: str | None = None
    """The module path holding most of its time (`Qwen2Model/Qwen2DecoderLayer/Qwen2MLP/Linear#2`,
    `trace.modules`); empty on traces without module frames."""
    module_share: float | None = None
    """That module's share of the kernel's summed time, 0-1 (one cuBLAS kernel serving every
    Linear of a model has a small one)."""


class CategoryLeverRow(Row, kw_only=True):
    """Per rank and category over the decode steps (all steps when none is labelled decode):
    what a fix to the category would be a fix to (`account.category_levers`)."""

    rank: int
    category: str
    class_: str = field(name="class")
    n_steps: int
    sum_ms_per_step: float
    """Its kernels' summed durations per step, ms (overlap not removed)."""
    recompute_ms_per_step: float = 0.0
    """The part of it that activation checkpointing reran in the backward pass, ms."""
    n_names: int
    """Distinct kernel (or op) names in it."""
    top_kernels: str
    """Its largest kernels (up to `thresholds.LEVER_TOP_KERNELS`), each `name (share of the
    category's summed time)`, joined by ` | `."""
    top_share: float
    """The share of the category's summed time those kernels hold, 0-1."""
    top_kernel: str
    top_kernel_share: float
    module: str | None = None
    """The module path holding most of the category's time; empty without module frames."""
    module_share: float | None = None
    """That module's share of the category's summed time, 0-1."""
    coherent: bool
    """False for a grab-bag: at least `LEVER_GRAB_BAG_MIN_NAMES` distinct kernels, the largest
    `LEVER_TOP_KERNELS` holding under `LEVER_DOMINANT_SHARE` of its time; no one fix reaches it,
    so it is not named as one lever."""
    why: str
    """The reading behind `coherent`, in words."""


class ModuleRow(Row, kw_only=True):
    """Per rank and module path over the decode steps (all steps when none is labelled decode),
    from the trace's `nn.Module:` frames (`trace.modules`); empty without module frames."""

    rank: int
    path: str
    """Module classes from the outermost in, instance numbers dropped (all decoder layers add up
    in one row); `#k` tells apart a parent's few leaf children of one class by call order
    (`Qwen2MLP/Linear#0`, `#1`, `#2`: gate, up, down in Hugging Face's Qwen2)."""
    module: str
    depth: int
    n_instances: int
    """Module instances on this path (24 for a decoder layer of a 24-layer model)."""
    n_steps: int
    calls_per_step: float
    """Kernels launched with this module innermost, per step."""
    self_ms_per_step: float
    """Summed durations of those kernels per step, ms."""
    sum_ms_per_step: float
    """Summed durations per step of everything under the path, its own included, ms."""
    recompute_ms_per_step: float = 0.0
    """The part of sum_ms_per_step launched inside activation checkpointing's `recompute_fn`
    (the backward pass rerunning the forward), ms."""
    share_of_device: float
    """sum_ms_per_step over the steps' summed device time, 0-1."""
    top_category: str | None = None
    top_category_share: float | None = None
    """The category holding most of the path's summed time, and that share, 0-1."""


class CollectiveSizeRow(Row, kw_only=True):
    """Per rank and collective (the op that issued it, its dtype and message size) over the
    decode steps (all steps when none is labelled decode): calls and one-rank bandwidth
    (`collectives.collective_sizes`)."""

    rank: int
    collective: str
    """The collective as the trace names it (`allreduce`, `broadcast`, `_allgather_base`): the
    kernel's `Collective name`, else the issuing `nccl:` / `c10d::` op, else the kernel name's."""
    category: str
    dtype: str | None = None
    """The kernel's `dtype` arg (`float`, `bfloat16`), else its name's (`..._Sum_bf16...`); None
    where neither says (`ncclDevKernel_Generic` without args)."""
    dtype_source: str | None = None
    """`args` or `kernel name`."""
    nelems: int | None = None
    """`In msg nelems`; None where the trace does not record it."""
    bytes: float | None = None
    """Message size: nelems x element size (an all-gather's output, n x the input)."""
    group_size: int | None = None
    """Ranks in the collective: the kernel's `Group size` arg, else the trace's world size."""
    process_group: str | None = None
    """The kernel's `Process Group Name` arg; None where the trace does not record it."""
    n_steps: int
    calls_per_step: float
    us_per_call_median: float
    """The kernel's duration, median over calls: on one rank it includes waiting for the others."""
    algbw_gbps: float | None = None
    """bytes / us_per_call_median (nccl-tests' algbw), GB/s."""
    busbw_gbps: float | None = None
    """algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather and reduce-scatter, x 1 otherwise
    (nccl-tests' busbw)."""


class StepRow(Row, kw_only=True):
    """One step of one rank."""

    rank: int
    step_id: int
    name: str | None = None
    """The engine's step annotation."""
    source: str | None = None
    label: str | None = None
    """`prefill`, `decode`, `mixed`, `idle` or `unknown`."""
    n_requests: float | None = None
    """From the annotation; -1 = not in it."""
    n_tokens: float | None = None
    prefill_requests: float | None = None
    prefill_tokens: float | None = None
    decode_requests: float | None = None
    decode_tokens: float | None = None
    annotation_ts_us: float | None = None
    annotation_dur_us: float | None = None
    n_events: int
    kernel_sum_us: float
    busy_us: float
    span_us: float
    compute_us: float | None = None
    """Union of compute work; compute_us + comm_exposed_us + memory_exposed_us == busy_us."""
    comm_exposed_us: float | None = None
    """Communication no compute overlaps."""
    memory_exposed_us: float | None = None
    """Copies and sets nothing else overlaps."""
    all_reduce_calls: float | None = None
    all_gather_calls: float | None = None
    other_collective_calls: float | None = None
    first_start_us: float | None = None
    idle_us: float | None = None
    kind: str | None = None
    """`decode`, `prefill`, `mixed`, `training`, `profiler_step`, ..."""
    period_us: float | None = None
    """This step's start to the next step's start: on the host's annotations, or on the
    device (`period_from_device`) where the host's was shorter than the step's busy time."""
    period_from_device: bool | None = None
    """The period is the device's step (first device event to the next step's): the host's
    period was shorter than the device work it launched."""
    between_steps_us: float | None = None
    """period_us - span_us: the part of the period outside the step's device work."""
    period_busy_us: float | None = None
    """Where consecutive steps overlap on the device (median span past the median period): the
    time the device was busy in this step's period, from its first work, with all work (any step's or none's)
    (at most the period); NaN where steps do not overlap, as the step's own busy time then is it."""
    idle_micro_us: float | None = None
    """Gaps between work inside the step, each shorter than `thresholds.MACRO_GAP_US`."""
    idle_macro_us: float | None = None
    """Gaps inside the step of at least `thresholds.MACRO_GAP_US`; the part of the period
    outside the step's span is `between_steps_us`."""
    largest_gap_us: float | None = None
    largest_gap_start_us: float | None = None
    gap_before: str | None = None
    gap_after: str | None = None
    gap_host_call: str | None = None
    gap_host_frame: str | None = None
    """The innermost host frame holding the whole largest gap (a macro gap only)."""
    gap_python_frames: int | None = None
    """Python frames (`python_function`, those stepscope keeps) starting inside the largest gap (a
    macro gap only): any says the profiler's Python tracer ran during it."""
    between_host_frame: str | None = None
    """The innermost host frame holding the device's gap from this step's last work to the next
    step's first (when at least `thresholds.MACRO_GAP_US`): what the host did between steps."""
    launch_delay_us: float | None = None
    """Median launch-to-start delay of the step's kernels (GPU traces)."""


class RankCategoryRow(Row, kw_only=True):
    """Per rank and category over the whole trace, attributed to a step or not."""

    rank: int
    category: str
    class_: str = field(name="class")
    count: int
    sum_us: float
    union_us: float
    exposed_us: float


class CrossRankRow(Row, kw_only=True):
    """Per category: decode time per step across ranks."""

    category: str
    class_: str | None = field(name="class", default=None)
    n_ranks: int | None = None
    ms_per_step_min: float | None = None
    ms_per_step_median: float | None = None
    ms_per_step_max: float | None = None
    min_rank: int | None = None
    max_rank: int | None = None
    transfer_ms_est: float | None = None
    """Collectives: the least-waiting rank's time estimates the transfer."""
    wait_ms_median: float | None = None
    """Collectives: the rest is waiting for other ranks."""
    wait_ms_max: float | None = None
    note: str | None = None


class AmdahlRow(Row, kw_only=True):
    """Per category on the reference rank: the most removing its exposed time could buy."""

    rank: int | None = None
    category: str
    class_: str | None = field(name="class", default=None)
    step_ms: float
    """The step basis: the mean decode step period, or the span (see `denominator`)."""
    denominator: str | None = None
    """`period` or `span`."""
    exposed_ms: float
    speedup_ceiling: float | None
    """step_ms / (step_ms - exposed_ms)."""


class TimelineRow(Row, kw_only=True):
    """The work of the reference rank's decode step of median span."""

    rank: int
    step_id: int
    stream: int | None = None
    """CUDA stream, or CPU thread id."""
    category: str
    class_: str | None = field(name="class", default=None)
    start_us: float
    """From the step's first work."""
    dur_us: float
    name: str | None = None


class CollectiveInstanceRow(Row, kw_only=True):
    """One collective matched across ranks."""

    step_id: int | None = None
    category: str | None = None

