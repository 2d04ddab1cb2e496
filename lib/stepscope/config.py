"""Campaign parameters: YAML in, typed frozen msgspec Structs out.

Validated before anything runs; every error names the file, key path, what was expected and the nearest valid
key. To add a parameter, add a field with a default (and a docstring) to its section's Struct: the validator,
docs/params.md and the notebook contract test pick it up.
"""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping

import msgspec
import yaml
from msgspec import field

from stepscope.errors import ParamsError
# The redaction helpers' home is stepscope.redaction; these names stay importable from here.
from stepscope.redaction import (REDACTED, SECRET_KEY_RE, redact, redact_argv,  # noqa: F401
                                 redact_params_text, redact_text)

# --------------------------------------------------------------------------- schema


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Every params section: frozen once read, and a key it does not know is refused (with
    the nearest valid key as a hint), as a typo must not silently take the default."""


class RunParams(_Section):
    """How a run is named and where it goes."""

    name: str
    """Run-id prefix; the runner appends a timestamp unless --run-id is given."""
    outputs_dir: str = "outputs"
    """Relative paths are resolved from the repository root, not the caller's cwd."""


class TinyModelParams(_Section):
    """A randomly initialised model made locally (nothing downloaded)."""

    arch: Literal["llama", "deepseek_v3"] = "llama"
    """`deepseek_v3`: MLA attention and 64 routed experts (top-8, one shared, the first layer dense),
    the reference model's kind (docs/methods.md#the-tiny-deepseek-v3); kv_heads is then unused (MLA's
    heads all read one latent) and hidden/heads need not be a CPU attention head size."""
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    """hidden/heads is the head size: vLLM's CPU backend needs 32, 64, 80, ... (docs/methods.md#vllm-cpu-backend)."""
    kv_heads: int = 2
    intermediate: int = 256
    vocab_size: int = 2048
    max_position: int = 2048
    seed: int = 0


class ModelParams(_Section):
    path: str | None = None
    """Local model folder (launch mode). Relative paths are from the repository root."""
    served_name: str | None = None
    """The name the server exposes; defaults to `path`."""
    config_json: str | None = None
    """HF `config.json` for the architecture; defaults to `<path>/config.json`."""
    arch_preset: str | None = None
    """Built-in architecture (e.g. `kimi-k2.5`, `deepseek-v3`) when no config.json is at hand."""
    quantization: str = "none"
    """A label for the report, e.g. `compressed-tensors W4A16 g32`."""
    tiny: TinyModelParams | None = None
    """If set, the runner creates this tiny model at `path` when it is missing."""


class ProfilerParams(_Section):
    enabled: bool = True
    """Start the server with the torch profiler configured (needed by stage 04)."""
    dir: str | None = None
    """Where the server writes traces. Launch mode defaults to the run folder."""
    with_stack: bool = False
    """Stacks are 60-90 % of events and made /stop_profile take minutes (docs/methods.md#profiler-capture)."""
    record_shapes: bool = False
    """Input shapes in the trace; costs size, helps GEMM attribution."""
    use_gzip: bool = True


class ServerParams(_Section):
    mode: Literal["launch", "attach"] = "launch"
    """`launch`: start the server from these params; `attach`: use one already running at `url`."""
    engine: Literal["vllm", "sglang"] = "vllm"
    url: str | None = None
    """Attach mode: the server's base URL, e.g. `http://127.0.0.1:8000`."""
    host: str = "127.0.0.1"
    """Bind address. Loopback unless you mean to expose the server."""
    port: int = 8000
    tp: int = 1
    """Tensor-parallel size: one worker (and one trace file) per rank."""
    dtype: str = "bfloat16"
    max_model_len: int | None = None
    enforce_eager: bool = False
    """No CUDA graphs / torch.compile: starts faster; decode then launches kernels one by one."""
    extra_args: tuple[str, ...] = ()
    """Appended verbatim to the server's command line."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the server (e.g. VLLM_CPU_KVCACHE_SPACE). Secret-looking names are redacted."""
    startup_timeout_s: float = 900.0
    """How long to wait for /health before giving up and showing the log tail."""
    api_key_env: str | None = None
    """Name of the environment variable that holds the server's API key. The key itself
    never appears in params, outputs, logs or reports."""
    python: str | None = None
    """Interpreter that runs the server; defaults to the one running stepscope."""
    profiler: ProfilerParams = field(default_factory=ProfilerParams)


class SloParams(_Section):
    """Per-request latency bounds (ms), any subset. A request meets the SLO when it completed
    and every bound set here holds (vLLM's goodput definition; docs/methods.md#goodput-and-slos)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    """(E2EL - TTFT) / (output tokens - 1); a one-token request counts as 0, as vLLM does."""
    itl_ms: float | None = None
    """The request's longest gap between token-bearing chunks (vLLM's goodput has no ITL bound)."""
    e2el_ms: float | None = None
    min_share: float = 0.9
    """The SLO-boundary level is the highest level at which at least this share of requests
    meet the SLO. 0.9, not 0.99: levels of 16-64 requests cannot tell 99 % from 100 % (one
    late request in 16 is 94 %); raise it with sweep.min_requests of several hundred."""


class SloSearchParams(_Section):
    """After the planned levels, bisect between the SLO-boundary level and the first level that
    missed, on concurrency (closed loop) or request rate (open loop), measuring each midpoint as
    one more real level (docs/methods.md#the-slo-search)."""

    max_extra_levels: int = 3
    """Extra levels the search may measure, over both load modes together (concurrency first)."""
    min_rate_step_share: float = 0.05
    """Open loop: stop when the miss's rate is within this share above the boundary's; closed
    loop stops when the two concurrencies are adjacent integers."""


class RampParams(_Section):
    """A request-rate ramp for one extra open-loop level, as `vllm bench serve --ramp-up-strategy`:
    request i of n is sent at rate start + (end - start) i/(n-1) (linear) or
    start (end/start)^(i/(n-1)) (exponential)."""

    strategy: Literal["linear", "exponential"] = "linear"
    start_rps: float = 1.0
    end_rps: float = 4.0
    n_requests: int = 32


class WorkloadParams(_Section):
    """Where `sweep.prompt_mode` sharegpt, mooncake and shared_prefix take their requests
    (file formats: docs/workloads.md)."""

    path: str | None = None
    """sharegpt: a JSON list of conversations; mooncake: a JSONL trace. Relative to the repository root."""
    output_len_from: Literal["file", "fixed"] = "file"
    """`file`: the reply's token count (sharegpt) or `output_length` (mooncake); `fixed`: sweep.output_len."""
    max_input_len: int | None = None
    """Skip file entries with longer prompts (the server's max_model_len bounds prompt + output)."""
    hash_block_tokens: int = 512
    """mooncake: tokens per `hash_ids` entry (512 in the published Mooncake traces)."""
    replay: bool = True
    """mooncake: open-loop levels keep the trace's arrival pattern (its bursts and lulls), its
    gaps scaled to each level's mean rate; false: the sweep's own gamma arrivals."""
    num_prefixes: int = 4
    """shared_prefix: distinct prefixes (system prompts), each followed by distinct suffixes."""
    prefix_len: int = 96
    """shared_prefix: tokens per prefix; the suffix is sweep.input_len - prefix_len tokens."""


class SweepParams(_Section):
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    request_rates: tuple[float, ...] = ()
    """Optional open-loop sweep (requests/s, Poisson arrivals)."""
    input_len: int = 128
    output_len: int = 128
    min_requests: int = 16
    """Requests per level are max(4 x concurrency, min_requests)."""
    warmup_requests: int = 2
    """Unmeasured requests before each level; a closed-loop level sends at least one full
    wave (its concurrency) so each batch size is seen once. 0: no warm-up."""
    request_timeout_s: float = 600.0
    silence_timeout_s: float = 60.0
    """Liveness watchdog: no token on any open stream for this long probes /health, says
    whether the server is alive but not answering, and ends the level with its open requests
    recorded as timeouts (levels.csv `n_timed_out`)."""
    knee_gain: float = 0.10
    """The knee is the first level beyond which no level adds this much output tok/s per
    doubling of concurrency."""
    import_results: tuple[str, ...] = ()
    """`vllm bench serve --save-result` JSON files to show beside this sweep (same table)."""
    prompt_mode: Literal["token_ids", "random_text", "sharegpt", "mooncake", "shared_prefix"] = "token_ids"
    """`token_ids`: prompts of random token IDs from ordinary text. `random_text`: text prompts
    of exact token length built like vLLM's random dataset (`vllm bench serve --dataset-name
    random`), for runs compared with that benchmark; needs the model's tokenizer here.
    `sharegpt`, `mooncake`, `shared_prefix`: requests from `sweep.workload` (docs/workloads.md)."""
    min_level_duration_s: float = 0.0
    """Keep a closed-loop level sending requests until it has run this long (and sent its
    requests); open-loop levels send rate x this many. One server stall then cannot dominate
    a level. 0: request count only."""
    slo: SloParams | None = None
    """Per-request latency bounds: each level's goodput and the SLO-boundary level."""
    slo_search: SloSearchParams | None = None
    """Refine the SLO boundary by bisection with a bounded number of extra levels; needs `sweep.slo`."""
    burstiness: float = 1.0
    """Open-loop gaps are gamma-distributed with this shape (vLLM `--burstiness`): 1 is Poisson,
    below 1 burstier, above 1 more even; the mean rate is unchanged."""
    ramp: RampParams | None = None
    """One extra open-loop level whose request rate ramps (vLLM `--ramp-up-strategy`)."""
    workload: WorkloadParams = field(default_factory=WorkloadParams)
    gpu_telemetry: bool = True
    """Sample NVML (SM and memory clocks, power, temperature, memory, utilisation) every
    0.5 s during each level into gpu_telemetry.csv; without NVML or a GPU, a 'not available' record."""
    percentiles: tuple[float, ...] = (25.0, 50.0, 75.0, 90.0, 95.0, 99.0)
    """Percentiles (0 < p <= 100) of TTFT, TPOT, ITL and E2EL in levels.csv (`<metric>_ms_p<p>`,
    beside mean, median, std, min, max, p90 and p99, which are always there) and in each
    level's `vllm_bench/<level>.vllm.json` (vLLM `--metric-percentiles`)."""


class GemmMicroParams(_Section):
    m_values: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    dtypes: tuple[str, ...] = ("bfloat16",)
    backends: tuple[str, ...] = ("torch", "marlin")
    warmup: int = 3
    repeats: int = 20
    threads: int | None = None
    """CPU timing thread count; fixed so runs compare."""
    presets: tuple[str, ...] = ()
    """Extra architectures to time beside the served model, e.g. `kimi-k2.5`."""
    preset_m_values: tuple[int, ...] = (1, 8)
    """A reduced M grid for the presets' large shapes on slow machines."""
    preset_tp: int | None = None
    """TP size the presets are sharded at; defaults to hardware.gpu_count, else 8 (the
    campaign in docs/methods.md#the-reference-campaign)."""
    graph_calls: int = 50
    """GPU only: GEMM calls captured in one CUDA graph (per-call time = replay time / calls)."""


class CollectiveMicroParams(_Section):
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    world_size: int | None = None
    """Defaults to server.tp."""
    sizes_bytes: tuple[int, ...] = (256, 4096, 14336, 65536, 1048576, 16777216)
    warmup: int = 5
    iters: int = 50
    burst_count: int | None = None
    """All-reduces per burst; defaults to the model's expected count per decode step."""
    burst_batch_sizes: tuple[int, ...] = (1,)
    """Decode batch sizes M for the burst: each all-reduce is M x hidden x dtype bytes."""
    burst_repeats: int = 5
    """Timed bursts per size (median reported)."""
    dtype: str = "bfloat16"
    """Element type of the all-reduced tensors (the model's activations)."""
    timeout_s: float = 300.0
    """Wall-clock limit for all ranks together; a rank still running then is ended and named."""
    nccl_tests_files: tuple[str, ...] = ()
    """nccl-tests results measured elsewhere (stdout text or `-J` JSON), shown beside ours."""


class MicroParams(_Section):
    gemm: GemmMicroParams = field(default_factory=GemmMicroParams)
    collectives: CollectiveMicroParams = field(default_factory=CollectiveMicroParams)


class CaptureParams(_Section):
    warmup_requests: int = 3
    requests: int = 5
    """Sequential batch-1 requests while the profiler runs (the campaign used 5 x 32)."""
    input_len: int = 32
    output_len: int = 32
    wait_timeout_s: float = 600.0
    """How long to wait for every rank's trace file to be complete."""
    silence_timeout_s: float = 60.0
    """Liveness watchdog: a captured or warm-up request that gets no token for this long probes
    /health, and the capture fails saying whether the server is alive but not answering."""
    profiler_dir: str | None = None
    """Attach mode: where the server's trace files can be read from here."""
    concurrency: tuple[int, ...] = (1,)
    """Requests in flight per capture. 1 is the batch-1 capture above (`traces/`); each level
    C > 1 keeps C of the sweep's requests in flight and profiles `load_steps` engine steps
    once all C are past their first token (`c<C>/`)."""
    load_steps: int = 8
    """Engine steps profiled per load level (vLLM's `max_iterations`, SGLang's `num_steps`)."""
    load_delay_steps: int = 2
    """Engine steps let pass after /start_profile before recording (vLLM's `delay_iterations`)."""
    load_window_s: float = 5.0
    """Upper bound on a load level's profiled window, s: the timed window where the engine
    does not stop by itself after `load_steps`, and the longest the load is held waiting."""


class RuleParams(_Section):
    category: str
    pattern: str
    """Python regex, searched in the event name."""
    cat: str | None = None
    """Optional event-category filter, e.g. `kernel` or `cpu_op`."""


class AnalysisParams(_Section):
    trace_paths: tuple[str, ...] = ()
    """Traces captured elsewhere; empty means stage 04's traces."""
    extra_rules: tuple[RuleParams, ...] = ()
    """Category rules tried before the built-in ones."""
    tp: int | None = None
    """Defaults to server.tp."""
    memory_budget_gb: float | None = None
    """Stage 05 stops before parsing when its estimated peak is over this (GB); default 0.8x the
    memory available when it starts."""


class WriteupParams(_Section):
    acceptance_lengths: tuple[float, ...] = (1.5, 2.0, 3.0)
    """What-if: mean tokens accepted per step with speculative decoding."""
    draft_cost_fractions: tuple[float, ...] = (0.05, 0.1, 0.2)
    """What-if: the draft's cost per drafted token, as a fraction of one measured decode step."""
    verify_extra_tokens: int = 1
    """What-if: k = ceil(acceptance length) - 1 + this many drafted tokens per step; a verify
    step scores M = k + 1 tokens per request (the drafts plus the target's own token)."""
    title: str | None = None
    """Report title; defaults to one naming the run."""


class HardwareParams(_Section):
    name: str | None = None
    gpu_count: int | None = None
    peak_mem_bw_gbps: float | None = None
    peak_tflops: float | None = None
    interconnect: str | None = None


class Overrides(dict):
    """A variant's changes to the baseline, shaped like the params file; validated key by key on read so a
    typo fails before anything starts, the merged params again in full."""


# Sections a variant may not override: the run's name and the campaign itself.
VARIANT_FORBIDDEN = ("run", "campaign")


class VariantParams(_Section):
    name: str
    """Folder name of the variant's run under the campaign folder; letters, digits, `-`, `_`, `.`."""
    overrides: Overrides = field(default_factory=Overrides)
    """Changes to the baseline, shaped like the params file (e.g. `server: {tp: 1}`)."""
    description: str | None = None
    """One line for the campaign report, e.g. `n-gram speculative decoding, k=3`."""


class CampaignParams(_Section):
    baseline: str = "baseline"
    """Name of the baseline variant: the params file's own settings, unchanged."""
    variants: tuple[VariantParams, ...] = ()
    """Variants run after the baseline, each a full run with its own server."""
    repeats: int = 1
    """Runs of each variant, interleaved (all variants once, then again); `--repeats` overrides."""


class Params(_Section):
    run: RunParams
    model: ModelParams = field(default_factory=ModelParams)
    server: ServerParams = field(default_factory=ServerParams)
    sweep: SweepParams = field(default_factory=SweepParams)
    micro: MicroParams = field(default_factory=MicroParams)
    capture: CaptureParams = field(default_factory=CaptureParams)
    analysis: AnalysisParams = field(default_factory=AnalysisParams)
    writeup: WriteupParams = field(default_factory=WriteupParams)
    hardware: HardwareParams = field(default_factory=HardwareParams)
    campaign: CampaignParams | None = None
    """Baseline and variants for `stepscope campaign`; `stepscope run` ignores it."""


# --------------------------------------------------------------------------- loading


def load_params(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Params:
    """Read and validate a params file. Raises ParamsError naming file and key."""
    path = Path(path)
    if path.is_dir():
        raise ParamsError("is a directory, not a params file", where=str(path),
                          hint="pass a YAML file, e.g. params/cpu-demo.yaml")
    if not path.is_file():
        raise ParamsError(
            "params file not found",
            where=str(path),
            hint="pass a file from params/, e.g. params/cpu-demo.yaml",
        )
    text = _params_text(path)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as exc:
        raise ParamsError(f"duplicate key {exc.key!r}: YAML keeps only the last value",
                          where=f"{path}:{exc.line}", hint="remove one of the two entries") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ParamsError(f"not valid YAML: {getattr(exc, 'problem', exc)}", where=where,
                          hint="check indentation and quoting on that line") from None
    if data is None:
        data = {}
    if overrides:
        data = deep_merge(data, overrides)
    return params_from_dict(data, source=str(path))


# A params file is a page of YAML; a larger one is a mistake (a trace, a log) that YAML would
# otherwise chew on for minutes.
MAX_PARAMS_BYTES = 1 << 20


def _params_text(path: Path) -> str:
    """The file's text, refused past `MAX_PARAMS_BYTES` or when it is not UTF-8."""
    size = path.stat().st_size
    if size > MAX_PARAMS_BYTES:
        raise ParamsError(f"is {size:,} bytes, over the {MAX_PARAMS_BYTES:,}-byte limit for a params file",
                          where=str(path), hint="a params file is a short YAML file, e.g. params/cpu-demo.yaml")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ParamsError(f"is not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} cannot be decoded",
                          where=str(path), hint="save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)") from None


def params_from_dict(data: Any, source: str = "<params>") -> Params:
    _check_finite(data, "", source)
    params = _convert(Params, data, "", source)
    _check_ranges(params, source)
    _check_campaign(params.campaign, source)
    _check_run_section(params.run, source)
    _check_cross_fields(params, source)
    return params


def _check_run_section(run: RunParams, source: str) -> None:
    """`run.name` starts every run id, so it is held to a run id's rules (one safe path
    segment: an empty name once gave ids starting with '-', which `lab` read as an option);
    `outputs_dir` must name a folder."""
    from stepscope.runfolder import RUN_ID_CHARS, RUN_ID_RE

    if not RUN_ID_RE.fullmatch(run.name) or len(run.name) > 100:
        raise _fail(source, "run.name", f"{run.name!r} cannot start a run id: it must be one path segment "
                    f"of {RUN_ID_CHARS}, at most 100 characters (a timestamp is appended)",
                    "e.g. name: cpu-demo")
    if not run.outputs_dir.strip():
        raise _fail(source, "run.outputs_dir", "is empty", "e.g. outputs_dir: outputs")


class DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: str, line: int):
        super().__init__(f"duplicate key {key!r} on line {line}")
        self.key, self.line = key, line


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding one key twice (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise DuplicateKeyError(str(key), key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def deep_merge(base: Any, over: Mapping[str, Any]) -> dict:
    """Merge `over` into a copy of `base`, recursing into mappings."""
    out = dict(base) if isinstance(base, Mapping) else {}
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def params_to_dict(params: Any) -> Any:
    """Plain dict/list form of a params object, for YAML/JSON and for the fingerprints that
    `--resume` compares: fields in declaration order, tuples as lists (msgspec keeps tuples)."""
    return _lists(msgspec.to_builtins(params))


def _lists(obj: Any) -> Any:
    if isinstance(obj, (list, tuple)):
        return [_lists(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _lists(v) for k, v in obj.items()}
    return obj


def iter_leaf_keys(cls: type = Params, prefix: str = "") -> list[str]:
    """Every leaf key path of the schema (`server.profiler.with_stack`, ...)."""
    keys: list[str] = []
    for f in msgspec.structs.fields(cls):
        path = f"{prefix}{f.name}"
        inner = _struct_in(f.type)
        if inner is not None and inner not in _LIST_SECTIONS:
            keys.extend(iter_leaf_keys(inner, path + "."))
        else:
            keys.append(path)
    return keys


# --------------------------------------------------------------------------- ranges

# (lowest, highest) allowed for a number, or for every item of a list of numbers. `>0` marks a
# strict lower bound of zero. Every count, size and duration has a ceiling far past any real run,
# so that a typo (concurrency 1e8, min_requests 1e12) is refused up front, not run for days.
# Keys not listed take any value of their type; NaN and Inf are refused everywhere (`_check_finite`).
_NONNEG = (0, None)
MAX_COUNT = 1_000_000          # requests, repeats, iterations, steps
MAX_TOKENS = 10_000_000        # tokens in one prompt or reply
MAX_DURATION_S = 7 * 86_400.0  # timeouts and windows
MAX_WORKERS = 100_000          # concurrency, ranks, GPUs
MAX_RATE_RPS = 1_000_000.0
_COUNT, _TOKENS, _WORKERS = (1, MAX_COUNT), (1, MAX_TOKENS), (1, MAX_WORKERS)
_DURATION, _NONNEG_COUNT = (">0", MAX_DURATION_S), (0, MAX_COUNT)
LIMITS: dict[str, tuple[Any, Any]] = {
    **{f"model.tiny.{k}": (1, MAX_TOKENS) for k in ("layers", "hidden", "heads", "kv_heads", "intermediate",
                                                    "vocab_size", "max_position")},
    "model.tiny.seed": _NONNEG,
    "server.port": (1, 65535), "server.tp": _WORKERS, "server.max_model_len": _TOKENS,
    "server.startup_timeout_s": _DURATION,
    "sweep.concurrency": _WORKERS, "sweep.request_rates": (">0", MAX_RATE_RPS), "sweep.input_len": _TOKENS,
    "sweep.output_len": _TOKENS, "sweep.min_requests": _COUNT, "sweep.warmup_requests": _NONNEG_COUNT,
    "sweep.request_timeout_s": _DURATION, "sweep.silence_timeout_s": _DURATION, "sweep.knee_gain": (">0", 100),
    "sweep.min_level_duration_s": (0, MAX_DURATION_S), "sweep.percentiles": (">0", 100),
    **{f"sweep.slo.{k}": (">0", MAX_DURATION_S * 1000) for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")},
    "sweep.slo.min_share": (">0", 1), "sweep.burstiness": (">0", 1000),
    "sweep.slo_search.max_extra_levels": (1, 20), "sweep.slo_search.min_rate_step_share": (">0", 1),
    "sweep.ramp.start_rps": (">0", MAX_RATE_RPS), "sweep.ramp.end_rps": (">0", MAX_RATE_RPS),
    "sweep.ramp.n_requests": (2, MAX_COUNT),
    "sweep.workload.max_input_len": _TOKENS, "sweep.workload.hash_block_tokens": _TOKENS,
    "sweep.workload.num_prefixes": _COUNT, "sweep.workload.prefix_len": _TOKENS,
    "micro.gemm.m_values": _TOKENS, "micro.gemm.warmup": _NONNEG_COUNT, "micro.gemm.repeats": _COUNT,
    "micro.gemm.threads": (1, 4096), "micro.gemm.preset_m_values": _TOKENS,
    "micro.gemm.preset_tp": _WORKERS, "micro.gemm.graph_calls": _COUNT,
    "micro.collectives.world_size": _WORKERS, "micro.collectives.sizes_bytes": (1, 1 << 40),
    "micro.collectives.warmup": _NONNEG_COUNT, "micro.collectives.iters": _COUNT,
    "micro.collectives.burst_count": _COUNT, "micro.collectives.burst_batch_sizes": _TOKENS,
    "micro.collectives.burst_repeats": _COUNT, "micro.collectives.timeout_s": _DURATION,
    "capture.warmup_requests": _NONNEG_COUNT, "capture.requests": _COUNT, "capture.input_len": _TOKENS,
    "capture.output_len": _TOKENS, "capture.wait_timeout_s": _DURATION, "capture.silence_timeout_s": _DURATION,
    "capture.concurrency": _WORKERS, "capture.load_steps": _COUNT, "capture.load_delay_steps": _NONNEG_COUNT,
    "capture.load_window_s": _DURATION,
    "analysis.tp": _WORKERS, "analysis.memory_budget_gb": (">0", 1 << 20),
    "writeup.acceptance_lengths": (1, 1000), "writeup.draft_cost_fractions": (0, 1000),
    "writeup.verify_extra_tokens": (0, MAX_TOKENS),
    "hardware.gpu_count": _WORKERS, "hardware.peak_mem_bw_gbps": (">0", 1e9), "hardware.peak_tflops": (">0", 1e9),
}


def _check_range(key_path: str, value: Any, source: str) -> None:
    limits = LIMITS.get(key_path)
    if limits is None or value is None:
        return
    items = list(enumerate(value)) if isinstance(value, tuple) else [(None, value)]
    lo, hi = limits
    for i, v in items:
        where = key_path if i is None else f"{key_path}[{i}]"
        bad = ((lo == ">0" and v <= 0) or (isinstance(lo, (int, float)) and v < lo)
               or (hi is not None and v > hi))
        if bad:
            low = "greater than 0" if lo == ">0" else f"at least {_bound(lo)}"
            want = (f"between {_bound(lo)} and {_bound(hi)}" if lo != ">0" and hi is not None else
                    f"{low} and at most {_bound(hi)}" if hi is not None else low)
            raise _fail(source, where, f"must be {want}, got {v!r}")


def _bound(x: float) -> str:
    """A limit as a reader types it: 1,000,000 rather than 1e+06."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"


def _check_finite(data: Any, key_path: str, source: str) -> None:
    """NaN and Inf anywhere in the raw params (overrides included): `.nan` never times out and
    fails no comparison, so no range could refuse it."""
    if isinstance(data, float) and not math.isfinite(data):
        raise _fail(source, key_path, f"must be a finite number, got {data!r}")
    if isinstance(data, Mapping):
        for k, v in data.items():
            _check_finite(v, _join(key_path, str(k)), source)
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            _check_finite(v, _item_path(key_path, i, v), source)


def _check_cross_fields(params: "Params", source: str) -> None:
    """Rules that span keys: what one key alone cannot say."""
    if not params.sweep.concurrency and not params.sweep.request_rates:
        raise _fail(source, "sweep.concurrency",
                    "is empty, and so is sweep.request_rates: the sweep would measure nothing",
                    "list at least one concurrency, e.g. [1, 2, 4], or one request rate")
    _check_sweep_workload(params.sweep, source)


def _check_sweep_workload(sw: "SweepParams", source: str) -> None:
    """The SLO, its search and the workload sources: keys that only make sense together."""
    if sw.slo is not None and all(getattr(sw.slo, k) is None for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")):
        raise _fail(source, "sweep.slo", "sets no bound", "give at least one of ttft_ms, tpot_ms, itl_ms, e2el_ms")
    if sw.slo_search is not None and sw.slo is None:
        raise _fail(source, "sweep.slo_search", "needs sweep.slo: the search refines the SLO boundary",
                    "set sweep.slo (e.g. tpot_ms: 50) or remove sweep.slo_search")
    if sw.prompt_mode in ("sharegpt", "mooncake") and not sw.workload.path:
        raise _fail(source, "sweep.workload.path", f"is needed by prompt_mode {sw.prompt_mode}",
                    "e.g. params/workloads/sharegpt_sample.json or params/workloads/mooncake_sample.jsonl")
    if sw.prompt_mode == "shared_prefix" and sw.workload.prefix_len >= sw.input_len:
        raise _fail(source, "sweep.workload.prefix_len",
                    f"is {sw.workload.prefix_len}, not below sweep.input_len {sw.input_len}: no room for a suffix",
                    "lower prefix_len or raise input_len")


# --------------------------------------------------------------------------- validator

# Sections that come as lists: one row in the docs table, not one per field.
_LIST_SECTIONS = (RuleParams, VariantParams)
_VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

_FLOAT_LIKE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
# msgspec's error: "<what> - at `$.sweep.concurrency[1]`", or "... - at `key` in `$.server`"
# for a mapping key that is not a string, or no location at the top level.
_MSGSPEC_ERROR = re.compile(r"^(?P<what>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.S)
_MSGSPEC_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_ABSENT = object()


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _struct_in(tp: Any) -> type | None:
    """The section a field holds: itself, or beside null."""
    if _is_struct(tp):
        return tp
    return next((a for a in typing.get_args(tp) if _is_struct(a)), None)


def _field_types(cls: type) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(cls)}


def _without_null(tp: Any) -> Any:
    """`X | None` is X where a value is given (a null never fails); other unions stay."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping of strings"
    if _is_struct(tp):
        return "a mapping (section)"
    if tp is Overrides:
        return "a mapping shaped like the params file"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _fail(source: str, key_path: str, message: str, hint: str | None = None) -> ParamsError:
    return ParamsError(message, where=f"{source}: {key_path or '<top level>'}", hint=hint)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _item_path(key_path: str, i: int, value: Any) -> str:
    """`campaign.variants[1:spec-ngram]`: list items that carry a name are named in errors."""
    name = value.get("name") if isinstance(value, Mapping) else None
    return f"{key_path}[{i}:{name}]" if isinstance(name, str) else f"{key_path}[{i}]"


def _dec_hook(tp: type, value: Any) -> Any:
    """msgspec builds every type but `Overrides`, whose keys `_check_overrides` checks."""
    if tp is Overrides and isinstance(value, Mapping):
        return Overrides(value)
    raise TypeError(f"expected {_type_name(tp)}")


def _convert(tp: Any, data: Any, key_path: str, source: str) -> Any:
    """`data` as `tp`, decoded by msgspec strictly, except that `8.0` passes as an integer and numbers in a
    mapping of strings become strings (repaired in a copy, then retried); other errors become ParamsErrors."""
    for _ in range(10_000):  # each repair fixes at least one value
        try:
            out = msgspec.convert(data, tp, strict=True, dec_hook=_dec_hook)
        except msgspec.ValidationError as exc:
            data = _repaired_or_raise(tp, data, str(exc), key_path, source)
            continue
        for path in _set_paths(data):
            at_tp, value, _, where = _locate(tp, data, path, key_path)
            if at_tp is not Any:
                raise _mismatch(_without_null(at_tp), value, where, source)
        return out
    raise _fail(source, key_path, "could not be read")  # pragma: no cover - a repair always fixes one


def _set_paths(data: Any, path: str = "") -> Iterator[str]:
    """Where `data` holds a set (YAML `!!set`), in msgspec's path form. msgspec takes a set for
    a list, but a set has no order, so a list key refuses one (an override's raw value
    is checked when its leaf is)."""
    if isinstance(data, (set, frozenset)):
        yield path
    elif isinstance(data, Mapping):
        for k, v in data.items():
            yield from _set_paths(v, f"{path}.{k}")
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            yield from _set_paths(v, f"{path}[{i}]")


def _locate(tp: Any, data: Any, path: str, key_path: str) -> tuple[Any, Any, list, str]:
    """Follow msgspec's `path` (`.name`, `[3]`, `[...]` for a dict value) through the types and
    the data: (type there, value there, steps taken, our key path). A dict value's step stops
    at the dict, whose key msgspec does not say."""
    value, steps = data, []
    for name, index in _MSGSPEC_STEP.findall(path):
        tp = _without_null(tp)
        if index == "...":
            break
        steps.append(int(index) if index else name)
        if index:
            item = value[int(index)] if isinstance(value, (list, tuple)) and int(index) < len(value) else _ABSENT
            args = typing.get_args(tp)
            tp, key_path = args[0] if args else Any, _item_path(key_path, int(index), item)
        else:
            item = value.get(name, _ABSENT) if isinstance(value, Mapping) else _ABSENT
            tp, key_path = _field_types(tp).get(name, Any) if _is_struct(tp) else Any, _join(key_path, name)
        value = item
    return tp, value, steps, key_path


def _repaired_or_raise(tp: Any, data: Any, error: str, key_path: str, source: str) -> Any:
    m = _MSGSPEC_ERROR.match(error)
    what, path = m.group("what"), m.group("path") or ""
    at_tp, value, steps, where = _locate(tp, data, path, key_path)
    at_tp = _without_null(at_tp)
    if typing.get_origin(at_tp) is dict and isinstance(value, Mapping):
        return _with(data, steps, _env_strings(value, where, source))
    if at_tp is int and isinstance(value, float) and value.is_integer():
        return _with(data, steps, int(value))
    raise _explain(at_tp, value, what, m.group("key") is not None, where, source)


def _with(data: Any, steps: list, new: Any) -> Any:
    """A copy of `data` with the value at `steps` replaced; the input stays as it was read."""
    if not steps:
        return new
    head, rest = steps[0], steps[1:]
    if isinstance(data, Mapping):
        return {**data, head: _with(data[head], rest, new)}
    items = list(data)
    items[head] = _with(items[head], rest, new)
    return items


def _env_strings(env: Mapping, key_path: str, source: str) -> dict[str, str]:
    """A mapping of strings (`server.env`): numbers become strings; what is not a scalar, or
    is a YAML bool or null (which a variable cannot hold unquoted), is refused."""
    out = {}
    for k, v in env.items():
        if isinstance(v, bool) or v is None or isinstance(v, (list, dict)):
            raise _fail(source, f"{key_path}.{k}", f"expected a string, got {v!r}", "quote the value, e.g. \"1\"")
        out[str(k)] = str(v)
    return out


def _explain(tp: Any, value: Any, what: str, bad_key: bool, key_path: str, source: str) -> ParamsError:
    """A msgspec error at `key_path` as this module words it: an unknown key with the
    nearest valid one, a missing value with where to add it, else what was expected."""
    if what.startswith("Object contains unknown field") or (bad_key and _is_struct(tp)):
        key = what.split("`")[1] if not bad_key else next(str(k) for k in value if not isinstance(k, str))
        fields = list(_field_types(tp))
        near = difflib.get_close_matches(key, fields, n=1, cutoff=0.5)
        hint = f"did you mean '{near[0]}'?" if near else f"valid keys here: {', '.join(fields)}"
        return _fail(source, _join(key_path, key), "unknown key", hint)
    if what.startswith("Object missing required field") and _is_struct(tp):
        name = what.split("`")[1]
        return _fail(source, _join(key_path, name), f"missing required value ({_type_name(_field_types(tp)[name])})",
                     f"add '{name}:' under '{key_path or 'the top level'}'")
    if value is _ABSENT:  # pragma: no cover - msgspec names a place the data does not have
        return _fail(source, key_path, what)
    return _mismatch(tp, value, key_path, source)


def _mismatch(tp: Any, value: Any, key_path: str, source: str) -> ParamsError:
    """`value` is not a `tp`: say what was expected, with a hint where one helps."""
    origin, got = typing.get_origin(tp), f"got {value!r}"
    hint = None
    if origin is Literal:
        near = difflib.get_close_matches(str(value), [str(a) for a in typing.get_args(tp)], n=1)
        hint = f"did you mean '{near[0]}'?" if near else None
    elif origin in (tuple, list):
        hint = f"write it as a YAML list, e.g. [{value!r}]"
    elif _is_struct(tp):
        got = f"got {type(value).__name__} {value!r}"
    elif tp is Overrides:
        hint = "e.g. overrides: {server: {tp: 1}}"
    elif tp is str:
        hint = "quote the value"
    elif tp is float and isinstance(value, str) and _FLOAT_LIKE.match(value.strip()):
        # PyYAML (YAML 1.1) reads 1e-3 as the *string* "1e-3"; refuse it rather than guess.
        got = f"got the string {value!r}"
        hint = (f"YAML reads {value} as text; write it with a dot and a signed exponent, "
                f"e.g. {float(value):.1e}".replace("e-0", "e-").replace("e+0", "e+"))
    return _fail(source, key_path, f"expected {_type_name(tp)}, {got}", hint)


def _check_ranges(params: Params, source: str) -> None:
    """Every key of `LIMITS`, in the order the schema lists them."""
    for key in iter_leaf_keys():
        if key in LIMITS:
            value: Any = params
            for name in key.split("."):
                value = getattr(value, name) if value is not None else None
            _check_range(key, value, source)


def _check_campaign(c: CampaignParams | None, source: str) -> None:
    """What the types cannot say about a campaign: each variant's overrides key by key, its
    name as a folder name, and names used once."""
    if c is None:
        return
    for i, v in enumerate(c.variants):
        item = f"campaign.variants[{i}:{v.name}]"
        _check_overrides(Params, v.overrides, f"{item}.overrides", source)
        if not _VARIANT_NAME.match(v.name):
            raise _fail(source, f"{item}.name", f"variant name {v.name!r} cannot name a folder",
                        "use letters, digits, '-', '_' or '.', e.g. spec-ngram")
    _check_variant_names(c, "campaign", source)


def _check_variant_names(c: CampaignParams, key_path: str, source: str) -> None:
    seen = {c.baseline}
    for i, v in enumerate(c.variants):
        if v.name in seen:
            raise _fail(source, f"{key_path}.variants[{i}:{v.name}].name",
                        f"variant name {v.name!r} is used twice (the baseline is {c.baseline!r})",
                        "give every variant its own name: it names the variant's run folder")
        seen.add(v.name)
    if c.repeats < 1:
        raise _fail(source, f"{key_path}.repeats", f"expected at least 1 run per variant, got {c.repeats}")


def _check_overrides(cls: type, value: Any, key_path: str, source: str) -> None:
    """Check a variant's overrides key by key against the schema; leaves are type-checked."""
    if not isinstance(value, Mapping):
        raise _mismatch(Overrides, value, key_path, source)
    types_ = _field_types(cls)
    for key, sub in value.items():
        path = _join(key_path, str(key))
        if cls is Params and key in VARIANT_FORBIDDEN:
            raise _fail(source, path, f"a variant cannot override '{key}'",
                        "the campaign names every variant's run itself; move this key to the baseline")
        if key not in types_:
            near = difflib.get_close_matches(str(key), list(types_), n=1, cutoff=0.5)
            hint = f"did you mean '{near[0]}'?" if near else f"valid keys here: {', '.join(sorted(types_))}"
            raise _fail(source, path, "unknown key", hint)
        inner = _struct_in(types_[key])
        if inner is not None and inner not in _LIST_SECTIONS and isinstance(sub, Mapping):
            _check_overrides(inner, sub, path, source)
        else:
            _convert(types_[key], sub, path, source)


def variant_params_dict(base: Mapping[str, Any], variant: VariantParams | None) -> dict:
    """The params file of one variant: the baseline with the variant's overrides merged in,
    and no campaign section (each variant is a plain run)."""
    merged = deep_merge(base, variant.overrides) if variant is not None else dict(base)
    merged.pop("campaign", None)
    return merged


# --------------------------------------------------------------------------- reference docs


def schema_reference() -> list[tuple[str, str, str, str]]:
    """(key path, type, default, doc) for every leaf key: docs/params.md's table, docs read from the field
    literals (`stepscope.fielddocs`)."""
    from stepscope.fielddocs import field_doc

    rows: list[tuple[str, str, str, str]] = []

    def walk(cls: type, prefix: str) -> None:
        for f in msgspec.structs.fields(cls):
            inner = _struct_in(f.type)
            if inner is not None and inner not in _LIST_SECTIONS:
                walk(inner, f"{prefix}{f.name}.")
                continue
            if f.default is not msgspec.NODEFAULT:
                default = repr(params_to_dict(f.default))
            elif f.default_factory is not msgspec.NODEFAULT:
                default = repr(params_to_dict(f.default_factory()))
            else:
                default = "required"
            rows.append((f"{prefix}{f.name}", _type_name(f.type), default, field_doc(cls, f.name)))

    walk(Params, "")
    return rows


def schema_reference_markdown() -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, tp, default, doc in schema_reference():
        lines.append(f"| `{key}` | {tp} | `{default}` | {doc.replace('|', '/')} |")
    return "\n".join(lines)


PARAMS_TABLE_MARKERS = ("<!-- PARAMS-TABLE:BEGIN -->\n", "<!-- PARAMS-TABLE:END -->")


def update_params_table(path: str | Path = "docs/params.md") -> None:
    """Rewrite docs/params.md's table from the schema (`python -m stepscope.config`)."""
    from stepscope.fielddocs import rewrite_between

    rewrite_between(path, PARAMS_TABLE_MARKERS, schema_reference_markdown())


if __name__ == "__main__":
    import sys

    # The module imported by name: run as __main__, its classes would not be found under
    # stepscope.config, where stepscope.fielddocs reads their field docs.
    from stepscope.config import update_params_table as _update

    _update(sys.argv[1] if len(sys.argv) > 1 else "docs/params.md")
