"""`make demo`, last step: deploy a compiled profile on the bundled example and check it.

Builds the model from its model file, computes the plain output, installs the profile with
`offload_from_profile` (no warm-up), runs the same inputs, checks the outputs are bit-identical,
prints the runtime's report, removes the profile and checks again.

    python -m profiles.demo MODEL_FILE PROFILE
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

from flextensor_runtime import handle, offload_from_profile


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _forward(model: torch.nn.Module, inputs: object) -> torch.Tensor:
    with torch.inference_mode():
        return model(*inputs) if isinstance(inputs, tuple) else model(**inputs)  # type: ignore[arg-type]


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
    start = time.perf_counter()
    offloaded = _forward(model, inputs)
    first_ms = (time.perf_counter() - start) * 1e3
    same = torch.equal(plain, offloaded)
    print(f"installed {args.profile} in {install_s * 1e3:.1f} ms; first forward {first_ms:.1f} ms "
          f"(no warm-up); outputs bit-identical to the plain model: {same}")  # fmt: skip
    print(handle(model).report().table())
    handle(model).remove()
    restored = torch.equal(plain, _forward(model, inputs))
    print(f"after remove(): outputs bit-identical: {restored}")
    return 0 if same and restored else 1


if __name__ == "__main__":
    sys.exit(main())
