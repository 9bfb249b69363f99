"""CPU benchmarks of flextensor (run with `make bench`)."""
