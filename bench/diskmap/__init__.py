"""DiskMap benchmark: read throughput against safetensors `safe_open`, and host RSS over
disk-offloaded forwards. Run `python -m bench.diskmap --help`."""
