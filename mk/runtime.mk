# Runtime (deployment) targets: CPU benchmark and the GPU benchmark (CPU smoke mode here).
.PHONY: bench-runtime bench-gpu bench-gpu-smoke

bench: bench-runtime

bench-runtime: $(STAMP)
	$(BIN)/python -m bench.runtime

bench-gpu: $(STAMP)
	$(BIN)/python -m bench.gpu --curve-out out/h2d_curve.json

bench-gpu-smoke: $(STAMP)
	$(BIN)/python -m bench.gpu --smoke
