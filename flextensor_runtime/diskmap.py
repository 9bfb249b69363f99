"""`DiskMap`: a lazy mapping from checkpoint tensor names to materialised tensors.

Owns: resolving a checkpoint (one safetensors file, a sharded `*.safetensors.index.json`, a
folder holding either, a list of files, or a PyTorch `.bin`/`.pt` file) into name -> file,
memory-mapped reads of one tensor at a time, key renaming through a state-dict converter, and
reopening files after `buffer_size` elements have been read so mapped pages do not pile up in
host memory.
Must not know: modules, wrappers, placements.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import torch
from safetensors import safe_open

from flextensor_runtime.counts import count_of
from flextensor_runtime.device_names import usable_device
from flextensor_runtime.errors import ConfigError, DiskMapError

__all__ = ["DiskMap"]

PathLike = Union[str, Path]
TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
# (state dict {name: source key}) -> renamed {new name: source key}
StateDictConverter = Callable[[dict[str, str]], Mapping[str, str]]


def _index_weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DiskMapError(
            f"cannot read the weight_map of {index}: ({exc}); pass a valid "
            "model.safetensors.index.json"
        ) from exc
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise DiskMapError(
            f"the weight_map of {index} is not a {{tensor name: shard file}} object of strings: "
            "pass a valid model.safetensors.index.json"
        )
    return weight_map


def _index_files(index: Path) -> dict[str, Path]:
    files = {}
    for name, shard in _index_weight_map(index).items():
        path = index.parent / shard
        # a shard is a safetensors file next to the index; anything else is a hostile index
        if Path(shard).name != shard or not shard.endswith(".safetensors"):
            raise DiskMapError(
                f"{index} maps {name!r} to shard {shard!r}: shards must be .safetensors files "
                "in the index's folder; fix the index"
            )
        files[name] = path
    missing = sorted({str(f) for f in files.values() if not f.is_file()})
    if missing:
        raise DiskMapError(
            f"{index} names {count_of(len(missing), 'missing shard')}, e.g. {missing[0]}: restore the "
            "files or pass the index of a complete checkpoint"
        )
    return files


def _checkpoint_files(path: PathLike | Sequence[PathLike]) -> list[Path]:
    if isinstance(path, (list, tuple)):
        if not path:
            raise DiskMapError("DiskMap got an empty list of checkpoint files: pass at least one")
        return [f for p in path for f in _checkpoint_files(p)]
    if not isinstance(path, (str, Path)):
        raise ConfigError(
            f"DiskMap path {path!r} of type {type(path).__name__} is invalid; pass a str or "
            "Path (or a list of them) naming a checkpoint file or folder"
        )
    p = Path(path)
    if p.is_dir():
        for candidate in ("model.safetensors.index.json", "model.safetensors"):
            if (p / candidate).is_file():
                return [p / candidate]
        found = sorted(p.glob("*.safetensors"))
        if found:
            return found
    if not p.is_file():
        raise DiskMapError(
            f"no checkpoint at {p}: pass a .safetensors, .bin/.pt or index.json file or a folder"
        )
    return [p]


def _check_dtype(dtype: object, what: str) -> None:
    """None or a floating dtype: floating weights cast to an integer dtype lose their values."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ConfigError(
            f"{what}={dtype!r} is invalid; pass a floating torch.dtype such as torch.float16"
        )


def _check_options(torch_dtype: object, converter: object, buffer_size: object) -> None:
    _check_dtype(torch_dtype, "DiskMap torch_dtype")
    if converter is not None and not callable(converter):
        raise ConfigError(
            f"DiskMap state_dict_converter={converter!r} is invalid; pass a callable "
            "{name: name} -> {new name: stored name}"
        )
    number = isinstance(buffer_size, (int, float)) and not isinstance(buffer_size, bool)
    whole = number and (isinstance(buffer_size, int) or float(buffer_size).is_integer())  # type: ignore[arg-type]
    if not whole or not 1 <= buffer_size < float("inf"):  # type: ignore[operator]
        raise ConfigError(
            f"DiskMap buffer_size={buffer_size!r} is invalid; pass a whole, finite tensor element "
            "count >= 1 (e.g. 10**9)"
        )


def _device(device: object, what: str) -> torch.device:
    try:
        resolved = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"{what} {device!r} is not a torch device; pass 'cpu' or 'cuda'") from exc
    return usable_device(resolved, what)


def _converted(converter: StateDictConverter, identity: dict[str, str]) -> dict[str, str]:
    try:
        result = converter(identity)
    except Exception as exc:  # the user's code: any error is a bad converter
        raise ConfigError(
            f"state_dict_converter raised {type(exc).__name__}: {exc}; fix the converter so it "
            "maps {name: name} to {new name: stored name}"
        ) from exc
    if not isinstance(result, Mapping):
        raise ConfigError(
            f"state_dict_converter returned {type(result).__name__}; return a dict "
            "{new name: stored name}"
        )
    bad = [(k, v) for k, v in result.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise ConfigError(
            f"state_dict_converter returned the entry {bad[0][0]!r}: {bad[0][1]!r}; names and "
            "stored names must both be str"
        )
    return dict(result)


class DiskMap(Mapping[str, torch.Tensor]):
    """Lazy mapping from checkpoint parameter names to materialized tensors.

    Safetensors files stay memory-mapped and one tensor is read per lookup. PyTorch `.bin`/`.pt`
    files go through `torch.load(weights_only=True)` (memory-mapped when the file allows it);
    their top-level tensors are used, or those under a nested "state_dict" (Lightning `.ckpt`).
    A name held by two different files is a DiskMapError. Two maps are equal only when they
    are the same object (comparing values would read every tensor).
    `state_dict_converter` receives {name: name} for every stored tensor and returns the renamed
    {new name: stored name}; it may rename and drop keys, not compute tensors. After
    `buffer_size` tensor elements have been materialized the files are reopened.
    """

    def __init__(
        self,
        path: PathLike | Sequence[PathLike],
        device: str | torch.device,
        torch_dtype: torch.dtype | None = None,
        state_dict_converter: StateDictConverter | None = None,
        buffer_size: int = 10**9,
    ) -> None:
        self.path = path
        self.device = _device(device, "DiskMap device")
        _check_options(torch_dtype, state_dict_converter, buffer_size)
        self.torch_dtype = torch_dtype
        self.buffer_size = int(buffer_size)
        self.materialized_elements = 0
        self.reopen_count = 0
        self._handles: dict[Path, tuple[Any, tuple[int, int]]] = {}  # file -> (handle, stamp)
        self._files: dict[str, Path] = {}
        for file in _checkpoint_files(path):
            _merge_names(self._files, self._scan(file))
        self._sources = self._renamed(state_dict_converter)

    def _scan(self, file: Path) -> dict[str, Path]:
        if file.name.endswith(".index.json"):
            files = _index_files(file)
            stored = {shard: set(self._open(shard).keys()) for shard in set(files.values())}
            for name, shard in files.items():  # headers only: no tensor is read
                if name not in stored[shard]:
                    raise DiskMapError(
                        f"{file} maps {name!r} to {shard.name}, which does not hold it: fix the "
                        "index or restore the shard"
                    )
            return files
        if file.suffix == ".safetensors":
            return dict.fromkeys(self._open(file).keys(), file)
        if file.suffix in TORCH_SUFFIXES:
            return dict.fromkeys(self._open(file).keys(), file)
        raise DiskMapError(
            f"unsupported checkpoint file {file}: use .safetensors, .bin, .pt, .pth or .ckpt"
        )

    def _renamed(self, converter: StateDictConverter | None) -> dict[str, str]:
        identity = {name: name for name in self._files}
        if converter is None:
            return identity
        renamed = _converted(converter, identity)
        for new, source in renamed.items():
            if source not in self._files:
                raise DiskMapError(
                    f"state_dict_converter mapped {new!r} to {source!r}, which is not a stored "
                    "tensor: the converter may only rename or drop keys"
                )
        return renamed

    def _open(self, file: Path) -> Any:
        """The open handle of `file`, reopened when the file changed since it was opened:
        reading a mapping of a file truncated underneath it kills the process (SIGBUS)."""
        stamp = _stamp(file)
        if stamp is None:
            raise DiskMapError(
                f"checkpoint shard {file} is missing or not a regular file: restore the file"
            )
        entry = self._handles.get(file)
        if entry is None or entry[1] != stamp:
            entry = (_open_file(file), stamp)  # checks the header against the new size
            self._handles[file] = entry
        return entry[0]

    def reopen(self) -> None:
        """Close every file; each is reopened on its next lookup (releases mapped pages)."""
        self._handles.clear()
        self.materialized_elements = 0
        self.reopen_count += 1

    def load(
        self,
        name: str,
        torch_dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
    ) -> torch.Tensor:
        """Read one tensor at `torch_dtype` (default: the map's) on `device` (default: the map's)."""
        _check_dtype(torch_dtype, "DiskMap.load torch_dtype")
        source = self._sources.get(name)
        if source is None:
            raise DiskMapError(
                f"tensor {name!r} is not in checkpoint {self.path}: check the module name "
                "prefix or pass a state_dict_converter that renames it"
            )
        if self.materialized_elements >= self.buffer_size:
            self.reopen()
        handle = self._open(self._files[source])
        try:
            stored = handle.get_tensor(source)
        except Exception as exc:  # the file was rewritten without this tensor
            raise DiskMapError(
                f"tensor {source!r} can no longer be read from {self._files[source]} "
                f"({type(exc).__name__}): the file changed; build a new DiskMap"
            ) from exc
        dtype = torch_dtype or self.torch_dtype
        if dtype is None or not stored.is_floating_point():
            dtype = stored.dtype
        target = _device(device, "DiskMap.load device") if device is not None else self.device
        # always a copy into owned, aligned memory: a view of the mapping would pin its pages
        # and unaligned operands change the CPU GEMM kernels (results no longer bit-exact)
        out = stored.to(device=target, dtype=dtype, copy=True)
        self.materialized_elements += out.numel()
        return out

    def stored_layout(self, name: str) -> tuple[tuple[int, ...], bool]:
        """(shape, is floating point) of tensor `name` as stored, read from the header only."""
        source = self._sources.get(name)
        if source is None:
            raise DiskMapError(f"tensor {name!r} is not in checkpoint {self.path}")
        handle = self._open(self._files[source])
        if isinstance(handle, _TorchFile):
            tensor = handle.get_tensor(source)
            return tuple(tensor.shape), tensor.is_floating_point()
        part = handle.get_slice(source)  # safetensors: header fields, no data read
        return tuple(part.get_shape()), str(part.get_dtype()).startswith(("F", "BF"))

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.load(name)

    def __contains__(self, name: object) -> bool:
        return name in self._sources

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)

    def __eq__(self, other: object) -> bool:
        # identity: Mapping's value comparison would read every tensor (and `==` on tensors
        # is elementwise, so it raised "Boolean value of Tensor ... is ambiguous")
        return self is other

    __hash__ = object.__hash__

    def __deepcopy__(self, memo: dict[int, Any]) -> DiskMap:
        return self  # read-only and holding open files: copies of a model share it

    def __copy__(self) -> DiskMap:
        return self

    def __repr__(self) -> str:
        return f"DiskMap({self.path!r}, device={str(self.device)!r}, tensors={len(self)})"


class _TorchFile:
    """A PyTorch checkpoint behind the same two calls as a safetensors handle."""

    def __init__(self, file: Path) -> None:
        try:
            state = _torch_load(file)
        except Exception as exc:  # torch raises many types for a damaged or unsafe file
            raise DiskMapError(
                f"cannot load {file} with weights_only=True ({type(exc).__name__}): convert it to "
                "safetensors"
            ) from exc
        if not isinstance(state, Mapping):
            raise DiskMapError(f"{file} holds {type(state).__name__}, not a state dict: re-save it")
        self._tensors = _state_dict_tensors(file, state)

    def keys(self) -> list[str]:
        return list(self._tensors)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._tensors[name]


def _merge_names(files: dict[str, Path], scanned: Mapping[str, Path]) -> None:
    """Add `scanned` to `files`, refusing a name two different files both hold (which one
    would be read depended on the order the files were given)."""
    for name, file in scanned.items():
        known = files.setdefault(name, file)
        if known != file and known.resolve() != file.resolve():
            raise DiskMapError(
                f"tensor {name!r} is in both {known} and {file}: DiskMap cannot tell which to "
                "read; pass the files of one checkpoint only (or drop one of these files)"
            )


def _tensors_of(state: Mapping[Any, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}


def _state_dict_tensors(file: Path, state: Mapping[Any, Any]) -> dict[str, torch.Tensor]:
    """The tensors of a loaded PyTorch checkpoint: its top-level tensors, or, when it has
    none, those of a nested "state_dict" mapping (Lightning and many trainers save
    {"state_dict": {...}, "epoch": ...}). Other values (epochs, optimizer states) are skipped."""
    tensors = _tensors_of(state)
    nested = state.get("state_dict")
    if not tensors and isinstance(nested, Mapping):
        tensors = _tensors_of(nested)
    if not tensors:
        keys = sorted(str(k) for k in state)[:8]
        raise DiskMapError(
            f"{file} holds no tensors at its top level or under 'state_dict' (top-level keys: "
            f"{keys}): re-save the state dict itself, e.g. torch.save(ckpt['model'], path)"
        )
    return tensors


def _stamp(file: Path) -> tuple[int, int] | None:
    """(size, modification time) of a regular file; None when missing or not regular."""
    try:
        st = file.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


def _torch_load(file: Path) -> Any:
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # legacy (non-zip) files cannot be memory-mapped
        return torch.load(file, map_location="cpu", weights_only=True)


def _open_file(file: Path) -> Any:
    if file.suffix == ".safetensors":
        try:
            return safe_open(str(file), framework="pt", device="cpu")
        except Exception as exc:  # safetensors raises its own error types
            raise DiskMapError(
                f"cannot open {file} as safetensors ({exc}): check the file is complete"
            ) from exc
    return _TorchFile(file)
