"""`import flextensor_runtime` and deploying never import the compiler, typer or rich."""

from __future__ import annotations

import subprocess
import sys


def test_runtime_imports_stay_light() -> None:
    code = (
        "import sys, flextensor_runtime\n"
        "assert 'torch' not in sys.modules, 'import flextensor_runtime pulled in torch'\n"
        "from flextensor_runtime import offload_from_profile, handle, offload_block, replan, load_profile\n"
        "import flextensor_runtime.backend, flextensor_runtime.lazy_load\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('flextensor_compile', 'typer', 'rich')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
