"""`make demo`, last step: deploy a compiled profile on the bundled example and check it.

Builds the model from its model file, computes the plain output, installs the profile with
`offload_from_profile` (no warm-up), runs the same inputs on the deployment's device, checks the
outputs are bit-identical to the plain model's there (every tensor of a structured output, such
as a transformers `ModelOutput`; through the model file's `run(model, inputs)` when it has one,
as `ftc profile` calls it), prints the runtime's report, removes the profile and checks again.
Any bundled model file works, e.g. `profiles/minilm.py` with a profile `ftc profile` made for it.

    python -m profiles.demo MODEL_FILE PROFILE
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils._pytree import tree_map

from flextensor_runtime import handle, offload_from_profile
from flextensor_runtime.model_tensors import inner_fields


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _forward(mf: ModuleType, model: torch.nn.Module, inputs: object) -> Any:
    """The model file's `run(model, inputs)` when it has one (as `ftc profile` calls it), else
    the model called with the inputs."""
    with torch.inference_mode():
        if callable(getattr(mf, "run", None)):
            return mf.run(model, inputs)
        return model(*inputs) if isinstance(inputs, tuple) else model(**inputs)  # type: ignore[arg-type]


def _tensors(value: Any) -> list[Any]:
    """The output's tensors in order, and its other leaves: a tensor, or tuples, lists and
    mappings (a transformers `ModelOutput` is one) of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [x for key in value for x in (key, *_tensors(value[key]))]
    if isinstance(value, (tuple, list)):
        return [x for item in value for x in _tensors(item)]
    return [value]


def same_outputs(a: Any, b: Any) -> bool:
    """Whether two outputs hold the same structure and bit-identical tensors."""
    xs, ys = _tensors(a), _tensors(b)
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys, strict=True):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if not (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y):
            return False
    return True


def _on(device: torch.device, value: Any) -> Any:
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, value)


def _reference_on(mf: ModuleType, device: torch.device, inputs: object) -> Any:
    """The plain model's output on `device` (the deployment's: on a GPU, bit-identical outputs
    are only expected from the same device), from a second copy of the model."""
    torch.manual_seed(0)
    reference = mf.build_model().eval().to(device)
    for param in reference.parameters():  # .to() leaves inner tensor fields where they were
        for name, value in inner_fields(param):
            setattr(param, name, value.to(device))
    return _forward(mf, reference, inputs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_file", type=Path)
    parser.add_argument("profile", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    mf = _load(args.model_file)
    model = mf.build_model().eval()
    inputs = mf.example_inputs()
    plain = _forward(mf, model, inputs)

    start = time.perf_counter()
    offload_from_profile(model, args.profile)
    install_s = time.perf_counter() - start
    device = handle(model).backend.device
    on_device = _on(device, inputs)
    expected = plain if device.type == "cpu" else _reference_on(mf, device, on_device)
    start = time.perf_counter()
    offloaded = _forward(mf, model, on_device)
    first_ms = (time.perf_counter() - start) * 1e3
    same = same_outputs(expected, offloaded)
    print(f"installed {args.profile} in {install_s * 1e3:.1f} ms; first forward {first_ms:.1f} ms "
          f"(no warm-up); outputs bit-identical to the plain model: {same}")  # fmt: skip
    print(handle(model).report().table())
    handle(model).remove()
    restored = same_outputs(plain, _forward(mf, model, inputs))
    print(f"after remove(): outputs bit-identical: {restored}")
    return 0 if same and restored else 1


if __name__ == "__main__":
    sys.exit(main())
