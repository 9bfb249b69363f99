"""Checks on the paths `ftc` commands write, made before any work so a bad path costs nothing,
and the temp-then-rename write every output goes through.

Owns: one-line errors for an output file whose folder is missing or not writable, an output
file that names a folder, a block device or a socket, an output folder that names a file, an
output that names an input (or another output) of the same command, and an image whose format
matplotlib cannot write; `image_format`, the format an image path asks for; and `atomic_output`,
which makes a file appear whole or not at all (an error or Ctrl-C leaves the old file, or none,
and no temp file; a symlink is written through, `/dev/null` or a pipe written in place).
Must not know: what is written.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from flextensor_runtime.atomic_file import (
    IN_PLACE_KINDS,
    check_output_target,
    not_creatable,
    output_kind,
    replaced_mode,
    write_in_place,
)
from flextensor_runtime.errors import ConfigError

__all__ = [
    "atomic_output",
    "check_distinct",
    "check_image_file",
    "check_output_dir",
    "check_output_file",
    "image_format",
    "write_image",
]

# What `Figure.savefig` writes without extra packages (its format comes from the suffix).
# (Not .pgf: it needs a LaTeX install, so it would fail only after all the work.)
_IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".eps", ".ps", ".jpg", ".jpeg", ".tif",
                   ".tiff", ".webp", ".raw", ".rgba")  # fmt: skip


def _check_parent(path: Path, option: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise ConfigError(
            f"{option} {path}: {str(parent)!r} is a file, not a folder; write somewhere else"
        )
    if not parent.is_dir():
        raise ConfigError(
            f"{option} {path}: the folder {str(parent)!r} does not exist; create it or write "
            "somewhere else"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{option} {path}: the folder {str(parent)!r} is not writable; write somewhere else"
        )
    try:  # a folder can pass `access` and still refuse files (/proc, a read-only mount)
        fd, probe = tempfile.mkstemp(prefix=".ftc-probe.", dir=parent)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: the folder {str(parent)!r} refused a new file "
                          f"({exc.strerror}); write somewhere else") from None  # fmt: skip
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: Path | None, option: str, example: str) -> None:
    """`path` can be written as a file: its folder exists and is writable, it is not a folder,
    a block device or a socket (a character device or pipe, e.g. `/dev/null`, is written in
    place). `example` is a file name to suggest inside a folder given by mistake."""
    if path is None:
        return
    kind = check_output_target(path, f"{option} {path}")
    if kind == "folder":
        raise ConfigError(f"{option} {path} is a folder; give a file path, e.g. {path / example}")
    if kind not in IN_PLACE_KINDS:
        _check_parent(Path(os.path.realpath(path)) if path.is_symlink() else path, option)


def check_image_file(path: Path | None, option: str) -> None:
    """`path` is a writable file whose suffix names a format matplotlib can draw (none: PNG)."""
    if path is None:
        return
    check_output_file(path, option, "plot.png")
    if path.suffix and path.suffix.lower() not in _IMAGE_SUFFIXES:
        raise ConfigError(
            f"{option} {path}: a {path.suffix!r} image cannot be drawn; name the file .png "
            f"(or one of {', '.join(_IMAGE_SUFFIXES[1:])})"
        )


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


def _same_file(a: Path, b: Path) -> bool:
    if output_kind(a) == "character device":  # `/dev/null` twice is fine: nothing is replaced
        return False
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def check_distinct(
    outputs: list[tuple[str, Path | None]], inputs: list[tuple[str, Path | None]]
) -> None:
    """No output overwrites an input or another output. `outputs`: (option, path); `inputs`:
    (what it is, e.g. "the input" or "the model file", path)."""
    seen: list[tuple[str, Path]] = []
    for option, path in outputs:
        if path is None:
            continue
        for what, source in inputs:
            if source is not None and _same_file(path, source):
                raise ConfigError(
                    f"{option} {path}: is {what}; writing it would destroy it, write somewhere else"
                )
        for other, earlier in seen:
            if _same_file(path, earlier):
                raise ConfigError(
                    f"{option} {path}: is also the {other} output; give each output its own file"
                )
        seen.append((option, path))


def image_format(path: Path) -> str:
    """The format to draw `path` in: its suffix, or PNG when it has none (the temp file it is
    drawn to first has its own suffix, so writers are told the format, never left to guess)."""
    return path.suffix.lower().lstrip(".") or "png"


def write_image(path: Path, draw: Callable[[Path, str], object]) -> None:
    """`draw(temp path, format)` makes the image `path` names, whole or not at all."""
    with atomic_output(path) as tmp:
        draw(tmp, image_format(path))


@contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yield a temp path in the folder of the file `path` names (through symlinks); on success
    it replaces that file, on any error or interrupt it is removed. A character device or pipe
    (`/dev/null`) is not replaced: the temp file is drawn in the system temp folder and copied
    into it. The file is created by the writer, so its mode follows the umask like any other."""
    in_place = check_output_target(path) in IN_PLACE_KINDS
    real = Path(tempfile.gettempdir()) / path.name if in_place else Path(os.path.realpath(path))
    tmp = real.with_name(f".{real.stem}.{secrets.token_hex(4)}.tmp{real.suffix}")
    mode = None if in_place else replaced_mode(real)
    try:
        yield tmp
        if in_place:
            write_in_place(path, tmp.read_bytes())
            tmp.unlink()
        else:
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, real)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename is not None and Path(exc.filename) == tmp:
            raise not_creatable(exc, path, tmp.parent) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
