"""The solver, planning and diagnostics never import torch (they run where torch is absent)."""

from __future__ import annotations

import subprocess
import sys


def test_solver_modules_import_without_torch() -> None:
    code = (
        "import sys\n"
        "import flextensor_compile.planning, flextensor_compile.solve, flextensor_compile.sweep\n"
        "import flextensor_compile.explain, flextensor_compile.timeline\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
