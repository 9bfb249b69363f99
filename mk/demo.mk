# make demo: the main job on the bundled example.
.PHONY: demo
demo: $(STAMP)
	$(BIN)/ftc inspect profiles/format_golden.msgpack
