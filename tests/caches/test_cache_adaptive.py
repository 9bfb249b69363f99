"""AdaptiveResidualCache: warm-up, accumulated change, threshold, hit cap, reset, autograd."""

from __future__ import annotations

import pytest
import torch

from flextensor_runtime import AdaptiveResidualCache
from flextensor_runtime.errors import CacheUsageError, ConfigError


def _rel(cur: torch.Tensor, prev: torch.Tensor, eps: float = 1e-6) -> float:
    return float((cur - prev).abs().mean() / (prev.abs().mean() + eps))


def _run(cache: AdaptiveResidualCache, signals: list[torch.Tensor]) -> list[int]:
    calls: list[int] = []
    with torch.no_grad():
        for step, sig in enumerate(signals):
            cache.run(step, sig, lambda s=step: calls.append(s) or torch.full((2,), float(s)))
    return calls


def test_accumulates_change_until_threshold_and_events_carry_it() -> None:
    # signal grows by 1% per step: relative changes of about 0.01 each
    signals = [torch.full((8,), 1.01**k) for k in range(8)]
    cache = AdaptiveResidualCache(threshold=0.025, max_consecutive_hits=10, total_steps=8)
    calls = _run(cache, signals)
    ev = cache.events
    assert [e.reason for e in ev] == [
        "warmup", "below-threshold", "below-threshold", "threshold",
        "below-threshold", "below-threshold", "threshold", "dense-last",
    ]  # fmt: skip
    assert calls == [0, 3, 6, 7]
    expected = _rel(signals[1], signals[0]) + _rel(signals[2], signals[1])
    assert ev[2].accumulated == pytest.approx(expected)
    assert ev[3].accumulated == pytest.approx(expected + _rel(signals[3], signals[2]))
    assert ev[4].accumulated == pytest.approx(_rel(signals[4], signals[3]))  # reset after dense
    assert ev[0].accumulated is None


def test_replays_the_last_dense_residual() -> None:
    cache = AdaptiveResidualCache(threshold=1.0, total_steps=4)
    outs = []
    with torch.no_grad():
        for step in range(4):
            outs.append(cache.run(step, torch.ones(3), lambda s=step: torch.tensor([float(s)])))
    assert [float(o) for o in outs] == [0.0, 0.0, 0.0, 3.0]


def test_consecutive_hit_cap_forces_a_dense_step() -> None:
    cache = AdaptiveResidualCache(threshold=10.0, max_consecutive_hits=2, dense_last=0)
    calls = _run(cache, [torch.ones(4)] * 7)
    assert calls == [0, 3, 6]
    assert cache.events[3].reason == "hit-cap"
    assert cache.events[3].accumulated == pytest.approx(0.0)


def test_warmup_steps_are_dense() -> None:
    cache = AdaptiveResidualCache(threshold=10.0, warmup_steps=3, dense_last=0)
    assert _run(cache, [torch.ones(4)] * 5) == [0, 1, 2]
    assert [e.reason for e in cache.events][:3] == ["warmup"] * 3


def test_reset_clears_residual_and_accumulator() -> None:
    cache = AdaptiveResidualCache(threshold=10.0, warmup_steps=0, dense_last=0)
    assert _run(cache, [torch.ones(4)] * 3) == [0]
    cache.reset()
    assert cache.events == []
    assert _run(cache, [torch.ones(4)] * 3) == [0]
    assert cache.events[0].reason == "no-seed"


def test_backwards_step_without_reset_is_an_error() -> None:
    cache = AdaptiveResidualCache(threshold=1.0, total_steps=3)
    _run(cache, [torch.ones(2)] * 3)
    with pytest.raises(CacheUsageError, match=r"reset\(\)"):
        cache.run(0, torch.ones(2), lambda: torch.zeros(2))


def test_never_replays_under_autograd() -> None:
    cache = AdaptiveResidualCache(threshold=10.0, total_steps=4)
    w = torch.ones(1, requires_grad=True)
    calls = []
    for step in range(4):
        out = cache.run(step, torch.ones(2), lambda s=step: calls.append(s) or w * s)
        assert out.requires_grad
    assert calls == [0, 1, 2, 3]
    assert [e.reason for e in cache.events] == ["warmup", "autograd", "autograd", "dense-last"]


def test_signal_shape_change_forces_dense() -> None:
    cache = AdaptiveResidualCache(threshold=10.0, dense_last=0)
    calls = _run(cache, [torch.ones(4), torch.ones(4), torch.ones(6), torch.ones(6)])
    assert calls == [0, 2]
    assert cache.events[2].reason == "signal-shape"


def test_subsample_reads_every_nth_element() -> None:
    # changes only at odd positions: invisible with subsample=2
    a = torch.ones(16)
    b = a.clone()
    b[1::2] = 5.0
    seen = AdaptiveResidualCache(threshold=0.5, dense_last=0)
    blind = AdaptiveResidualCache(threshold=0.5, dense_last=0, subsample=2)
    assert _run(seen, [a, b]) == [0, 1]
    assert _run(blind, [a, b]) == [0]


def test_stored_signal_is_a_copy() -> None:
    cache = AdaptiveResidualCache(threshold=0.5, dense_last=0)
    sig = torch.ones(4)
    with torch.no_grad():
        cache.run(0, sig, lambda: torch.zeros(1))
        sig.mul_(10.0)  # in-place update of the caller's tensor
        cache.run(1, sig, lambda: torch.zeros(1))
    assert cache.events[1].reason == "threshold"


def test_cpu_signal_costs_no_host_sync() -> None:
    cache = AdaptiveResidualCache(threshold=10.0, dense_last=0)
    _run(cache, [torch.ones(4)] * 4)
    assert cache.host_syncs == 0


@pytest.mark.cuda
def test_device_signal_costs_one_sync_per_decided_step() -> None:
    cache = AdaptiveResidualCache(threshold=10.0, max_consecutive_hits=10, total_steps=6)
    _run(cache, [torch.ones(4, device="cuda")] * 6)
    assert cache.host_syncs == 4  # steps 1..4; warm-up and dense-last decide without a read


@pytest.mark.parametrize(
    "kwargs",
    [{"threshold": -0.1}, {"threshold": 0}, {"threshold": 0.1, "eps": 0.0}, {"threshold": 0.1, "subsample": 0},
     {"threshold": 0.1, "max_consecutive_hits": -1}, {"threshold": True}],
)  # fmt: skip
def test_bad_options_raise_config_error(kwargs: dict) -> None:
    with pytest.raises(ConfigError, match="is invalid"):
        AdaptiveResidualCache(**kwargs)


def test_nan_signal_computes_instead_of_replaying() -> None:
    cache = AdaptiveResidualCache(threshold=0.5, max_consecutive_hits=10, dense_last=0)
    nan = torch.full((4,), float("nan"))
    assert _run(cache, [torch.ones(4), nan, nan]) == [0, 1, 2]
    assert [e.reason for e in cache.events][1:] == ["threshold", "threshold"]


def test_non_tensor_signal_residual_or_callable_is_a_usage_error() -> None:
    cache = AdaptiveResidualCache(threshold=0.5, dense_last=0)
    with torch.no_grad():
        with pytest.raises(CacheUsageError, match="got signal of type str"):
            cache.run(0, "abc", lambda: torch.zeros(1))  # type: ignore[arg-type]
        with pytest.raises(CacheUsageError, match="compute_residual of type Tensor"):
            cache.run(0, torch.ones(1), torch.zeros(1))  # type: ignore[arg-type]
        with pytest.raises(CacheUsageError, match="compute_residual returned str"):
            cache.run(0, torch.ones(1), lambda: "r")  # type: ignore[arg-type,return-value]
