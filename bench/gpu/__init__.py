"""GPU benchmark of the deployment runtime (`python -m bench.gpu`, `--smoke` runs on CPU)."""
