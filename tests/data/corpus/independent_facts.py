"""Facts about a corpus trace computed straight from its JSON, without stepscope.

This is the hand-check behind each `<name>.facts.yaml`: it reads the Kineto/Chrome trace
with plain json and gzip and prints what a person would count by eye in Perfetto: the
world size and rank from `distributedInfo`, the device events (kernels, memcpys, memsets)
with their summed duration, the profiler steps (`ProfilerStep#N`) and engine step
annotations, the collectives (by kernel name and by the host op around them), the largest
kernels, and the evidence of the trace's kind (capture, compile, diffusion, module names).
It shares no code with stepscope on purpose: where the two disagree, one of them is wrong.

Usage: python tests/data/corpus/independent_facts.py TRACE.json.gz [TRACE2 ...]
"""
from __future__ import annotations

import collections
import gzip
import json
import re
import sys

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset",
               "Kernel", "Memcpy", "Memset"}  # the 2021 Kineto format's names of the same events
# a step marker's category: today's annotation, or the 2021 format's `Operator`
STEP_CATS = {"user_annotation", "Operator"}
# device work of an accelerator recorded in a category of its own (Meta's MTIA): counted apart
OTHER_DEVICE_CATS = {"mtia_ccp_events"}
# one per training iteration where no ProfilerStep marks it, and the wait for each batch
ITERATION_MARK = re.compile(r"^Optimizer\.step#")
DATALOADER_WAIT = re.compile(r"^enumerate\(DataLoader\)#")
# at the name's start or as the kernel's own name: template arguments such as `..._broadcast_...` are no collective
COLL_KERNEL = re.compile(r"^(nccl|rccl)|all_?reduce_kernel|cross_device_reduce|all_gather_kernel", re.I)
COLL_OP = re.compile(r"^(c10d::\w+|nccl:\w+|record_param_comms|gloo:\w+|_C::shm_\w+)")
STEP_ANN = re.compile(r"^(ProfilerStep#\d+|execute_\w*|step\[\w+.*\])")
KIND_WORDS = {
    # running a compiled graph (`## Call CompiledFxGraph ... ##`) is no capture; recording one is
    "capture": re.compile(r"capture_\d+_\w+|CUDAGraphNode\.record|_capture_cudagraphs|compile_or_warm_up_model|"
                          r"StreamBeginCapture|capture_one_batch_size", re.I),
    "diffusion": re.compile(r"execute_diffusion|Transformer2DModel|UNet2D|AutoencoderKL|Flux", re.I),
    "vision": re.compile(r"ViTModel|ResNet|Timesformer|Owlv2|conv2d|miopen|cudnn", re.I),
    "encoder": re.compile(r"BertModel|BertEncoder", re.I),
    "training": re.compile(r"Optimizer\.step|autograd::engine|backward", re.I),
}


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def collectives_per_step(ev: list[dict]) -> list[dict]:
    """Host collective ops (`nccl:*`, `gloo:*`) inside each step annotation, in step order."""
    steps = sorted((e for e in ev if e.get("cat") == "user_annotation" and STEP_ANN.match(e["name"])
                    and not e["name"].startswith("step[")), key=lambda e: float(e["ts"]))
    ops = [e for e in ev if e.get("cat") in ("cpu_op", "user_annotation")
           and re.match(r"^((nccl|gloo):\w+|_C::shm_\w+)", str(e.get("name", "")))]
    out = []
    for st in steps:
        t0, t1 = float(st["ts"]), float(st["ts"]) + float(st.get("dur", 0))
        out.append(dict(collections.Counter(o["name"] for o in ops if t0 <= float(o["ts"]) < t1)))
    return out


def facts(path: str) -> dict:
    doc = load(path)
    ev = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X"]
    dist = doc.get("distributedInfo") or {}
    dev = [e for e in ev if e.get("cat") in DEVICE_CATS]
    kernels = [e for e in dev if e.get("cat") in ("kernel", "Kernel")]
    steps = sorted({e["name"] for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")
                    and e.get("cat") in STEP_CATS})
    engine = collections.Counter(e["name"] for e in ev if e.get("cat") == "user_annotation"
                                 and STEP_ANN.match(e["name"]) and not e["name"].startswith("ProfilerStep#"))
    coll_k = collections.Counter(e["name"][:60] for e in kernels if COLL_KERNEL.search(e["name"]))
    coll_op = collections.Counter(m.group(1) for e in ev if e.get("cat") in ("cpu_op", "user_annotation")
                                  for m in [COLL_OP.match(str(e.get("name", "")))] if m)
    by_name = collections.Counter()
    for e in kernels:
        by_name[e["name"][:70]] += float(e.get("dur", 0))
    text = " ".join({str(e.get("name", "")) for e in ev})
    kinds = {k: sorted(set(m.group(0) for m in rx.finditer(text)))[:6] for k, rx in KIND_WORDS.items()}
    span_us = (max(float(e["ts"]) + float(e.get("dur", 0)) for e in dev) - min(float(e["ts"]) for e in dev)) if dev else 0.0
    return {
        "file": path, "rank": dist.get("rank"), "world_size": dist.get("world_size"),
        "device_events": len(dev), "kernels": len(kernels),
        "device_sum_ms": round(sum(float(e.get("dur", 0)) for e in dev) / 1000, 3),
        "device_span_ms": round(span_us / 1000, 3),
        "profiler_steps": len(steps), "engine_step_annotations": dict(engine), "engine_steps": sum(engine.values()),
        "collective_kernels": dict(coll_k), "collective_ops": dict(coll_op),
        "collective_ops_per_step": collectives_per_step(ev),
        "top_kernels_ms": {k: round(v / 1000, 3) for k, v in by_name.most_common(5)},
        "kind_evidence": {k: v for k, v in kinds.items() if v},
        **loop_facts(ev),
    }


def loop_facts(ev: list[dict]) -> dict:
    """What a training loop or an accelerator without CUDA categories leaves: iteration marks,
    DataLoader waits (ms, in order) and device events in a category of their own."""
    other = [e for e in ev if e.get("cat") in OTHER_DEVICE_CATS]
    return {
        "iteration_marks": sum(1 for e in ev if ITERATION_MARK.match(str(e.get("name", "")))),
        "dataloader_waits_ms": [round(float(e.get("dur", 0)) / 1000, 1) for e in sorted(
            (e for e in ev if DATALOADER_WAIT.match(str(e.get("name", "")))), key=lambda e: float(e["ts"]))],
        "other_device_events": len(other),
        "other_device_sum_ms": round(sum(float(e.get("dur", 0)) for e in other) / 1000, 3),
    }


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(json.dumps(facts(p), indent=1))
