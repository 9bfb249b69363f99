# make demo: the main job on the bundled example, end to end:
# compile a profile (discover, measure, solve, emit), inspect it, deploy it and check outputs.
DEMO_DIR ?= out/demo
DEMO_MODEL ?= profiles/tiny_transformer.py

.PHONY: demo
demo: $(STAMP)
	@mkdir -p $(DEMO_DIR)
	$(BIN)/ftc profile $(DEMO_MODEL) --mem-fraction 0.6 --save-stats $(DEMO_DIR)/stats.json -o $(DEMO_DIR)/profile.msgpack
	$(BIN)/ftc inspect $(DEMO_DIR)/profile.msgpack
	$(BIN)/python -m profiles.demo $(DEMO_MODEL) $(DEMO_DIR)/profile.msgpack
