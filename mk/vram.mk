# VRAM wrappers, DiskMap, layer-wise offload (docs/vram.md)
.PHONY: bench-diskmap bench-diskmap-quick test-vram

bench: bench-diskmap

bench-diskmap: $(STAMP)
	$(BIN)/python -m bench.diskmap

bench-diskmap-quick: $(STAMP)
	$(BIN)/python -m bench.diskmap --size-mb 128 --forwards 20 --width 256

test-vram: $(STAMP)
	$(BIN)/python -m pytest -q tests/vram
