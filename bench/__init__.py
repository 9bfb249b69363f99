"""Benchmarks (`make bench`): speed and memory targets live here, never in unit tests."""
