"""Keeping stdout for the one JSON document a `--json` command prints.

Owns: `stdout_to_stderr`, which sends everything written to stdout while it is active to
stderr: `print` (`sys.stdout`), `sys.__stdout__`, and writes to file descriptor 1 itself (a
subprocess, a C extension, `os.write(1, ...)`), so a model file that prints cannot break the
document; `is_stdout`, whether an output path is stdout itself (`-o /dev/stdout`; `-o -` is
made that path by `dash_is_stdout`), and
`text_off_stdout`, which then sends the command's own lines to stderr so they do not end up
inside the file, and `check_stdout_outputs`, which refuses such an output with `--json` or when
stdout is a terminal. Must not know: what runs inside it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, redirect_stdout
from pathlib import Path

__all__ = ["check_stdout_outputs", "dash_is_stdout", "is_stdout", "stdout_to_stderr",
           "text_off_stdout"]  # fmt: skip


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


def dash_is_stdout(path: Path | None) -> Path | None:
    """An output path `-` is stdout, as for most command-line tools (not a file named `-`)."""
    return Path("/dev/stdout") if path is not None and str(path) == "-" else path


def is_stdout(path: Path | None) -> bool:
    """Whether `path` is the file stdout writes to (`/dev/stdout`, the pipe or terminal it is);
    `/dev/null` is not counted: nothing written there is read."""
    if path is None:
        return False
    try:
        here, out = os.stat(path), os.fstat(1)
        if os.path.samefile(path, os.devnull):
            return False
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (out.st_dev, out.st_ino)


def text_off_stdout(*outputs: Path | None) -> AbstractContextManager[object]:
    """Inside: when an output is stdout, the command's own printing goes to stderr."""
    if any(is_stdout(p) for p in outputs):
        return redirect_stdout(sys.stderr)
    return nullcontext()


def check_stdout_outputs(
    as_json: bool, outputs: list[tuple[str, Path | None]], binary: bool = True
) -> None:
    """An output on stdout is refused when `--json` writes its document there, and a `binary`
    one (a profile, an image) when stdout is a terminal: it would be written to the screen."""
    from flextensor_runtime.errors import ConfigError

    for option, path in outputs:
        if not is_stdout(path):
            continue
        if as_json:
            raise ConfigError(f"{option} {path}: is stdout, which --json writes its document "
                              "to; write the file somewhere else or drop --json")  # fmt: skip
        if binary and sys.stdout.isatty():
            raise ConfigError(f"{option} {path}: stdout is a terminal, and the file is binary; "
                              "redirect it (`> file`) or pipe it, or give a file path")  # fmt: skip
