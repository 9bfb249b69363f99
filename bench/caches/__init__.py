"""Cross-step cache benchmark: dense calls saved versus final-output error on a sampler loop.

Run with `python -m bench.caches` (or `make bench-caches`); see docs/caches.md.
"""
