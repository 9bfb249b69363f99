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
import math
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


def _bad_header(path: Path, what: str) -> ModelFileError:
    return ModelFileError(f"{path}: {what}; the header is damaged, re-save the checkpoint")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _stored(path: Path, name: str, info: object, data_start: int, body_bytes: int) -> StoredTensor:
    """One header entry, checked so that a lying header can neither read outside the tensor
    data nor make a reader allocate more than the file holds."""
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise _bad_header(path, f"tensor {name!r} entry {info!r} lacks dtype/shape/data_offsets")
    dtype = _DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        raise ModelFileError(
            f"{path}: tensor {name!r} has unsupported dtype {info['dtype']!r}; convert the checkpoint"
        )
    shape, offsets = info["shape"], info["data_offsets"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise _bad_header(path, f"tensor {name!r} has shape {shape!r}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets)):
        raise _bad_header(path, f"tensor {name!r} has data_offsets {offsets!r}")
    begin, end = offsets
    nbytes = math.prod(shape) * dtype.itemsize
    if not begin <= end <= body_bytes or end - begin != nbytes:
        raise _bad_header(
            path,
            f"tensor {name!r} claims bytes [{begin}, {end}) for {nbytes} bytes of data, "
            f"but the file holds {body_bytes}",
        )
    return StoredTensor(path, dtype, tuple(shape), data_start + begin, nbytes)


def _read_header(path: Path) -> dict[str, StoredTensor]:
    if path.exists() and not path.is_file():  # reading a pipe or a device would block
        raise ModelFileError(
            f"{path} is not a regular file (a folder, pipe or device); pass .safetensors files"
        )
    try:
        with path.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > _MAX_HEADER_BYTES:
                raise ModelFileError(
                    f"{path}: header of {n} bytes is not safetensors; pass a .safetensors file"
                )
            header: Any = json.loads(fh.read(n))
        body_bytes = path.stat().st_size - 8 - n
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(
            f"{path}: cannot read a safetensors header ({exc}); pass a valid .safetensors file"
        ) from None
    if not isinstance(header, dict) or body_bytes < 0:
        raise _bad_header(path, "the header is not a JSON object of tensors")
    return {
        name: _stored(path, name, info, 8 + n, body_bytes)
        for name, info in header.items()
        if name != "__metadata__"
    }


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
            except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
                raise ModelFileError(
                    f"{p}: not a sharded safetensors index ({exc}); pass the index json"
                ) from None
            if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) and Path(v).name == v for v in weight_map.values()
            ):  # a shard outside the index's folder is a hostile index
                raise ModelFileError(
                    f"{p}: weight_map is not a {{tensor name: shard file name}} object of files "
                    "next to the index; pass the index json"
                )
            for shard in sorted(set(weight_map.values())):
                self.tensors.update(_read_header(p.parent / shard))
        else:
            self.tensors = _read_header(p)
        self._staging: torch.Tensor | None = None

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Raise `ModelFileError` unless tensor `name` is stored with `shape`."""
        st = self.tensors.get(name)
        if st is None:
            raise ModelFileError(
                f"checkpoint {self.path} has no tensor {name!r}; pass the checkpoint this model "
                "was built for"
            )
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
            self._staging = torch.empty(st.nbytes, dtype=torch.uint8, device="cpu")
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
