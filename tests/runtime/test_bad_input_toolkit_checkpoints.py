"""`DiskMap` and the lazy `Checkpoint` reader against damaged and hostile checkpoints: a header
that lies about offsets, shapes or dtypes, an index that points outside its folder or at the
wrong shard, bad converters and options. Each is one `FlextensorError` line, raised before any
tensor bytes are read or allocated."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertModel

from flextensor_runtime import AutoWrappedLinear, DiskMap, enable_vram_management
from flextensor_runtime import skip_model_initialization as on_meta
from flextensor_runtime.errors import (
    BackendUnavailableError,
    ConfigError,
    DiskMapError,
    FlextensorError,
    ModelFileError,
)
from flextensor_runtime.lazy_load import Checkpoint
from tests.runtime.conftest import assert_same, snapshot


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.arange(16.0).reshape(4, 4), "b": torch.ones(4)}, str(path))
    return path


def _with_header(src: Path, dst: Path, edit: Callable[[dict[str, Any]], object]) -> Path:
    """Copy `src` with its JSON header rewritten by `edit` (tensor bytes unchanged)."""
    raw = src.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    encoded = json.dumps(header).encode()
    dst.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + n :])
    return dst


LYING_HEADERS: list[tuple[str, Callable[[dict[str, Any]], object], str]] = [
    ("offsets past the file", lambda h: h["w"].update(data_offsets=[0, 10**12]),
     r"claims bytes \[0, 1000000000000\)"),
    ("negative offsets", lambda h: h["w"].update(data_offsets=[-8, 56]),
     r"data_offsets \[-8, 56\]"),
    ("shape larger than the bytes", lambda h: h["w"].update(shape=[1000, 1000]),
     "for 4000000 bytes of data"),
    ("entry not an object", lambda h: h.update(w=5), "entry 5 lacks dtype/shape/data_offsets"),
    ("no dtype", lambda h: h["w"].pop("dtype"), "lacks dtype/shape/data_offsets"),
    ("shape a string", lambda h: h["w"].update(shape="ab"), "has shape 'ab'"),
    ("dtype narrower than the bytes", lambda h: h["w"].update(dtype="F16"),
     "for 32 bytes of data"),
]  # fmt: skip


@pytest.mark.parametrize(
    "edit, message", [c[1:] for c in LYING_HEADERS], ids=[c[0] for c in LYING_HEADERS]
)
def test_lazy_checkpoint_refuses_a_lying_header_before_reading(
    good: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    bad = _with_header(good, tmp_path / "bad.safetensors", edit)
    with pytest.raises(ModelFileError, match=message):
        Checkpoint(bad)
    with pytest.raises(DiskMapError, match=r"cannot open .* as safetensors"):  # same file
        DiskMap(bad, "cpu").load("w")


def test_lazy_checkpoint_names_a_missing_tensor_and_a_non_object_header(
    good: Path, tmp_path: Path
) -> None:
    with pytest.raises(ModelFileError, match="has no tensor 'zz'"):
        Checkpoint(good).read_into("zz", torch.empty(1))
    listed = tmp_path / "list.safetensors"
    listed.write_bytes(struct.pack("<Q", 5) + b"[1,2]")
    with pytest.raises(ModelFileError, match="the header is not a JSON object of tensors"):
        Checkpoint(listed)


def test_lazy_checkpoint_still_reads_a_good_file(good: Path) -> None:
    dst = torch.empty(4, 4)
    Checkpoint(good).read_into("w", dst)
    assert torch.equal(dst, torch.arange(16.0).reshape(4, 4))


def _index(folder: Path, weight_map: object) -> Path:
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    return index


BAD_INDEXES: list[tuple[str, object, str]] = [
    ("weight_map a list", [1], "is not a {tensor name: shard file} object"),
    ("shard an int", {"w": 3}, "is not a {tensor name: shard file} object"),
    ("shard outside the folder", {"w": "../model.safetensors"}, "must be .safetensors files"),
    ("shard not safetensors", {"w": "weights.bin"}, "must be .safetensors files"),
    ("tensor not in its shard", {"q": "model.safetensors"}, "which does not hold it"),
]  # fmt: skip


@pytest.mark.parametrize(
    "weight_map, message", [c[1:] for c in BAD_INDEXES], ids=[c[0] for c in BAD_INDEXES]
)
def test_diskmap_refuses_a_bad_index(
    good: Path, tmp_path: Path, weight_map: object, message: str
) -> None:
    nested = tmp_path / "nested"
    nested.mkdir()
    (nested / "model.safetensors").write_bytes(good.read_bytes())
    with pytest.raises(DiskMapError, match=message.replace("{", r"\{").replace("}", r"\}")):
        DiskMap(_index(nested, weight_map), "cpu")


def test_lazy_checkpoint_refuses_an_index_pointing_outside_its_folder(
    good: Path, tmp_path: Path
) -> None:
    nested = tmp_path / "nested"
    nested.mkdir()
    with pytest.raises(ModelFileError, match="files next to the index"):
        Checkpoint(_index(nested, {"w": "../model.safetensors"}))
    with pytest.raises(ModelFileError, match="weight_map is not a"):
        Checkpoint(_index(nested, [1]))


def _raise(_: dict[str, str]) -> dict[str, str]:
    raise KeyError("prefix")


BAD_CONVERTERS: list[tuple[str, Callable[[dict[str, str]], object], str]] = [
    ("raises", _raise, "state_dict_converter raised KeyError"),
    ("int key", lambda sd: {3: "w"}, "returned the entry 3: 'w'"),
    ("list value", lambda sd: {"x": ["w"]}, r"returned the entry 'x': \['w'\]"),
]  # fmt: skip


@pytest.mark.parametrize(
    "converter, message", [c[1:] for c in BAD_CONVERTERS], ids=[c[0] for c in BAD_CONVERTERS]
)
def test_diskmap_reports_a_bad_converter(
    good: Path, converter: Callable[[dict[str, str]], Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        DiskMap(good, "cpu", state_dict_converter=converter)


BAD_OPTIONS: list[tuple[str, Callable[[Path], object], type[Exception], str]] = [
    ("missing backend", lambda p: DiskMap(p, "xpu:3"), BackendUnavailableError,
     "'xpu:3' is not available"),
    ("infinite buffer", lambda p: DiskMap(p, "cpu", buffer_size=float("inf")), ConfigError,
     "buffer_size=inf is invalid"),
    ("empty file list", lambda p: DiskMap([], "cpu"), DiskMapError, "empty list"),
    ("load dtype a string", lambda p: DiskMap(p, "cpu").load("w", "float16"),  # type: ignore[arg-type]
     ConfigError, "torch_dtype='float16' is invalid"),
    ("integer map dtype", lambda p: DiskMap(p, "cpu", torch_dtype=torch.int8), ConfigError,
     "DiskMap torch_dtype=torch.int8 is invalid; pass a floating torch.dtype"),
    ("integer load dtype", lambda p: DiskMap(p, "cpu").load("w", torch.int8), ConfigError,
     "DiskMap.load torch_dtype=torch.int8 is invalid"),
    ("load device unknown", lambda p: DiskMap(p, "cpu").load("w", None, "gpux"), ConfigError,
     "DiskMap.load device 'gpux' is not a torch device"),
]  # fmt: skip


@pytest.mark.parametrize(
    "call, error, message", [c[1:] for c in BAD_OPTIONS], ids=[c[0] for c in BAD_OPTIONS]
)
def test_diskmap_refuses_bad_options(
    good: Path, call: Callable[[Path], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call(good)


@pytest.mark.parametrize("payload", [b"garbage", b"\x80\x02garbage"], ids=["text", "pickle"])
def test_diskmap_reports_a_damaged_torch_file(tmp_path: Path, payload: bytes) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(payload)
    with pytest.raises(FlextensorError, match=r"cannot load .* with weights_only=True"):
        DiskMap(path, "cpu")


BERT = BertConfig(
    vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
    intermediate_size=32, max_position_embeddings=16,
)  # fmt: skip


def _bert_checkpoint(tmp_path: Path, edit: Callable[[dict[str, torch.Tensor]], object]) -> Path:
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in BertModel(BERT).state_dict().items()}
    edit(state)
    path = tmp_path / "bert.safetensors"
    save_file(state, str(path))
    return path


BAD_CHECKPOINTS: list[tuple[str, Callable[[dict[str, torch.Tensor]], object], str]] = [
    ("lacks a key", lambda sd: sd.pop("pooler.dense.weight"),
     "checkpoint has no tensor 'pooler.dense.weight'"),
    ("wrong shape", lambda sd: sd.update({"pooler.dense.weight": torch.zeros(3, 16)}),
     r"'pooler.dense.weight' is floating \[3, 16\] but module 'pooler.dense' needs"),
    ("integer weights", lambda sd: sd.update({"pooler.dense.bias": torch.zeros(16, dtype=torch.int32)}),
     r"'pooler.dense.bias' is integer \[16\]"),
]  # fmt: skip


@pytest.mark.parametrize(
    "edit, message", [c[1:] for c in BAD_CHECKPOINTS], ids=[c[0] for c in BAD_CHECKPOINTS]
)
def test_disk_tier_checks_the_checkpoint_before_dropping_weights(
    tmp_path: Path, edit: Callable[[dict[str, torch.Tensor]], object], message: str
) -> None:
    """A model built normally keeps its real weights when the checkpoint does not fit it, and
    a model built on meta gets the error at install time, not at its first forward."""
    disk_map = DiskMap(_bert_checkpoint(tmp_path, edit), "cpu")
    disk = dict(offload_device="disk", onload_device="disk", computation_device="cpu")
    linear = {torch.nn.Linear: AutoWrappedLinear}
    torch.manual_seed(0)
    model = BertModel(BERT).eval()
    before = snapshot(model)
    with pytest.raises(DiskMapError, match=message):
        enable_vram_management(model, linear, disk, disk_map=disk_map)
    assert_same(model, before)
    assert not getattr(model, "vram_management_enabled", False)
    with on_meta():
        meta_model = BertModel(BERT).eval()
    with pytest.raises(DiskMapError, match=message):
        enable_vram_management(meta_model, linear, disk, disk_map=disk_map)


def _outcome_within(call: Callable[[], object], seconds: float) -> BaseException | None:
    """Run `call` on a daemon thread; the exception it raised (None: returned), or fail if it
    is still blocked after `seconds`."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # handed back to the test
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail(f"still blocked after {seconds} s")
    return outcome[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_shard_that_is_a_pipe_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "model-00001.safetensors")
    index = _index(tmp_path, {"w": "model-00001.safetensors"})
    lazy = _outcome_within(lambda: Checkpoint(index), 5.0)
    assert isinstance(lazy, ModelFileError) and "is not a regular file" in str(lazy)
    mapped = _outcome_within(lambda: DiskMap(index, "cpu"), 5.0)
    assert isinstance(mapped, DiskMapError) and "missing" in str(mapped)


_TRUNCATE_AFTER_OPEN = """
import os, sys
import torch
from safetensors.torch import save_file
from flextensor_runtime import DiskMap
from flextensor_runtime.errors import DiskMapError

path = sys.argv[1]
save_file({"w": torch.ones(256, 256)}, path)
disk_map = DiskMap(path, "cpu")
assert torch.equal(disk_map["w"], torch.ones(256, 256))
os.truncate(path, 200)  # e.g. the checkpoint is being rewritten by another process
try:
    disk_map["w"]
except DiskMapError as exc:
    print("DiskMapError:", exc)
save_file({"other": torch.ones(2)}, path)
try:
    disk_map["w"]
except DiskMapError as exc:
    print("DiskMapError:", exc)
"""


def test_a_checkpoint_changed_after_opening_is_an_error_not_a_bus_error(tmp_path: Path) -> None:
    """Reading a memory mapping of a truncated file raises SIGBUS and kills the process; the
    map notices the file changed and reopens it instead (run in a child process)."""
    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", _TRUNCATE_AFTER_OPEN, str(tmp_path / "m.safetensors")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert "file not fully covered" in lines[0]
    assert "can no longer be read" in lines[1] and "build a new DiskMap" in lines[1]
