"""Stages 02 and 03: GEMM and collective micro-benchmarks at the model's own shapes."""
