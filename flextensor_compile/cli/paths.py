"""Checks on the paths `ftc` commands write, made before any work so a bad path costs nothing.

Owns: one-line errors for an output file whose folder is missing or not writable, an output
file that names a folder, and an output folder that names a file. Must not know: what is written.
"""

from __future__ import annotations

import os
from pathlib import Path

from flextensor_runtime.errors import ConfigError

__all__ = ["check_output_dir", "check_output_file"]


def _check_parent(path: Path, option: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(
            f"{option} {path}: the folder {str(parent)!r} does not exist; create it or write "
            "somewhere else"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{option} {path}: the folder {str(parent)!r} is not writable; write somewhere else"
        )


def check_output_file(path: Path | None, option: str, example: str) -> None:
    """`path` can be written as a file: its folder exists and is writable, it is not a folder.
    `example` is a file name to suggest inside a folder given by mistake."""
    if path is None:
        return
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a folder; give a file path, e.g. {path / example}")
    _check_parent(path, option)


def check_output_dir(path: Path | None, option: str) -> None:
    """`path` is a folder, or can be made as one (its nearest existing ancestor is a folder)."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is a file, not a folder; give a folder path")
    ancestor = path
    while not ancestor.exists() and ancestor.parent != ancestor:
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: {str(ancestor)!r} is not a writable folder")
