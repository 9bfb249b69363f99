# Fused kernels benchmark (bench/kernels).
#   make bench-kernels         real sizes on a CUDA GPU (tiny --smoke sizes when there is none)
#   make bench-kernels-smoke   tiny sizes on CPU in the Triton interpreter (also run by make test)
.PHONY: bench-kernels bench-kernels-smoke
bench: bench-kernels

bench-kernels: $(STAMP)
	$(BIN)/python -m bench.kernels

bench-kernels-smoke: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m bench.kernels --smoke
