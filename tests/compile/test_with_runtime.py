"""Compiled profiles deploy: `offload_from_profile` binds them and outputs stay bit-identical.
(Runs where the runtime's deployment module is present.)"""

from __future__ import annotations

import pytest
import torch

from flextensor_compile.compile_api import compile_profile
from flextensor_compile.config import OffloadConfig
from flextensor_runtime.profile import save

deploy = pytest.importorskip(
    "flextensor_runtime.deploy", reason="the runtime is not installed here"
)


def _first(out):
    out = out[0] if isinstance(out, tuple) else out
    return getattr(out, "last_hidden_state", out)


@pytest.mark.parametrize(
    "name", ["tiny_transformer", pytest.param("minilm", marks=pytest.mark.slow)]
)
def test_compiled_profile_deploys_with_identical_outputs(tmp_path, name):
    import importlib

    module = importlib.import_module(f"profiles.{name}")
    run = getattr(module, "run", None) or (lambda model, inputs: model(**inputs))
    reference = module.build_model()
    cfg = OffloadConfig(max_gpu_mem_fraction=0.8, profiling_iters=1, warmup_iters=0)
    profile = compile_profile(
        reference, module.example_inputs, cfg, run=getattr(module, "run", None)
    )
    path = save(profile, tmp_path / "p.msgpack")
    inputs = module.example_inputs()
    with torch.no_grad():
        expected = _first(run(reference, inputs))
        model = deploy.offload_from_profile(module.build_model(), path)
        got = _first(run(model, inputs))
    assert torch.equal(expected, got)
    assert profile.predicted.streamed_bytes > 0
