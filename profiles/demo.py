"""`make demo`, last step: deploy a compiled profile on the bundled example and check it.

Builds the model from its model file, computes the plain output, installs the profile with
`offload_from_profile` (no warm-up), runs the same inputs on the deployment's device, checks the
outputs are bit-identical to the plain model's there, prints the runtime's report, removes the profile and checks again.

    python -m profiles.demo MODEL_FILE PROFILE
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
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


def _forward(model: torch.nn.Module, inputs: object) -> torch.Tensor:
    with torch.inference_mode():
        return model(*inputs) if isinstance(inputs, tuple) else model(**inputs)  # type: ignore[arg-type]


def _on(device: torch.device, value: Any) -> Any:
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, value)


def _reference_on(mf: ModuleType, device: torch.device, inputs: object) -> torch.Tensor:
    """The plain model's output on `device` (the deployment's: on a GPU, bit-identical outputs
    are only expected from the same device), from a second copy of the model."""
    torch.manual_seed(0)
    reference = mf.build_model().eval().to(device)
    for param in reference.parameters():  # .to() leaves inner tensor fields where they were
        for name, value in inner_fields(param):
            setattr(param, name, value.to(device))
    return _forward(reference, inputs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_file", type=Path)
    parser.add_argument("profile", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    mf = _load(args.model_file)
    model = mf.build_model().eval()
    inputs = mf.example_inputs()
    plain = _forward(model, inputs)

    start = time.perf_counter()
    offload_from_profile(model, args.profile)
    install_s = time.perf_counter() - start
    device = handle(model).backend.device
    on_device = _on(device, inputs)
    expected = plain if device.type == "cpu" else _reference_on(mf, device, on_device)
    start = time.perf_counter()
    offloaded = _forward(model, on_device)
    first_ms = (time.perf_counter() - start) * 1e3
    same = torch.equal(expected, offloaded)
    print(f"installed {args.profile} in {install_s * 1e3:.1f} ms; first forward {first_ms:.1f} ms "
          f"(no warm-up); outputs bit-identical to the plain model: {same}")  # fmt: skip
    print(handle(model).report().table())
    handle(model).remove()
    restored = torch.equal(plain, _forward(model, inputs))
    print(f"after remove(): outputs bit-identical: {restored}")
    return 0 if same and restored else 1


if __name__ == "__main__":
    sys.exit(main())
