"""The format module and `ftc --help` must not import torch (fast start, torch-free tools)."""

from __future__ import annotations

import subprocess
import sys

_HELP = """
import sys
sys.argv = ["ftc", "--help"]
from flextensor_compile.cli.app import main
try:
    main()
except SystemExit:
    pass
assert "torch" not in sys.modules, "ftc --help imported torch"
print("ok")
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_profile_module_does_not_import_torch() -> None:
    r = _run(
        "import sys, flextensor_runtime.profile; assert 'torch' not in sys.modules; print('ok')"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_ftc_help_does_not_import_torch() -> None:
    r = _run(_HELP)
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout and r.stdout.strip().endswith("ok")


def test_runtime_package_import_is_lazy() -> None:
    r = _run("import sys, flextensor_runtime; assert 'torch' not in sys.modules; print('ok')")
    assert r.returncode == 0, r.stderr
