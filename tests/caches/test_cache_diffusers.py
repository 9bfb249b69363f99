"""A cache installed from a `caches` section on a real diffusers transformer in a sampler loop."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from diffusers.models.transformers.transformer_sd3 import SD3Transformer2DModel
from diffusers.schedulers.scheduling_flow_match_euler_discrete import (
    FlowMatchEulerDiscreteScheduler,
)

from flextensor_runtime.cache_section import (
    install_cache,
    parse_cache_section,
    parse_cache_spec,
)

STEPS = 10


class Pipeline(torch.nn.Module):
    """Holds the denoiser under the name a profile's section would use."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.transformer = SD3Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
            num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
            pooled_projection_dim=8, out_channels=4, pos_embed_max_size=8,
        ).eval()  # fmt: skip
        self.computed = 0
        self.transformer.transformer_blocks[0].register_forward_hook(self._count)

    def _count(self, *_: object) -> None:
        self.computed += 1

    def sample(self, installation=None) -> torch.Tensor:
        gen = torch.Generator().manual_seed(1)
        latents = torch.randn(1, 4, 8, 8, generator=gen)
        text, pooled = torch.randn(1, 5, 16, generator=gen), torch.randn(1, 8, generator=gen)
        scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
        scheduler.set_timesteps(STEPS)
        with torch.inference_mode():
            for i, t in enumerate(scheduler.timesteps):
                if installation is not None:
                    installation.set_step(i, STEPS)
                out = self.transformer(
                    hidden_states=latents, encoder_hidden_states=text, pooled_projections=pooled,
                    timestep=t.expand(1), return_dict=False,
                )  # fmt: skip
                velocity = out[0]
                latents = scheduler.step(velocity, t, latents).prev_sample
        return latents


@pytest.fixture(scope="module")
def pipe() -> Iterator[Pipeline]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: extra threads only add contention
    try:
        yield Pipeline()
    finally:
        torch.set_num_threads(threads)


def _rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_no_skips_is_exactly_dense_and_removal_restores(pipe: Pipeline) -> None:
    dense = pipe.sample()
    inst = install_cache(
        pipe, parse_cache_section(parse_cache_spec("fixed-step:module=transformer"))
    )
    torch.testing.assert_close(pipe.sample(inst), dense, rtol=0, atol=0)
    inst.remove()
    assert "forward" not in pipe.transformer.__dict__
    torch.testing.assert_close(pipe.sample(), dense, rtol=0, atol=0)


@pytest.mark.parametrize(
    "spec",
    ["fixed-step:module=transformer;skip=2-7/2",
     "fixed-step:module=transformer;skip=2-7/2;delta_scale=1",
     "adaptive-residual:module=transformer;threshold=0.05;signal=hidden_states"],
)  # fmt: skip
def test_cached_trajectory_saves_calls_and_stays_close(pipe: Pipeline, spec: str) -> None:
    pipe.computed = 0
    dense = pipe.sample()
    dense_calls = pipe.computed
    inst = install_cache(pipe, parse_cache_section(parse_cache_spec(spec)))
    pipe.computed = 0
    cached = pipe.sample(inst)
    inst.remove()
    report = inst.report()
    assert report.hits > 0 and pipe.computed == dense_calls - report.hits
    assert report.misses == pipe.computed
    assert 0.0 < _rel_error(cached, dense) < 0.1
