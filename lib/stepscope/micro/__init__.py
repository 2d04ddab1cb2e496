"""Stages 02 and 03: GEMM and collective micro-benchmarks at the model's own shapes.

Stage 02 is `stepscope.micro.gemm`, stage 03 `stepscope.micro.collectives` (each a `run_stage`); the
method is in docs/methods.md, every artifact of `02_gemm_micro/` and `03_nccl_burst/` in docs/artifacts.md.
"""
