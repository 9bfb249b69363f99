"""Entry point: `python -m bench.kernels [--smoke] [--json PATH]`."""

from __future__ import annotations

from bench.kernels.run import main

raise SystemExit(main())
