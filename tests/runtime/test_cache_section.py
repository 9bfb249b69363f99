"""A profile's `caches` section is installed on top of weight streaming and removed with it."""

from __future__ import annotations

from dataclasses import replace

import torch

from flextensor_runtime.cache_section import (
    cache_section_to_data,
    install_cache,
    parse_cache_section,
    parse_cache_spec,
)
from tests.runtime.conftest import assert_same, deploy, snapshot
from tests.runtime.models import block_names, tiny_lm
from tests.runtime.plans import build_profile


def test_cache_section_composes_with_streaming() -> None:
    section = parse_cache_section(parse_cache_spec("fixed-step:module=blocks.1;skip=1"))
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randint(0, 64, (2, 8), generator=g) for _ in range(3)]
    plain = tiny_lm()
    with torch.no_grad():
        uncached = [plain(ids) for ids in inputs]
    cached = install_cache(plain, section)
    expected = []
    with torch.no_grad():
        for step, ids in enumerate(inputs):
            with cached.step(step, 3):
                expected.append(plain(ids))
    assert not torch.equal(expected[1], uncached[1])  # step 1 replays blocks.1
    model = tiny_lm()
    before = snapshot(model)
    profile = build_profile(model, block_names(model), num_blocks=2, prefetch=2)
    profile = replace(profile, extensions={"caches": cache_section_to_data(section)})
    h = deploy(model, profile)
    assert h.cache is not None
    with torch.no_grad():
        for step, ids in enumerate(inputs):
            with h.cache.step(step, 3):
                assert torch.equal(model(ids), expected[step])
    assert h.cache.report().hits == cached.report().hits >= 1
    h.remove()
    assert_same(model, before)


def test_adaptive_cache_on_a_trap_finds_its_named_signal() -> None:
    """A trap's forward is (*args, **kwargs): the cache looked the named signal up in the
    trap's signature and found nothing for a positional call (CacheUsageError). Traps and
    call guards now show the module's own signature to `inspect.signature`."""
    import inspect

    data = {"module": "blocks.1", "policy": "adaptive-residual", "threshold": 0.5,
            "signal": "x", "residual_input": "x", "total_steps": 4}  # fmt: skip
    section = parse_cache_section(data)
    model = tiny_lm()
    plain_signature = inspect.signature(model.blocks[1].forward)
    profile = build_profile(model, block_names(model), num_blocks=2, prefetch=2)
    h = deploy(model, replace(profile, extensions={"caches": cache_section_to_data(section)}))
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for step in range(4):
            with h.cache.step(step, 4):
                model(ids)  # TinyLM calls block(x) positionally
    assert h.cache.report().calls == 4
    h.cache.remove()
    h.cache = None
    assert inspect.signature(model.blocks[1].forward) == plain_signature  # the trap's
    assert inspect.signature(model.blocks[1].down.forward) == inspect.signature(
        tiny_lm().blocks[1].down.forward
    )  # a call guard's
    h.remove()


def test_adaptive_cache_on_a_vram_wrapper_finds_its_named_signal() -> None:
    """A VRAM wrapper's forward is (*args, **kwargs): the named signal of a positional call is
    looked up in the wrapped module's signature (it was not found: CacheUsageError)."""
    from flextensor_runtime import AutoWrappedModule, enable_vram_management
    from tests.runtime.models import MlpBlock

    data = {"module": "blocks.1", "policy": "adaptive-residual", "threshold": 0.5,
            "signal": "x", "residual_input": "x", "total_steps": 4}  # fmt: skip
    model = tiny_lm()
    enable_vram_management(model, {MlpBlock: AutoWrappedModule}, {"computation_device": "cpu"})
    assert isinstance(model.blocks[1], AutoWrappedModule)
    cached = install_cache(model, parse_cache_section(data))
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for step in range(4):
            with cached.step(step, 4):
                model(ids)  # TinyLM calls block(x) positionally
    assert cached.report().calls == 4
    cached.remove()
