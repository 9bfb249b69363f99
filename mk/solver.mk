# Solver area: the plan-quality benchmark (our solver vs FlexTensor 0.5's AdaptiveStrategy).
# FlexTensor 0.5 is installed into its own venv ($(TORCH) first, so it does not pull a CUDA
# build); if that fails the benchmark still runs and says FlexTensor was not measured.
#   make bench-plan-quality FT05_VENV=/path/to/venv   # reuse an existing FlexTensor 0.5 venv
FT05_VENV ?= $(VENV)/flextensor05

.PHONY: bench-plan-quality ft05-venv
bench: bench-plan-quality

$(FT05_VENV)/.flextensor05-installed:
	@test -x $(FT05_VENV)/bin/python || $(PYTHON) -m venv $(FT05_VENV)
	@$(FT05_VENV)/bin/python -c "import torch" 2>/dev/null || \
		$(FT05_VENV)/bin/python -m pip install -q "$(TORCH)"
	@$(FT05_VENV)/bin/python -m pip install -q flextensor==0.5.0
	@touch $@

ft05-venv: $(FT05_VENV)/.flextensor05-installed

bench-plan-quality: $(STAMP)
	@$(MAKE) --no-print-directory ft05-venv || echo "FlexTensor 0.5 could not be installed into $(FT05_VENV); benchmarking without it"
	@if [ -f $(FT05_VENV)/.flextensor05-installed ]; then \
		$(BIN)/python -m bench.plan_quality --peer-python $(FT05_VENV)/bin/python; \
	else $(BIN)/python -m bench.plan_quality; fi

# The suite with the copy curves a GPU measured (`make bench-gpu` saves them in out/,
# `bench/gpu/check.sh LOGDIR` in LOGDIR): each copy alone, then 8 queued back to back.
#   make bench-plan-quality-measured CURVES=gpu-logs
CURVES ?= out
.PHONY: bench-plan-quality-measured
bench-plan-quality-measured: $(STAMP)
	@test -f $(CURVES)/h2d_curve.json || { echo "no $(CURVES)/h2d_curve.json: run make bench-gpu on a GPU (or pass CURVES=LOGDIR of bench/gpu/check.sh)"; exit 1; }
	$(BIN)/python -m bench.plan_quality --copy-curve $(CURVES)/h2d_curve.json
	$(BIN)/python -m bench.plan_quality --copy-curve $(CURVES)/h2d_curve_queued.json

# Solve times on wide random instances (random tensor sizes, so every subset table is
# thinned), with the 80 traps x 24 tensors solve-time target.
.PHONY: bench-solve-wide
bench: bench-solve-wide
bench-solve-wide: $(STAMP)
	$(BIN)/python -m bench.plan_quality.wide

# Solve times on large real-shaped models: MoE traps of hundreds of equal experts (DeepSeek-V3,
# Qwen3-235B) and Llama-3.1-405B at leaf granularity (1,766 traps).
.PHONY: bench-solve-large
bench: bench-solve-large
bench-solve-large: $(STAMP)
	$(BIN)/python -m bench.plan_quality.large
