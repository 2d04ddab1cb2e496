"""Which CPU-side frames the loader keeps as context for the work launched under them.

A kernel's name says how it computes, the frames around its launch what for; traces hold millions of frames,
so only those that can name a purpose survive parsing (`keep_frame`). Their categories are decided in
`categorize`; this module stays pandas-free.
"""

from __future__ import annotations

import re

MODULE_PREFIX = "nn.Module: "
NAME_CAP_CHARS = 4096
"""Names are cut to this before a rule sees them (re-exported by `parse`, its one home)."""

_FUNCTION_FRAME = re.compile(
    r"execute_model|\): (?:run_batch|forward_batch_generation|forward_(?:decode|extend|idle)|_forward_step"
    r"|\w*rotary\w*|apply_rotary\w*|rotate_half|\w*_rope\w*|rope_\w*"
    r"|\w*rms_?norm\w*|\w*layer_?norm\w*|compute_logits|\w*lm_head\w*|\w*cross_entropy\w*"
    r"|\w*_loss\w*|loss\w*"
    r"|_capture_cudagraphs|capture_model|compile_or_warm_up_model|capture_one_batch_size|capture_begin"
    r"|recompute_fn)$", re.I)
"""Python function frames that name a purpose (`apply_rotary_pos_emb`), those of a CUDA-graph capture or
compile warm-up (evidence for `trace.info.kind_evidence`), and checkpointing's `recompute_fn`
(`modules.in_recompute_frames`)."""

_CONTEXT_OP = re.compile(
    r"(?i)norm|rotary|rope|conv|loss|cross_entropy|nll|logits|lm_head"
    r"|^Optimizer\.|_foreach_|_fused_(adam|adamw|sgd|adagrad)"
    r"|^vllm::unified_(mla_)?attention|^vllm::moe_forward"  # MLA's absorbed bmms, the router's top-k
    r"|^vllm::(all_reduce|all_gather|reduce_scatter)$"  # vLLM's collectives name RCCL's generic kernels
    r"|^ProfilerStep#\d+$|^\[param\|.*\|(?:warmup|measure)\|"
    r"|^enumerate\(DataLoader\)#")  # the host's wait for a batch, an op in 2021-format traces
"""cpu_op names that name a purpose (matched by `re.search`), the step markers older traces
record as ops (`trace.steps`), and the DataLoader's `__next__` (the stall it names, `trace.period`)."""


def keep_frame(name: object) -> bool:
    """Whether a python frame or (on a GPU trace) a cpu_op is kept as context."""
    if type(name) is not str:
        return False
    if len(name) > NAME_CAP_CHARS:  # the regexes below backtrack: a 100 MB name took minutes
        name = name[:NAME_CAP_CHARS]
    return name.startswith(MODULE_PREFIX) or bool(_FUNCTION_FRAME.search(name) or _CONTEXT_OP.search(name))


class _Memo(dict):
    """name -> keep_frame(name), computed once per distinct name (names repeat a lot)."""

    def __missing__(self, key: str) -> bool:
        if type(key) is str and len(key) > NAME_CAP_CHARS:
            return keep_frame(key)  # not kept: a crafted name must not stay in memory
        v = self[key] = keep_frame(key)
        return v


KEEP_FRAME = _Memo()
"""`KEEP_FRAME[name]`: `keep_frame` memoized; usable with `map` over millions of names."""
