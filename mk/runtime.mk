# Runtime (deployment) targets: CPU benchmark and the GPU benchmark (CPU smoke mode here).
.PHONY: bench-runtime bench-gpu bench-gpu-smoke

bench: bench-runtime

bench-runtime: $(STAMP)
	$(BIN)/python -m bench.runtime

bench-gpu: $(STAMP)
	$(BIN)/python -m bench.gpu --curve-out out/h2d_curve.json

bench-gpu-smoke: $(STAMP)
	$(BIN)/python -m bench.gpu --smoke

# The wheels bench/gpu/check.sh installs on a GPU machine without network (it has CUDA torch,
# transformers, triton, pytest, ...; not diffusers): the venv's diffusers version into .whl/.
.PHONY: gpu-wheels
gpu-wheels: $(STAMP)
	rm -rf .whl && mkdir -p .whl
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux2014_x86_64 -d .whl \
		"diffusers==$$($(BIN)/python -c 'import diffusers; print(diffusers.__version__)')"
	@ls .whl
