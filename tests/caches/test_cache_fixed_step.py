"""FixedStepCache: the reference example, boundaries, events, reset, autograd, extrapolation."""

from __future__ import annotations

import pytest
import torch

from flextensor_runtime import CacheEvent, FixedStepCache
from flextensor_runtime.errors import CacheUsageError, ConfigError


def test_reference_example_verbatim() -> None:
    cache = FixedStepCache(
        skip_steps={1, 3},
        dense_first=1,
        dense_last=1,
        total_steps=5,
    )
    calls = []
    with torch.no_grad():
        outputs = []
        for step in range(5):

            def compute(step=step):
                calls.append(step)
                return torch.tensor([float(step)])

            outputs.append(cache.run(step, compute))
    assert calls == [0, 2, 4]  # boundary steps remain dense
    assert [event.hit for event in cache.events] == [False, True, False, True, False]
    # replays return the last dense output
    assert [float(o) for o in outputs] == [0.0, 0.0, 2.0, 2.0, 4.0]


def _drive(cache: FixedStepCache, total: int, fn=lambda s: torch.tensor([float(s)])) -> list[int]:
    calls: list[int] = []

    def compute(step: int) -> torch.Tensor:
        calls.append(step)
        return fn(step)

    with torch.no_grad():
        for step in range(total):
            cache.run(step, lambda s=step: compute(s))
    return calls


def test_boundary_steps_stay_dense_even_when_listed() -> None:
    cache = FixedStepCache(skip_steps=range(8), dense_first=2, dense_last=3, total_steps=8)
    assert _drive(cache, 8) == [0, 1, 5, 6, 7]
    assert [e.reason for e in cache.events] == [
        "dense-first", "dense-first", "replayed", "replayed", "replayed",
        "dense-last", "dense-last", "dense-last",
    ]  # fmt: skip


def test_event_stream_names_every_step() -> None:
    cache = FixedStepCache(skip_steps={2}, dense_first=1, dense_last=1, total_steps=4)
    _drive(cache, 4)
    assert cache.events == [
        CacheEvent(0, False, "dense-first"),
        CacheEvent(1, False, "not-skipped"),
        CacheEvent(2, True, "replayed"),
        CacheEvent(3, False, "dense-last"),
    ]


def test_total_steps_may_come_from_run() -> None:
    cache = FixedStepCache(skip_steps={1, 2})
    calls = []
    with torch.no_grad():
        for step in range(3):
            cache.run(step, lambda s=step: calls.append(s) or torch.zeros(1), total_steps=3)
    assert calls == [0, 2]


def test_reset_makes_next_run_a_seed_and_clears_events() -> None:
    cache = FixedStepCache(skip_steps={0, 1, 2}, dense_first=0, dense_last=0)
    assert _drive(cache, 3) == [0]
    assert cache.events[0].reason == "no-seed"
    cache.reset()
    assert cache.events == []
    # without the reset the second trajectory's step 0 would have been rejected (see below)
    assert _drive(cache, 3, fn=lambda s: torch.tensor([10.0 + s])) == [0]


def test_new_trajectory_without_reset_is_an_error() -> None:
    cache = FixedStepCache(skip_steps={1}, total_steps=3)
    _drive(cache, 3)
    with pytest.raises(CacheUsageError, match=r"call reset\(\) between trajectories"):
        cache.run(0, lambda: torch.zeros(1))


def test_never_replays_under_autograd() -> None:
    cache = FixedStepCache(skip_steps={1, 2}, total_steps=4)
    weight = torch.ones(1, requires_grad=True)
    calls = []
    outs = []
    for step in range(4):
        outs.append(cache.run(step, lambda s=step: calls.append(s) or weight * s))
    assert calls == [0, 1, 2, 3]
    assert [e.reason for e in cache.events][1:3] == ["autograd", "autograd"]
    assert not any(e.hit for e in cache.events)
    assert all(o.requires_grad for o in outs)


def test_extrapolation_is_exact_on_linear_outputs() -> None:
    cache = FixedStepCache(skip_steps={2, 3, 5}, delta_scale=1.0, dense_first=2, total_steps=7)
    line = lambda s: torch.tensor([3.0 * s + 1.0, -s])  # noqa: E731
    outs = []
    with torch.no_grad():
        for step in range(7):
            outs.append(cache.run(step, lambda s=step: line(s)))
    for step, out in enumerate(outs):
        torch.testing.assert_close(out, line(step))
    assert [e.reason for e in cache.events] == [
        "dense-first", "dense-first", "extrapolated", "extrapolated", "not-skipped",
        "extrapolated", "dense-last",
    ]  # fmt: skip


def test_delta_scale_scales_the_extrapolated_difference_on_nested_outputs() -> None:
    cache = FixedStepCache(skip_steps={2}, delta_scale=0.5, dense_first=2, total_steps=4)
    outs = []
    with torch.no_grad():
        for step in range(4):
            outs.append(cache.run(step, lambda s=step: (torch.tensor([2.0 * s]), {"v": s})))
    value, meta = outs[2]
    # last dense 2.0 at step 1, previous 0.0 at step 0: 2 + 0.5 * 1 * (2 - 0) = 3
    torch.testing.assert_close(value, torch.tensor([3.0]))
    assert meta == {"v": 1}


def test_integer_and_bool_outputs_are_replayed_not_extrapolated() -> None:
    """Extrapolation used to turn an int64 output into float32 (and a mask into numbers)."""
    cache = FixedStepCache(skip_steps={2}, delta_scale=1.0, dense_first=2, total_steps=4)
    outs = []
    with torch.no_grad():
        for step in range(4):
            ids, mask = torch.tensor([step, 2 * step]), torch.tensor([step % 2 == 0])
            outs.append(cache.run(step, lambda s=step, i=ids, m=mask: (torch.tensor([2.0 * s]),
                                                                      i, m)))  # fmt: skip
    value, ids, mask = outs[2]
    torch.testing.assert_close(value, torch.tensor([4.0]))  # floating: extrapolated
    assert ids.dtype == torch.int64 and torch.equal(ids, torch.tensor([1, 2]))  # step 1's
    assert mask.dtype == torch.bool and torch.equal(mask, torch.tensor([False]))


def test_one_dense_output_replays_instead_of_extrapolating() -> None:
    cache = FixedStepCache(skip_steps={1}, delta_scale=1.0, dense_first=1, dense_last=0)
    with torch.no_grad():
        cache.run(0, lambda: torch.tensor([5.0]))
        out = cache.run(1, lambda: torch.tensor([99.0]))
    assert float(out) == 5.0 and cache.events[1].reason == "replayed"


def test_dense_last_without_total_is_a_clear_error_on_skip_steps_only() -> None:
    cache = FixedStepCache(skip_steps={1})
    with torch.no_grad():
        cache.run(0, lambda: torch.zeros(1))
        with pytest.raises(CacheUsageError, match="needs total_steps"):
            cache.run(1, lambda: torch.zeros(1))


@pytest.mark.parametrize("step", [-1, 5, 1.0, True])
def test_bad_step_is_rejected(step: object) -> None:
    cache = FixedStepCache(total_steps=5)
    with pytest.raises(CacheUsageError, match="step="):
        cache.run(step, lambda: torch.zeros(1))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [{"skip_steps": {-1}}, {"dense_first": -1}, {"dense_last": 1.5}, {"total_steps": 0},
     {"delta_scale": float("nan")}, {"delta_scale": "1"}],
)  # fmt: skip
def test_bad_options_raise_config_error(kwargs: dict) -> None:
    with pytest.raises(ConfigError, match="is invalid"):
        FixedStepCache(**kwargs)


def test_repeated_dense_step_replaces_its_output_before_extrapolating() -> None:
    cache = FixedStepCache(skip_steps={3}, delta_scale=1.0, dense_first=0, dense_last=0)
    with torch.no_grad():
        for step, value in ((1, 1.0), (2, 5.0), (2, 2.0)):  # step 2 computed twice
            cache.run(step, lambda v=value: torch.tensor([v]))
        out = cache.run(3, lambda: torch.tensor([99.0]))
    # extrapolates from (1, 1.0) and the latest (2, 2.0): 2 + 1 * (2 - 1) = 3
    torch.testing.assert_close(out, torch.tensor([3.0]))


def test_nan_delta_scale_message_asks_for_a_number() -> None:
    with pytest.raises(ConfigError, match=r"delta_scale=nan is invalid; pass a finite number$"):
        FixedStepCache(delta_scale=float("nan"))


def test_non_callable_compute_is_a_usage_error() -> None:
    with pytest.raises(CacheUsageError, match="got compute of type Tensor"):
        FixedStepCache(total_steps=3).run(0, torch.zeros(1))  # type: ignore[arg-type]


@pytest.mark.parametrize("skip_steps", [3, "12"])
def test_non_collection_skip_steps_is_a_config_error(skip_steps) -> None:
    with pytest.raises(ConfigError, match="pass a collection of step indices"):
        FixedStepCache(skip_steps=skip_steps)


def test_output_shape_change_replays_the_new_output_instead_of_extrapolating() -> None:
    cache = FixedStepCache(skip_steps={2}, delta_scale=1.0, dense_first=0, dense_last=0)
    with torch.no_grad():
        cache.run(0, lambda: torch.ones(2))
        cache.run(1, lambda: torch.full((3,), 2.0))  # e.g. a new resolution
        out = cache.run(2, lambda: torch.zeros(3))
    torch.testing.assert_close(out, torch.full((3,), 2.0))
    assert cache.events[-1].reason == "replayed"


def test_replay_returns_the_dense_output_object() -> None:
    """docs: `delta_scale=0` replays the last dense output as the same object; it returned a
    detached alias (another tensor object) of it."""
    cache = FixedStepCache(skip_steps={1}, dense_first=1, dense_last=0)
    dense = torch.ones(3)
    with torch.no_grad():
        assert cache.run(0, lambda: dense) is dense
        assert cache.run(1, lambda: torch.zeros(3)) is dense
    with torch.enable_grad():  # under autograd the stored copy is detached, the graph returned
        w = torch.ones(3, requires_grad=True)
        graphed = FixedStepCache(dense_first=1, dense_last=0)
        out = graphed.run(0, lambda: w * 2)
        assert out.requires_grad and graphed._outputs[-1][1] is not out
        assert not graphed._outputs[-1][1].requires_grad
