"""Reading safetensors checkpoints (one file or a sharded index) straight into final buffers.

Owns: parsing the safetensors header (names, dtypes, shapes, byte ranges) and the shard index,
and copying one tensor's bytes from the file into a destination tensor: positioned reads go
directly into host destinations (a pinned buffer slot, a host tensor) with no intermediate copy;
device destinations go through one reusable host staging buffer. The full model is never
materialised twice.
Must not know: profiles, schedules, traps, models.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flextensor_runtime.errors import ConfigError, ModelFileError

__all__ = ["Checkpoint", "StoredTensor"]

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip
_MAX_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes live in a checkpoint file."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


def _read_header(path: Path) -> dict[str, StoredTensor]:
    try:
        with path.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > _MAX_HEADER_BYTES:
                raise ModelFileError(
                    f"{path}: header of {n} bytes is not safetensors; pass a .safetensors file"
                )
            header: dict[str, Any] = json.loads(fh.read(n))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(
            f"{path}: cannot read a safetensors header ({exc}); pass a valid .safetensors file"
        ) from None
    out: dict[str, StoredTensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ModelFileError(
                f"{path}: tensor {name!r} has unsupported dtype {info['dtype']!r}; convert the checkpoint"
            )
        begin, end = info["data_offsets"]
        out[name] = StoredTensor(path, dtype, tuple(info["shape"]), 8 + n + begin, end - begin)
    return out


class Checkpoint:
    """A safetensors checkpoint: `model.safetensors`, or `model.safetensors.index.json` shards."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(
                f"checkpoint={path!r} is invalid; pass the path of a .safetensors file or its index"
            )
        p = Path(path)
        if not p.is_file():
            what = ("is a folder, not a file" if p.is_dir() else
                    "is not a regular file (a device or a pipe)" if p.exists() else
                    "does not exist")  # fmt: skip
            raise ModelFileError(f"checkpoint {p} {what}; pass a .safetensors file or its index")
        self.path = p
        self.tensors: dict[str, StoredTensor] = {}
        if p.name.endswith(".json"):
            try:
                weight_map = json.loads(p.read_text())["weight_map"]
            except (OSError, KeyError, json.JSONDecodeError) as exc:
                raise ModelFileError(
                    f"{p}: not a sharded safetensors index ({exc}); pass the index json"
                ) from None
            for shard in sorted(set(weight_map.values())):
                self.tensors.update(_read_header(p.parent / shard))
        else:
            self.tensors = _read_header(p)
        self._staging: torch.Tensor | None = None

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Raise `ModelFileError` unless tensor `name` is stored with `shape`."""
        st = self.tensors[name]
        if tuple(shape) != st.shape:
            raise ModelFileError(
                f"checkpoint tensor {name!r} has shape {list(st.shape)} but the model expects "
                f"{list(shape)}; pass the checkpoint this model was built for"
            )

    def read_into(self, name: str, dst: torch.Tensor) -> None:
        """Fill `dst` with tensor `name` (converting dtype if the file stores another)."""
        self.check_shape(name, tuple(dst.shape))
        st = self.tensors[name]
        direct = dst.device.type == "cpu" and dst.dtype == st.dtype and dst.is_contiguous()
        if direct:
            self._pread(st, dst)
            return
        tmp = self._stage(st)
        dst.copy_(tmp)

    def _stage(self, st: StoredTensor) -> torch.Tensor:
        if self._staging is None or self._staging.numel() < st.nbytes:
            self._staging = torch.empty(st.nbytes, dtype=torch.uint8)
        buf = self._staging[: st.nbytes]
        self._pread(st, buf)
        return buf.view(st.dtype).view(st.shape)

    def release_staging(self) -> None:
        self._staging = None

    @staticmethod
    def _pread(st: StoredTensor, dst: torch.Tensor) -> None:
        if st.nbytes == 0:
            return
        view = memoryview(dst.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
        with st.path.open("rb", buffering=0) as fh:
            fh.seek(st.start)
            got = 0
            while got < st.nbytes:
                n = fh.readinto(view[got:])
                if not n:
                    raise ModelFileError(
                        f"{st.path}: file ends inside a tensor; the checkpoint is truncated"
                    )
                got += n
