"""Cross-step caches, memory records, meta-device init and layer-wise offload against bad input:
options that could only give inf/NaN or never take effect, signals a cache cannot measure,
records that would scramble every ranking, and devices this machine lacks. Each is one
`FlextensorError` line; the valid neighbours of each case still work."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from flextensor_runtime import (
    AdaptiveResidualCache,
    FixedStepCache,
    MemoryQuery,
    MemoryStore,
    TokenPruneState,
    enable_layerwise_cpu_offload,
    init_weights_on_device,
    prune_tokens,
    restore_tokens,
    select_token_indices,
)
from flextensor_runtime.cache_config import parse_cache_spec
from flextensor_runtime.errors import (
    BackendUnavailableError,
    CacheUsageError,
    ConfigError,
    TokenPruneError,
)

INF, NAN = float("inf"), float("nan")

BAD_CACHES: list[tuple[str, Callable[[], object], str]] = [
    ("infinite delta_scale", lambda: FixedStepCache({2}, delta_scale=INF, total_steps=5),
     "delta_scale=inf is invalid; pass a finite number$"),
    ("-infinite delta_scale", lambda: FixedStepCache({2}, delta_scale=-INF, total_steps=5),
     "delta_scale=-inf is invalid; pass a finite number$"),
    ("skip step past the end", lambda: FixedStepCache({2, 7, 9}, total_steps=5),
     r"skip_steps \[7, 9\] are outside total_steps=5"),
    ("infinite eps", lambda: AdaptiveResidualCache(0.1, eps=INF, total_steps=5),
     "eps=inf is invalid; pass a finite number > 0.0"),
    ("NaN threshold", lambda: AdaptiveResidualCache(NAN, total_steps=5),
     "threshold=nan is invalid; pass a number > 0.0"),
]  # fmt: skip


@pytest.mark.parametrize(
    "make, message", [c[1:] for c in BAD_CACHES], ids=[c[0] for c in BAD_CACHES]
)
def test_cache_option_that_cannot_work_is_refused(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_fixed_step_cache_accepts_skip_steps_inside_the_trajectory() -> None:
    cache = FixedStepCache({1, 3}, delta_scale=-0.5, total_steps=5)
    with torch.no_grad():
        outs = [cache.run(s, lambda s=s: torch.tensor([float(s)])) for s in range(5)]
    # step 1 replays step 0 (one seed); step 3: 2 - 0.5 * (3 - 2) / (2 - 0) * (2 - 0) = 1.5
    assert [float(o) for o in outs] == [0.0, 0.0, 2.0, 1.5, 4.0]


def _seeded_adaptive() -> AdaptiveResidualCache:
    cache = AdaptiveResidualCache(threshold=1.0, dense_last=0)
    cache.run(0, torch.ones(4), lambda: torch.full((4,), 2.0))
    return cache


@pytest.mark.parametrize(
    "signal, message",
    [
        (torch.ones(4, device="meta"), "on the meta device"),
        (torch.ones(4, dtype=torch.complex64), "complex"),
    ],
    ids=["meta", "complex"],
)
def test_adaptive_cache_refuses_a_signal_it_cannot_measure(
    signal: torch.Tensor, message: str
) -> None:
    with torch.no_grad():
        cache = _seeded_adaptive()
        with pytest.raises(CacheUsageError, match=message):
            cache.run(1, signal, lambda: torch.zeros(4))
        # the cache is still usable and still replays on a small change
        assert torch.equal(
            cache.run(1, torch.ones(4), lambda: torch.zeros(4)), torch.full((4,), 2.0)
        )
    assert [e.hit for e in cache.events] == [False, True]


BAD_RECORDS: list[tuple[str, Callable[[MemoryStore], object], str]] = [
    ("NaN timestamp", lambda s: s.append("x", timestamp=NAN),
     r"timestamp=nan is invalid; pass a number \(not NaN\)"),
    ("NaN score", lambda s: s.append("x", score=NAN), r"score=nan is invalid"),
    ("NaN record", lambda s: s.add({"content": "x", "timestamp": NAN}), "timestamp=nan"),
    ("NaN since", lambda s: s.query(since=NAN), "since=nan is invalid"),
    ("NaN min_score", lambda s: s.query(MemoryQuery(min_score=NAN)), "min_score=nan is invalid"),
]  # fmt: skip


@pytest.mark.parametrize(
    "call, message", [c[1:] for c in BAD_RECORDS], ids=[c[0] for c in BAD_RECORDS]
)
def test_memory_store_refuses_nan_that_would_scramble_ranking(
    call: Callable[[MemoryStore], object], message: str
) -> None:
    store = MemoryStore(capacity=3)
    store.append("a", timestamp=1.0, score=0.5)
    store.append("b", timestamp=2.0, score=0.9)
    with pytest.raises(ConfigError, match=message):
        call(store)
    assert [r["content"] for r in store.query(top_k=None)] == ["b", "a"]  # untouched


def test_meta_init_refuses_a_device_this_machine_lacks() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with (
        pytest.raises(BackendUnavailableError, match="device 'cuda' needs CUDA"),
        init_weights_on_device("cuda"),
    ):
        nn.Linear(2, 2)
    assert nn.Linear(2, 2).weight.device.type == "cpu"  # the hooks were never installed


def test_meta_init_refuses_a_non_bool_include_buffers() -> None:
    with (
        pytest.raises(ConfigError, match="include_buffers='yes'; pass True or False"),
        init_weights_on_device(include_buffers="yes"),  # type: ignore[arg-type]
    ):
        nn.Linear(2, 2)


@pytest.mark.parametrize("flag", ["pin_memory", "reuse_buffers"])
def test_layerwise_offload_refuses_a_non_bool_flag_on_any_machine(flag: str) -> None:
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
    with pytest.raises(ConfigError, match=f"{flag}='no' is invalid; pass True or False"):
        enable_layerwise_cpu_offload(model, **{flag: "no"})  # type: ignore[arg-type]


def test_cache_spec_with_a_huge_skip_range_is_refused_without_building_it() -> None:
    with pytest.raises(ConfigError, match=r"'0-100000000000' lists more than 100000 steps"):
        parse_cache_spec("fixed-step:skip=0-100000000000")
    data = parse_cache_spec("fixed-step:skip=2-18/4;total_steps=20")
    assert data["skip_steps"] == [2, 6, 10, 14, 18]


@pytest.mark.parametrize(
    "indices", [torch.tensor([0.5]), torch.tensor([1j])], ids=["float", "complex"]
)
def test_token_prune_state_refuses_non_integer_indices(indices: torch.Tensor) -> None:
    with pytest.raises(
        TokenPruneError, match="is inconsistent; pass the state prune_tokens returned"
    ):
        TokenPruneState(indices, 0, 4, 8, 1)


TOKENS = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(0))

BAD_TOKEN_CALLS: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("seed past 64 bits",
     lambda: select_token_indices(TOKENS, 0.5, method="random", random_seed=10**30),
     ConfigError, "random_seed=1000000000000000000000000000000 is invalid"),
    ("meta velocity",
     lambda: select_token_indices(TOKENS, 0.5, method="velocity",
                                  previous_velocity=torch.ones(2, 8, 4, device="meta")),
     ConfigError, "previous_velocity on the meta device"),
    ("meta compensation",
     lambda: restore_tokens(*prune_tokens(TOKENS, 0.5),
                            compensation=torch.ones(2, 8, 4, device="meta")),
     TokenPruneError, "compensation is on the meta device"),
]  # fmt: skip


@pytest.mark.parametrize(
    "call, error, message", [c[1:] for c in BAD_TOKEN_CALLS], ids=[c[0] for c in BAD_TOKEN_CALLS]
)
def test_token_calls_refuse_values_without_data(
    call: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call()


def test_token_calls_accept_the_valid_neighbours() -> None:
    picked = select_token_indices(TOKENS, 0.5, method="random", random_seed=-(2**63))
    assert picked.shape == (4,) and bool((picked.diff() > 0).all())
    compact, state = prune_tokens(TOKENS, 0.5)
    restored = restore_tokens(compact, state, compensation=TOKENS)
    assert torch.equal(restored, TOKENS)  # kept tokens scattered back, dropped ones compensated
