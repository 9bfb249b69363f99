"""Benchmark of the fused kernels (`python -m bench.kernels [--smoke]`): Triton vs reference."""
