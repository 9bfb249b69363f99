"""`compile_profile` (the Python API of `ftc profile`) against bad arguments: each is one
`FlextensorError` line naming the argument and the fix, and the model is left unchanged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flextensor_compile.compile_api import collect_stats, compile_profile
from flextensor_runtime.errors import ConfigError, ModelFileError
from tests.runtime.conftest import assert_same, snapshot


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).eval()


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(2, 8),)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"model": "model.py"}, "compile_profile needs a torch.nn.Module, got str"),
        ({"config": "0.6"}, "config='0.6' is not an OffloadConfig"),
        ({"run": 5}, "run=5 is not callable"),
    ],
)
def test_wrong_argument_types_are_config_errors(kwargs, needle) -> None:
    model = _model()
    before = snapshot(model)
    args = {"model": model, "example_inputs": _inputs(), **kwargs}
    for api in (compile_profile, collect_stats):
        with pytest.raises(ConfigError) as err:
            api(**args)
        message = str(err.value).replace("collect_stats", "compile_profile")
        assert needle in message and "\n" not in message, message
    assert_same(model, before)


def test_a_run_that_fails_midway_leaves_the_model_unchanged() -> None:
    model = _model()
    before = snapshot(model)
    calls = {"n": 0}

    def run(m: nn.Module, inputs: tuple[torch.Tensor]) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 3:  # discovery and warm-up passed; the first timed forward fails
            raise RuntimeError("out of luck")
        with torch.no_grad():
            return m(*inputs)

    with pytest.raises(ModelFileError, match="run\\(model, inputs\\) raised RuntimeError"):
        compile_profile(model, _inputs(), run=run)
    assert_same(model, before)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
