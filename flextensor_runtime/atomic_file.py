"""Writing a file atomically: the whole new content or the old file, never a part.

Owns: `write_atomic(path, data)`: a temp file in the target's folder, written and fsynced, given
the mode a plain `open(path, "w")` would give (0o666 less the umask; `mkstemp` alone makes it
0o600, so other users and services could not read a saved profile) or, replacing a file, that
file's mode (a private file stays private; a read-only one is refused), then renamed over the
target; on any error or interrupt the temp file is removed and the target is left as it was.
A symlink is written through (its target file is replaced, the link stays a link). A target that
is not a regular file is never replaced by one: a character device (`/dev/null`) or a named pipe
with a reader is written to in place, a pipe without a reader, a socket or a block device is
refused (`output_kind`, `check_output_target`, `write_in_place`). Must not know: what the bytes
are (profiles, stats), torch.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from flextensor_runtime.errors import ConfigError

__all__ = ["IN_PLACE_KINDS", "check_output_target", "not_creatable", "output_kind",
           "replaced_mode", "write_atomic", "write_in_place"]  # fmt: skip

_KINDS = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"), (stat.S_ISCHR, "character device"),
          (stat.S_ISFIFO, "named pipe"), (stat.S_ISBLK, "block device"),
          (stat.S_ISSOCK, "socket"))  # fmt: skip
# Written in place rather than replaced: replacing `/dev/null` with a file would break the system.
IN_PLACE_KINDS = ("character device", "named pipe")


def output_kind(path: str | os.PathLike[str]) -> str:
    """What `path` names once symlinks are followed: "missing", "file", "folder", "character
    device", "named pipe", "block device" or "socket"."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    return next((name for test, name in _KINDS if test(mode)), "special file")


def check_output_target(path: str | os.PathLike[str], what: str = "") -> str:
    """The kind of `path` (see `output_kind`), or ConfigError when nothing can be written there
    as a file: a block device, a socket. `what` prefixes the message (e.g. "-o p.msgpack")."""
    kind = output_kind(path)
    where = what or str(path)
    if kind not in ("missing", "file", "folder", *IN_PLACE_KINDS):
        raise ConfigError(f"{where}: {str(path)!r} is a {kind}, not a file; give a file path")
    if kind == "file" and not os.access(path, os.W_OK):  # as `>` would: no replacing it either
        raise ConfigError(f"{where}: the file is read-only; make it writable (chmod u+w) or "
                          "write somewhere else")  # fmt: skip
    return kind


def write_in_place(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to a character device or named pipe without replacing it. A pipe nobody
    reads is an error at once rather than a hang."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise ConfigError(f"{str(path)!r} is a named pipe that no process is reading; start "
                              "the reader first or give a file path") from None  # fmt: skip
        raise
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        raise _named(exc, path) from None
    finally:
        os.close(fd)


def _named(exc: OSError, path: str | os.PathLike[str]) -> OSError:
    """`exc` with the file it was writing named (a failed write, e.g. a full disk, has none)."""
    if exc.filename is not None or exc.errno is None:
        return exc
    return type(exc)(exc.errno, exc.strerror, str(path))


def not_creatable(exc: OSError, target: str | os.PathLike[str], folder: Path) -> OSError:
    """The error for a temp file that could not be made: it names the file asked for and its
    folder, not the hidden temp name (`/proc` passes a writability check, then refuses files)."""
    return OSError(exc.errno, f"cannot create {str(target)!r}: the folder {str(folder)!r} "
                   f"refused a new file ({exc.strerror}); write somewhere else")  # fmt: skip


def _plain_mode() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return 0o666 & ~mask


def replaced_mode(real: Path) -> int | None:
    """The permission bits of the file `real` about to be replaced (kept: a private file stays
    private), or None when there is none."""
    try:
        return stat.S_IMODE(os.stat(real).st_mode)
    except OSError:
        return None


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace `path` with `data` atomically (temp file in the same folder, fsync, rename);
    a device or pipe is written in place, a symlink is written through."""
    target = Path(path)
    if check_output_target(target) in IN_PLACE_KINDS:
        write_in_place(target, data)
        return target
    real = Path(os.path.realpath(target))  # through symlinks: the link stays, its file changes
    directory = real.parent if str(real.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise not_creatable(exc, target, directory) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            mode = replaced_mode(real)
            os.fchmod(fh.fileno(), _plain_mode() if mode is None else mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, real)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _named(exc, target) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
