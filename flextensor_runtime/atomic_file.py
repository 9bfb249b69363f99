"""Writing a file atomically: the whole new content or the old file, never a part.

Owns: `write_atomic(path, data)`: a temp file in the target's folder, written and fsynced, given
the mode a plain `open(path, "w")` would give (0o666 less the umask; `mkstemp` alone makes it
0o600, so other users and services could not read a saved profile), then renamed over the
target; on any error or interrupt the temp file is removed and the target is left as it was.
Must not know: what the bytes are (profiles, stats), torch.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic"]


def _plain_mode() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace `path` with `data` atomically (temp file in the same folder, fsync, rename)."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), _plain_mode())
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
