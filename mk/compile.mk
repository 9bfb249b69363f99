# ftc profile: compile the bundled example, and the profiling-cost benchmark.
.PHONY: profile-demo bench-compile
profile-demo: $(STAMP)
	$(BIN)/ftc profile profiles/tiny_transformer.py --mem-fraction 0.6 --save-stats tiny_stats.json -o tiny.msgpack
	$(BIN)/ftc inspect tiny.msgpack

bench-compile: $(STAMP)
	$(BIN)/python -m bench.compile.profile_cost

bench: bench-compile
