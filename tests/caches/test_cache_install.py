"""install_cache: a module's forward served by the section's policy, its report, and removal."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch
from torch import nn

from flextensor_runtime.cache_section import (
    install_cache,
    parse_cache_section,
    parse_cache_spec,
)
from flextensor_runtime.errors import CacheUsageError, InstallError


class Counted(nn.Module):
    """A residual MLP block that counts how often it really computes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.mlp = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
        self.computed = 0

    def forward(self, hidden_states: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        self.computed += 1
        return hidden_states + scale * self.mlp(hidden_states)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.denoiser = Counted()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.denoiser(x)


def _section(spec: str):
    return parse_cache_section(parse_cache_spec(spec))


def test_fixed_step_installation_replays_and_reports() -> None:
    model = Model()
    inst = install_cache(model, _section("fixed-step:module=denoiser;skip=1,2,3"))
    xs = [torch.randn(2, 4) for _ in range(5)]
    outs = []
    with torch.no_grad():
        for step, x in enumerate(xs):
            inst.set_step(step, total_steps=5)
            outs.append(model(x))
    assert model.denoiser.computed == 2
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[3], outs[0])
    assert not torch.equal(outs[4], outs[0])
    report = inst.report()
    assert (report.hits, report.misses, report.calls) == (3, 2, 5)
    assert report.reasons == {"dense-first": 1, "replayed": 3, "dense-last": 1}
    assert report.trajectories == 1 and report.host_syncs == 0
    assert report.summary().startswith("denoiser fixed-step: 3/5 calls replayed; dense-first 1")


def test_remove_restores_the_original_forward_exactly() -> None:
    model = Model()
    original = model.denoiser.forward
    inst = install_cache(model, _section("fixed-step:module=denoiser;dense_last=0"))
    assert "forward" in model.denoiser.__dict__ and inst.installed
    assert inst.remove() is True and inst.remove() is False
    assert "forward" not in model.denoiser.__dict__
    assert model.denoiser.forward == original
    x = torch.randn(1, 4)
    torch.testing.assert_close(model(x), x + model.denoiser.mlp(x))


def test_remove_keeps_a_previous_instance_forward() -> None:
    model = Model()
    calls = []

    def traced(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return Counted.forward(model.denoiser, *args, **kwargs)

    model.denoiser.forward = traced  # type: ignore[method-assign]
    inst = install_cache(model, _section("fixed-step:module=denoiser;dense_last=0"))
    model(torch.randn(1, 4))
    assert calls == [1]
    inst.remove()
    assert model.denoiser.__dict__["forward"] is traced


def test_install_errors() -> None:
    model = Model()
    with pytest.raises(InstallError, match="module 'decoder', which the model lacks"):
        install_cache(model, _section("fixed-step:module=decoder"))
    inst = install_cache(model, _section("fixed-step:module=denoiser"))
    with pytest.raises(InstallError, match="already has a cache"):
        install_cache(model, _section("fixed-step:module=denoiser"))
    inner = model.denoiser.forward
    model.denoiser.forward = lambda *a, **k: inner(*a, **k)  # type: ignore[method-assign]
    with pytest.raises(InstallError, match="another forward wrapper"):
        inst.remove()


def test_calls_outside_a_step_are_dense_and_counted() -> None:
    model = Model()
    inst = install_cache(model, _section("fixed-step:module=denoiser;skip=0-9;dense_first=0"))
    with torch.no_grad():
        model(torch.randn(1, 4))
        with inst.step(0, 3):
            model(torch.randn(1, 4))
        with inst.step(1, 3):
            model(torch.randn(1, 4))
        model(torch.randn(1, 4))
    assert model.denoiser.computed == 3
    assert inst.report().reasons == {"no-step": 2, "no-seed": 1, "replayed": 1}


def test_each_call_in_a_step_is_its_own_branch() -> None:
    model = Model()
    inst = install_cache(model, _section("fixed-step:module=denoiser;skip=1"))
    cond, uncond = torch.ones(1, 4), -torch.ones(1, 4)
    with torch.no_grad():
        for step in range(3):
            inst.set_step(step, 3)
            a, b = model(cond), model(uncond)
    assert len(inst.caches) == 2
    assert [e.hit for e in inst.caches[1].events] == [False, True, False]
    inst.set_step(1, 3)
    with torch.no_grad():
        a, b = model(cond), model(uncond)
    assert not torch.equal(a, b)  # branch 1 replays its own output, not branch 0's


def test_lower_step_starts_a_new_trajectory() -> None:
    model = Model()
    inst = install_cache(model, _section("fixed-step:module=denoiser;skip=1,2"))
    with torch.no_grad():
        for _ in range(2):
            for step in range(4):
                inst.set_step(step, 4)
                model(torch.randn(1, 4))
    assert model.denoiser.computed == 4
    assert inst.report().trajectories == 2
    inst.reset()
    inst.set_step(2, 4)
    assert inst.report().trajectories == 3


def test_missing_total_steps_is_a_clear_error() -> None:
    inst = install_cache(Model(), _section("fixed-step:module=denoiser;skip=1"))
    with pytest.raises(CacheUsageError, match=r"pass set_step\(step, total_steps\)"):
        inst.set_step(0)


def test_no_replay_under_autograd() -> None:
    model = Model()
    inst = install_cache(model, _section("fixed-step:module=denoiser;skip=1,2"))
    for step in range(4):
        inst.set_step(step, 4)
        assert model(torch.randn(1, 4)).requires_grad
    assert inst.report().reasons == {"dense-first": 1, "autograd": 2, "dense-last": 1}


def test_adaptive_installation_replays_the_residual_on_the_current_input() -> None:
    model = Model()
    spec = "adaptive-residual:module=denoiser;threshold=0.5;signal=hidden_states;residual_input=0"
    inst = install_cache(model, _section(spec))
    base = torch.randn(2, 4)
    with torch.no_grad():
        inst.set_step(0, 4)
        first = model(base)
        residual = first - base
        inst.set_step(1, 4)
        shifted = base * 1.01
        second = model.denoiser(hidden_states=shifted)  # keyword call finds the same argument
    assert model.denoiser.computed == 1
    torch.testing.assert_close(second, shifted + residual)
    event = inst.caches[0].events[1]
    assert event.hit and event.accumulated == pytest.approx(0.01, rel=1e-3)


Pair = namedtuple("Pair", ["sample", "aux"])


class PairOut(nn.Module):
    def forward(self, x: torch.Tensor) -> Pair:
        return Pair(x * 2, "aux")


def test_adaptive_keeps_the_output_container() -> None:
    model = nn.Sequential(PairOut())
    inst = install_cache(model, _section("adaptive-residual:module=0;threshold=1;dense_last=0"))
    with torch.no_grad():
        inst.set_step(0)
        model(torch.ones(3))
        inst.set_step(1)
        out = model(torch.ones(3) * 1.1)
    assert isinstance(out, Pair) and out.aux == "aux"
    torch.testing.assert_close(out.sample, torch.full((3,), 2.0))  # replayed output


def test_adaptive_rejects_a_non_tensor_signal() -> None:
    model = Model()
    inst = install_cache(
        model, _section("adaptive-residual:module=denoiser;threshold=1;signal=scale")
    )
    inst.set_step(0, 2)
    with pytest.raises(CacheUsageError, match="argument 'scale' is float, not a tensor"):
        model.denoiser(torch.ones(1, 4), 2.0)


class VarArgs(nn.Module):
    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        return args[0] * 3 if args else kwargs["x"] * 3


def test_adaptive_finds_signals_of_var_arg_forwards() -> None:
    model = nn.Sequential(VarArgs())
    for spec_signal, call in (("0", lambda m, x: m(x)), ("x", lambda m, x: m[0](x=x))):
        inst = install_cache(
            model,
            _section(f"adaptive-residual:module=0;threshold=1;dense_last=0;signal={spec_signal}"),
        )
        with torch.no_grad():
            inst.set_step(0)
            call(model, torch.ones(2))
            inst.set_step(1)
            out = call(model, torch.ones(2) * 1.5)
        torch.testing.assert_close(out, torch.full((2,), 3.0))
        assert inst.report().hits == 1
        inst.remove()
