"""Test set-up for the compiler tests.

`tests/profile/` (the format tests) shadows the standard library's `profile` module once pytest
puts `tests/` on sys.path, and `torch._dynamo` (imported lazily by meta-device initialisation and
by FLOP counting on meta tensors) needs the real one through `cProfile`. Import torch._dynamo
once here with the standard library module, then leave the name to the test package.
"""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS_DIR = Path(__file__).resolve().parents[1]


def _import_dynamo_with_stdlib_profile() -> None:
    if "torch._dynamo" in sys.modules:
        return
    saved_path = list(sys.path)
    saved_profile = sys.modules.pop("profile", None)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _TESTS_DIR]
    try:
        import torch._dynamo  # noqa: F401
    finally:
        sys.path[:] = saved_path
        sys.modules.pop("profile", None)
        if saved_profile is not None:
            sys.modules["profile"] = saved_profile


_import_dynamo_with_stdlib_profile()
