"""Benchmarks: one package per area, each runnable as `python -m bench.<area>`."""
