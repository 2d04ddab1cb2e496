"""Marlin W4A16 GEMMs through vLLM's own ops, resolved at run time.

vLLM renamed and re-shaped the entry point across releases, so the call is built from the function's parameter
names rather than one pinned signature.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from stepscope.errors import StepscopeError

ENTRY_POINTS = ("marlin_gemm", "gptq_marlin_gemm")
_EMPTY_OK = {"c", "b_bias", "a_scales", "global_scale", "b_zeros", "g_idx", "perm"}
"""Inputs a plain symmetric W4A16 GEMM leaves unused."""
CORRECTNESS_MAX_MEAN_REL_DIFF = 0.04


class MarlinUnavailable(StepscopeError):
    """Marlin cannot run here (no CUDA, no vLLM, or an entry point we do not understand)."""


def resolve_entry_point(ops: Any) -> tuple[Callable[..., Any], str]:
    """The Marlin GEMM function of a vLLM `_custom_ops`-like module, and its name."""
    for name in ENTRY_POINTS:
        fn = getattr(ops, name, None)
        if callable(fn):
            return fn, name
    raise MarlinUnavailable(
        f"no Marlin GEMM entry point in {getattr(ops, '__name__', ops)!r}",
        hint=f"looked for {', '.join(ENTRY_POINTS)}; install a vLLM build with CUDA kernels")


def build_kwargs(fn: Callable[..., Any], values: dict[str, Any], empty: Callable[[], Any]) -> dict[str, Any]:
    """Keyword arguments for `fn` from `values` by parameter name; unused optional tensors become None (or
    `empty()`), an unknown required one raises MarlinUnavailable."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise MarlinUnavailable(f"cannot read the signature of {fn!r}: {exc}") from None
    kwargs: dict[str, Any] = {}
    for name, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in values:
            kwargs[name] = values[name]
        elif name in _EMPTY_OK:
            ann = p.annotation if isinstance(p.annotation, str) else repr(p.annotation)
            kwargs[name] = None if ("None" in ann or "Optional" in ann) else empty()
        elif p.default is not p.empty:
            continue
        else:
            raise MarlinUnavailable(
                f"Marlin entry point {getattr(fn, '__name__', fn)} needs an unknown parameter {name!r}",
                hint="this vLLM release changed the signature again; extend stepscope.micro.marlin")
    return kwargs


def availability() -> str | None:
    """None when Marlin can run here, else the one-line reason it cannot."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device: Marlin W4A16 needs an NVIDIA GPU (skipped on this machine)"
    try:
        from vllm import _custom_ops as ops
    except Exception as exc:  # noqa: BLE001 - any import failure means the same thing here
        return f"vLLM's CUDA ops do not import: {exc}"
    try:
        resolve_entry_point(ops)
    except MarlinUnavailable as exc:
        return exc.message
    return None


class MarlinGemm:
    """One W4A16 g=32 weight of shape [k, n] prepared with vLLM's `marlin_quantize`."""

    def __init__(self, n: int, k: int, *, group_size: int = 32, device: str = "cuda", seed: int = 0):
        import torch
        from vllm import _custom_ops as ops
        from vllm.model_executor.layers.quantization.utils import marlin_utils, marlin_utils_test
        from vllm.scalar_type import scalar_types

        self.n, self.k, self.device = n, k, device
        self.fn, self.entry_point = resolve_entry_point(ops)
        gen = torch.Generator(device=device).manual_seed(seed)
        w = torch.randn(k, n, dtype=torch.bfloat16, device=device, generator=gen) / k ** 0.5
        q_kwargs: dict[str, Any] = {}
        q_params = inspect.signature(marlin_utils_test.marlin_quantize).parameters
        if "act_order" in q_params:
            q_kwargs["act_order"] = False
        res = marlin_utils_test.marlin_quantize(w, scalar_types.uint4b8, group_size, **q_kwargs)
        self.w_ref, self.q_w, self.scales = res[0], res[1], res[2]
        if hasattr(marlin_utils, "marlin_make_workspace_new"):
            self.workspace = marlin_utils.marlin_make_workspace_new(torch.device(device))
        else:
            self.workspace = marlin_utils.marlin_make_workspace(n, torch.device(device))
        self.q_type = scalar_types.uint4b8

    def copy(self) -> "MarlinGemm":
        """Same weights in fresh memory (for rotating copies through L2); no re-quantization."""
        other = object.__new__(MarlinGemm)
        other.__dict__.update(self.__dict__)
        other.q_w, other.scales = self.q_w.clone(), self.scales.clone()
        return other

    def call(self, a):
        """Return a zero-argument callable computing a @ W (a: [m, k] bf16)."""
        import torch

        m = a.shape[0]
        values = dict(a=a, b_q_weight=self.q_w, b_scales=self.scales, workspace=self.workspace,
                      b_q_type=self.q_type, size_m=m, size_n=self.n, size_k=self.k, is_k_full=True,
                      has_zp=False, use_fp32_reduce=True, use_atomic_add=False, is_zp_float=False)
        kwargs = build_kwargs(self.fn, values,
                              lambda: torch.empty(0, dtype=torch.int32, device=self.device))
        fn = self.fn
        return lambda: fn(**kwargs)

    def mean_rel_diff(self, a) -> float:
        """Mean |marlin − reference| / mean |reference| against the dequantized weight."""
        out = self.call(a)().float()
        ref = (a.float() @ self.w_ref.float())
        return float((out - ref).abs().mean() / ref.abs().mean().clamp_min(1e-12))
