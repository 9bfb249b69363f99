# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create or refresh the virtualenv in $(VENV) and install what they need.
#
#   make install TORCH=torch==2.5.1   # install (or replace) torch with a given requirement
#
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
EXTRAS ?= compile,kernels,plot,dev
STAMP := $(VENV)/.flextensor-installed
PYTEST_WORKERS ?= 2
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install test test-slow lint demo fuzz golden bench clean help

help:
	@echo "make demo     compile, inspect and run the bundled example"
	@echo "make test     everything that needs no GPU (what CI runs)"
	@echo "make lint     ruff + mypy"
	@echo "make fuzz     long fuzz run of the profile reader"
	@echo "make golden   regenerate the golden profiles in profiles/ (on purpose only)"
	@echo "make bench    all CPU benchmarks (see bench/)"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@if [ "$(origin TORCH)" = "command line" ] || ! $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "installing $(TORCH)"; $(BIN)/python -m pip install -q "$(TORCH)"; fi
	@$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	@touch $@

install: $(STAMP)
	@if [ "$(origin TORCH)" = "command line" ]; then $(BIN)/python -m pip install -q "$(TORCH)"; fi

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check $(wildcard flextensor_runtime flextensor_compile tests bench profiles)
	$(BIN)/ruff format --check flextensor_runtime flextensor_compile
	$(BIN)/mypy

fuzz: $(STAMP)
	FLEXTENSOR_FUZZ_EXAMPLES=20000 $(BIN)/python -m pytest -q tests/format/test_profile_fuzz.py -p no:cacheprovider

golden: $(STAMP)
	$(BIN)/python -m profiles.regenerate

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Each area adds its own targets (demo steps, benchmarks) in mk/<area>.mk.
-include mk/*.mk
