"""Keeping stdout for the one JSON document a `--json` command prints.

Owns: `stdout_to_stderr`, which sends everything written to stdout while it is active to
stderr: `print` (`sys.stdout`), `sys.__stdout__`, and writes to file descriptor 1 itself (a
subprocess, a C extension, `os.write(1, ...)`), so a model file that prints cannot break the
document. Must not know: what runs inside it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout

__all__ = ["stdout_to_stderr"]


def _flush() -> None:
    for stream in (sys.stdout, sys.__stdout__, sys.stderr):
        if stream is not None:
            stream.flush()


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Inside: stdout (the object and descriptor 1) writes to stderr; after: as before."""
    _flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 (a closed stdout): only the object can be redirected
        saved = -1
    if saved >= 0:
        os.dup2(2, 1)
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        _flush()  # what the model left buffered goes to stderr too, not after the document
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)
