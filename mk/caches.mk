# Cross-step cache benchmark (bench/caches): dense calls saved vs final-output error.
#   make bench-caches                      table, plus the figure in bench/caches/out/
.PHONY: bench-caches
bench: bench-caches

bench-caches: $(STAMP)
	$(BIN)/python -m bench.caches --plot bench/caches/out/speed_quality.png --json bench/caches/out/rows.json
