"""CPU benchmarks of the deployment runtime (`python -m bench.runtime`, `make bench-runtime`)."""
