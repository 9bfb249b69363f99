"""Test set-up for the caches area.

`tests/profile/` is a package named `profile`, and `tests/` is on sys.path while pytest runs,
so it shadows the standard library's `profile` module that `cProfile` (imported by diffusers
through torch) needs. Import `cProfile` once against the standard library here, leaving
`sys.modules["profile"]` as it was, so later `import cProfile` calls find it ready.
"""

from __future__ import annotations

import os
import sys


def _import_cprofile_from_stdlib() -> None:
    if "cProfile" in sys.modules:
        return
    shadow = sys.modules.pop("profile", None)
    saved = sys.path[:]
    tests_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != tests_root]
    try:
        import cProfile  # noqa: F401
    finally:
        sys.path[:] = saved
        sys.modules.pop("profile", None)
        if shadow is not None:
            sys.modules["profile"] = shadow


_import_cprofile_from_stdlib()
