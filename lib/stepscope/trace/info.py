"""What a trace is before it is judged: kind of steps, engine, device, batch, world size, TP.

Read from the traces themselves, never from the analysing machine; method:
docs/trace-analysis.md#what-the-trace-is.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stepscope.thresholds import GRAPH_REPLAY_MIN_SHARE, LOW_CONFIDENCE_STEPS
from stepscope.trace.account import in_steps
from stepscope.trace.load import LAUNCH_CATS as LAUNCH_CATS_INFO
from stepscope.trace.step_sources import EXCLUDED_KINDS
from stepscope.trace.steps import TRAINING_ANN, TRAINING_KERNEL, WHOLE_TRACE
from stepscope.wording import short_name
from stepscope.trace.codes import count_codes, in_values, used_values

_SGLANG_NAMES = re.compile(r"^step\[|sglang|sgl_kernel|sgl::", re.I)
_VLLM_NAMES = re.compile(r"^execute_(?:context|new|\d+_context)|vllm::|^_C::", re.I)
SHAPE_SCAN_MAX_BYTES = 32 << 20
"""A trace file this small (on disk) may be read a second time for input shapes, which the
slim event table does not keep, to tell a prefill from a decode pass in `ProfilerStep`s."""


def detect_engine(ev: pd.DataFrame, meta: dict[str, Any]) -> str:
    """`sglang`, `vllm` or `unknown`, from annotations and names (SGLang's `step[...]` wins:
    an SGLang capture can carry a vLLM-style `execute_...` annotation too)."""
    # the distinct names only: a str per row of a kernel-dense trace cost ~70 bytes per event
    names = pd.Series(used_values(ev["name"]), dtype=object).astype(str)
    if names.str.contains(_SGLANG_NAMES).any():
        return "sglang"
    if meta.get("vllm_version") or names.str.contains(_VLLM_NAMES).any():
        return "vllm"
    return "unknown"


def input_token_shape(path: str | Path) -> tuple[int, int] | None:
    """(batch, sequence) of the first `aten::embedding` input in a small trace, or None: it tells a prefill
    ([16, 559]) from a decode ([B, 1]) where no annotation does."""
    p = Path(path)
    if not p.is_file() or p.stat().st_size > SHAPE_SCAN_MAX_BYTES:
        return None
    opener = gzip.open if p.name.endswith(".gz") else open
    try:
        with opener(p, "rt") as fh:
            data = json.load(fh)
    except (OSError, ValueError, EOFError):
        return None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    for e in events or ():
        if isinstance(e, dict) and e.get("name") == "aten::embedding":
            dims = (e.get("args") or {}).get("Input Dims") or []
            if len(dims) > 1 and isinstance(dims[1], list) and len(dims[1]) == 2:
                return int(dims[1][0]), int(dims[1][1])
    return None


# What each kind of trace carries in plain sight: capture annotations and graph calls, non-LLM model classes,
# an LLM's decoder layers or causal-LM head.
_CAPTURE_ANN = re.compile(r"^capture_\d+_\w+$|CUDAGraphNode\.record")
_CAPTURE_CALL = re.compile(r"^(?:cuda|hip)(?:StreamBeginCapture|GraphInstantiate)")
_CAPTURE_FRAME = re.compile(r"\): (?:_capture_cudagraphs|capture_model|compile_or_warm_up_model|"
                            r"capture_one_batch_size|capture_begin)$")
_DIFFUSION_ANN = re.compile(r"^execute_diffusion|^denois", re.I)
_DIFFUSION_MODULE = re.compile(r"^(?:UNet\d?D\w*|\w*Transformer[23]DModel|AutoencoderKL\w*|VQModel|"
                               r"UpDecoderBlock2D|ResnetBlock2D|ControlNet\w*)$")
_DENOISER_MODULE = re.compile(r"^(?:UNet\d?DConditionModel|UNet2DModel|\w*Transformer[23]DModel)$")
_VISION_MODULE = re.compile(r"^(?:ViT|DeiT|Beit|Swin|ConvNext|ResNet|RegNet|EfficientNet|MobileNet|"
                            r"CLIPVision|SiglipVision|Dinov2|Owlv2Vision|OwlViTVision|Timesformer|Detr|Yolos)"
                            r"\w*Model$", re.I)
_ENCODER_MODULE = re.compile(r"^(?:Bert|Roberta|XLMRoberta|DistilBert|Electra|Albert|Deberta\w*|MPNet|"
                             r"CLIPText|T5Encoder|UMT5Encoder)\w*(?:Model|Transformer)$")
# A vision model's head class names its task; without module frames, 2-D convolutions beside 2-D pooling are a
# CNN's (a VAE convolves without pooling). GPU traces drop pooling ops, so pooling is read off the kernels.
_VISION_HEAD = re.compile(r"\w+For(?:ObjectDetection|ImageClassification|SemanticSegmentation|"
                          r"InstanceSegmentation|UniversalSegmentation|DepthEstimation|VideoClassification)$")
_CONV2D_OP = re.compile(r"^aten::conv2d$")
_POOL2D_OP = re.compile(r"^aten::(?:max_pool2d|avg_pool2d|adaptive_avg_pool2d|adaptive_max_pool2d)$")
_POOL_KERNEL = re.compile(r"max_?pool|avg_?pool|average_pool|pooling", re.I)
_LLM_MODULE = re.compile(r"DecoderLayer$|ForCausalLM$|^GPT2Block$|^GPTNeoXLayer$")
_GPU_LIBRARY_OP = re.compile(r"^(?:nccl|rccl):|^(?:cuda|hip)[A-Z]\w*$|^c10d::.*nccl", re.I)
"""A host op that only a GPU job runs: an NCCL/RCCL collective's annotation, a CUDA or HIP
runtime call."""
EVIDENCE_SHOWN = 4
"""Names listed per kind of evidence (a count says how many there were)."""


def _module_classes(ev: pd.DataFrame) -> pd.Series:
    """How often each nn.Module class ran: `nn.Module: SD3Transformer2DModel_0` counts for
    `SD3Transformer2DModel` (each forward call is one frame)."""
    names = ev.loc[ev["cat"] == "python_function", "name"].astype(str)
    mods = names[names.str.startswith("nn.Module: ")].str.slice(11).str.replace(r"_\d+$", "", regex=True)
    return mods.value_counts()


def _hits(names: pd.Series, pattern: re.Pattern[str], what: str) -> list[str]:
    """"<what> `<name>` (×n)" for the names matching, most frequent first. The pattern is searched
    once per distinct name: a host op's name recurs thousands of times."""
    matched = [n for n in names.unique() if pattern.search(n)]
    if not matched:
        return []
    counts = names[names.isin(matched)].value_counts()
    return [f"{what} `{n}`" + (f" ×{int(c)}" if c > 1 else "") for n, c in counts.head(EVIDENCE_SHOWN).items()]


_KERNEL_BASE = re.compile(r"^(?:void\s+)?(?:[\w\s()]*::)*(\w+)")
"""A kernel's base name: `void at::native::(anonymous namespace)::max_pool_forward_nchw<float,
float>(int, ...)` is `max_pool_forward_nchw` (namespaces, template and arguments dropped)."""


def _kernel_name_counts(ev: pd.DataFrame) -> pd.Series:
    """Kernels per distinct name (those that ran). On a Categorical, its codes counted
    (`codes.count_codes`): the kernel rows' copy and its index were ~10 bytes a kernel (issue 26)."""
    name, kern = ev["name"], (ev["cat"] == "kernel").to_numpy()
    if not isinstance(name.dtype, pd.CategoricalDtype):
        counts = name[kern].value_counts()
        return counts[counts > 0]
    codes = name.array.codes
    kern = kern & (codes >= 0)  # a kernel with no name counts for none
    tally = count_codes(codes, len(name.array.categories), kern)
    counts = pd.Series(tally, index=name.array.categories)
    return counts[counts > 0].sort_values(ascending=False, kind="stable")


def _kernel_hits(ev: pd.DataFrame, pattern: re.Pattern[str]) -> list[str]:
    """"kernel `<base name>` (×n)" for the kernels matching, most frequent first: counted per
    distinct name (a device-dense trace's kernel rows are not copied), then by base name."""
    counts = _kernel_name_counts(ev)
    names = counts.index.astype(str)
    hit = counts[names.str.contains(pattern)]
    if hit.empty:
        return []
    base = [short_name(m.group(1) if (m := _KERNEL_BASE.match(n)) else n) for n in hit.index.astype(str)]
    by_base = hit.groupby(base, sort=False).sum().sort_values(ascending=False, kind="stable")
    return [f"kernel `{n}`" + (f" ×{int(c)}" if c > 1 else "") for n, c in by_base.head(EVIDENCE_SHOWN).items()]


def kind_evidence(ev: pd.DataFrame) -> dict[str, list[str]]:
    """What one rank's events say about its kind, by kind (`capture`, `training`, `diffusion`, `vision`,
    `encoder`, `llm`): readable findings, empty kinds left out. `model_passes` counts the denoiser's forward
    calls, several per profiler step."""
    # only the host rows are read: a device-dense trace's kernel names are not copied
    host = ~in_values(ev["cat"], ("kernel", "gpu_memcpy", "gpu_memset"))
    names = ev["name"][host].astype(str)
    cat = ev["cat"][host]
    ann = names[cat.isin(("user_annotation", "gpu_user_annotation"))]
    mods = _module_classes(ev)
    mod_names = pd.Series(mods.index.astype(str), dtype=object)

    def modules(pattern: re.Pattern[str]) -> list[str]:
        hit = mods[mod_names.str.contains(pattern).to_numpy()] if len(mods) else mods
        return [f"module `{n}`" + (f" ×{int(c)}" if c > 1 else "") for n, c in hit.head(EVIDENCE_SHOWN).items()]

    ops = names[cat == "cpu_op"]
    conv, pool = _hits(ops, _CONV2D_OP, "op"), _hits(ops, _POOL2D_OP, "op") or _kernel_hits(ev, _POOL_KERNEL)
    out = {
        "capture": (_hits(ann, _CAPTURE_ANN, "annotation") + _hits(names[cat.isin(LAUNCH_CATS_INFO)], _CAPTURE_CALL,
                                                                        "runtime call")
                    + _hits(names[cat == "python_function"], _CAPTURE_FRAME, "frame")),
        "training": _hits(names[cat.isin(("user_annotation", "gpu_user_annotation", "cpu_op"))], TRAINING_ANN,
                          "annotation") + _kernel_hits(ev, TRAINING_KERNEL),
        "diffusion": _hits(ann, _DIFFUSION_ANN, "annotation") + modules(_DIFFUSION_MODULE),
        "vision": modules(_VISION_MODULE) + modules(_VISION_HEAD) + (conv + pool if conv and pool else []),
        "encoder": modules(_ENCODER_MODULE),
        "llm": modules(_LLM_MODULE),
    }
    out = {k: v for k, v in out.items() if v}
    den = mods[mod_names.str.contains(_DENOISER_MODULE).to_numpy()] if len(mods) else mods
    if "diffusion" in out and len(den):
        out["model_passes"] = [f"{int(den.iloc[0])} forward passes of `{den.index[0]}`"]
    return out


def _passes(evidence: dict[str, list[str]]) -> int | None:
    p = (evidence.get("model_passes") or [""])[0]
    m = re.match(r"(\d+) ", p)
    return int(m.group(1)) if m else None


ENGINE_STEP_KINDS = ("decode", "training", "prefill", "mixed")
NON_LLM_KINDS = ("diffusion", "vision", "encoder")
"""Inference that is not an LLM's: no decode, no prefill, no speculative what-if."""


def _kind(kinds: dict[str, int], shape: tuple[int, int] | None,
          evidence: dict[str, list[str]] | None = None) -> tuple[str, str]:
    """The trace's kind and the step kind it is judged on: engine step labels first (decode, training,
    prefill, mixed), then capture, training, and the model classes. Only an LLM is called decode or prefill.
    """
    ev = evidence or {}
    for k in ENGINE_STEP_KINDS:
        if kinds.get(k):
            return k, k
    n = sum(kinds.values())
    judged = next(iter(kinds)) if n and len(kinds) == 1 else "unknown"
    if ev.get("capture"):
        return "capture", judged
    if ev.get("training"):
        return "training", judged
    if ev.get("diffusion"):
        return "diffusion", judged
    if kinds.get("profiler_step") and shape is not None and ev.get("llm"):
        return ("decode" if shape[1] == 1 else "prefill"), "profiler_step"
    if not ev.get("llm"):
        for k in ("vision", "encoder"):
            if ev.get(k):
                return k, judged
    if n == 1:
        return "single_step", next(iter(kinds))
    return "unknown", "unknown"



def _device_name(r) -> str | None:
    """The trace's device name; a ROCm trace with an empty name, by its properties."""
    if r.mode == "cpu":
        return "CPU"
    if r.meta.get("device_name"):
        return str(r.meta["device_name"])
    from stepscope.hardware import lookup_device

    m = lookup_device(None, r.meta.get("device_properties"))
    return m.device.name if m.known else None


def graph_replay(r, step_ids) -> tuple[bool | None, int, int]:
    """(replays a graph, device events launched by graph launches, device events) over the
    given steps of one rank; None on a CPU trace, where nothing is launched."""
    if r.mode == "cpu" or "graph_launch" not in r.work:
        return None, 0, 0
    # counted through a mask, not a copy of the rows picked
    sel = in_steps(r.work["step_id"].to_numpy(), np.asarray(step_ids, dtype=np.int64))
    n = int(np.count_nonzero(sel))
    sel &= r.work["graph_launch"].to_numpy(bool)
    g = int(np.count_nonzero(sel))
    return (g >= GRAPH_REPLAY_MIN_SHARE * n if n else None), g, n


def trace_info(ranks: list, tp_params: int | None, shape_hint: tuple[int, int] | None = None
               ) -> dict[str, Any]:
    """The `trace_info` block of summary.json from analysed ranks (`RankResult`s with `meta`)."""
    ref = ranks[0]
    st = ref.steps_tot
    with_work = st[(st["n_events"] > 0) & ~st["kind"].isin(EXCLUDED_KINDS)]  # a warm-up is never judged
    kinds = {str(k): int(v) for k, v in with_work["kind"].value_counts().items()}
    evidence = dict(ref.meta.get("kind_evidence") or {})
    kind, judged = _kind(kinds, shape_hint, evidence)
    dec = with_work[with_work["kind"] == "decode"]
    reqs = dec["decode_requests"].to_numpy()
    reqs = reqs[reqs >= 0]
    batch = float(np.median(reqs)) if len(reqs) else None
    if batch is None and kind == "prefill" and shape_hint is not None:
        batch = float(shape_hint[0])
    worlds = {r.meta.get("world_size") for r in ranks} - {None}
    world = max(worlds) if worlds else None
    if tp_params:
        tp, source = int(tp_params), "params"
    elif world and kind != "training":  # a data-parallel world is not a TP group
        tp, source = int(world), "trace"
    else:
        tp, source = 1, "default"
    names = {_device_name(r) for r in ranks} - {None}
    n_judged = int(kinds.get(judged, 0)) if judged != "unknown" else int(len(with_work))
    judged_ids = (with_work if judged == "unknown" else with_work[with_work["kind"] == judged])["step_id"]
    replay, n_graph, n_dev = graph_replay(ref, judged_ids)
    return {
        "kind": kind,
        "engine": ref.meta.get("engine", "unknown"),
        "device_name": sorted(names)[0] if names else None,
        "device_count": ref.meta.get("device_count"),
        "batch_size": batch,
        "batch_source": ("annotation" if len(reqs) else
                         "input shapes" if batch is not None else None),
        "input_shape": list(shape_hint) if shape_hint else None,
        "world_size": int(world) if world else None,
        "ranks_present": sorted(int(r.rank) for r in ranks),
        "tp": tp,
        "tp_source": source,
        "tp_disagreement": bool(tp_params and world and int(tp_params) != int(world)),
        # A trace with no step marker is read whole, as one window: it holds no steps to count.
        # A warm-up pass is no step of the work: counted in steps.csv, never here.
        "n_steps": None if ref.step_source == WHOLE_TRACE else int((~st["kind"].isin(EXCLUDED_KINDS)).sum()),
        "step_source": ref.step_source,
        "n_decode_steps": int(kinds.get("decode", 0)),
        "step_kinds": kinds,
        "judged_kind": judged,
        "graph_replay": replay,
        "graph_launched_events": n_graph if replay is not None else None,
        "device_events": n_dev if replay is not None else None,
        "low_confidence": n_judged < LOW_CONFIDENCE_STEPS,
        "kind_evidence": evidence,
        "model_passes": _passes(evidence) if kind in NON_LLM_KINDS else None,
        "mixed": mixed_reading(with_work) if kind == "mixed" else None,
        "host_only_of_gpu_job": ref.meta.get("host_only_of_gpu_job") or [],
    }


def host_only_of_gpu_job(ev: pd.DataFrame, mode: str, unread_device: dict | None = None) -> list[str]:
    """Evidence that a trace with no device events read recorded an accelerator job: host ops naming NCCL or
    the CUDA/HIP runtime, or unread device events. Empty otherwise."""
    if mode != "cpu":
        return []
    unread = [f"{int(v['n_events']):,} device events in {cat!r} ({v['dur_us'] / 1e3:,.1f} ms) not read"
              for cat, v in sorted((unread_device or {}).items())]
    host = in_values(ev["cat"], ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"))
    return unread + _hits(ev["name"][host].astype(str), _GPU_LIBRARY_OP, "op")


def mixed_reading(steps: pd.DataFrame) -> dict[str, Any] | None:
    """A mixed step's own reading from its annotation: medians of prefill and decode requests and tokens over
    the mixed steps (-1 where the annotation does not say)."""
    m = steps[steps["kind"] == "mixed"]
    if m.empty:
        return None

    def med(col: str) -> float | None:
        v = m[col].to_numpy(float)
        v = v[v >= 0]
        return float(np.median(v)) if len(v) else None

    return {"n_steps": int(len(m)), "prefill_requests": med("prefill_requests"),
            "prefill_tokens": med("prefill_tokens"), "decode_requests": med("decode_requests"),
            "decode_tokens": med("decode_tokens")}


WEIGHT_FORMAT_NAMES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("mxfp4", re.compile(r"mxfp4", re.I)),
    ("nvfp4", re.compile(r"nvfp4", re.I)),
    ("w4a16", re.compile(r"w4a16|int4|marlin|awq|gptq|machete", re.I)),
    ("fp8", re.compile(r"fp8|e4m3|e5m2", re.I)),
    ("int8", re.compile(r"w8a8|int8", re.I)),
)
"""Weight formats a GEMM kernel's name can state, most specific first; a name counts for the
first that matches (`..._bf16xbf16xmxfp4_...` is mxfp4, not fp8's neighbour)."""


def weight_formats_named(kernels: pd.DataFrame) -> list[dict[str, Any]]:
    """The weight formats the GEMM kernels' names state (from `category_kernels` rows), most time first:
    format, names, ms per step, the longest-running name. Names only: none means "not named", not bf16."""
    from stepscope.palette import GEMM_CATEGORIES
    from stepscope.trace.roofline import kernel_formats

    if kernels.empty:
        return []
    gemm = kernels[kernels["category"].isin(GEMM_CATEGORIES)]
    found: dict[str, list[tuple[float, str]]] = {}
    acts: dict[str, set[str]] = {}
    for name, ms in zip(gemm["name"].astype(str), gemm["sum_ms_per_step"].astype(float)):
        # A name that spells its types tells weights from activations: MxE2m1MxE4m3 is MXFP4 weights, not fp8.
        weights, activations = kernel_formats(name)
        fmt = weights if weights not in (None, "bf16", "fp16") else (
            None if weights else next((f for f, pattern in WEIGHT_FORMAT_NAMES if pattern.search(name)), None))
        if fmt is not None:
            found.setdefault(fmt, []).append((ms, name))
            if activations:
                acts.setdefault(fmt, set()).add(activations)
    out = [{"format": fmt, "n_kernels": len(hits), "ms_per_step": sum(ms for ms, _ in hits),
            "example_kernel": max(hits)[1], "activations": ", ".join(sorted(acts.get(fmt, ()))) or None}
           for fmt, hits in found.items()]
    return sorted(out, key=lambda r: -r["ms_per_step"])


def steps_off_architecture(steps_tot: pd.DataFrame, expected_all_reduce: int | None) -> list[int]:
    """The judged decode steps whose all-reduce count is not the architecture's (2L+1 under TP): no forward
    pass as the architecture runs it (a graph piece, merged steps, a cut step)."""
    from stepscope.trace.account import select_decode_steps

    if expected_all_reduce is None or "all_reduce_calls" not in steps_tot:
        return []
    dec, which = select_decode_steps(steps_tot)
    if which != "decode":
        return []
    off = dec["all_reduce_calls"].to_numpy() != expected_all_reduce
    return [int(i) for i in dec["step_id"].to_numpy()[off]]
