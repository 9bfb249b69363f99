"""A small DiT-like denoiser (diffusers' SD3 transformer, random weights) and its sampler loop.

Owns: building the model and conditioning, and running one flow-matching trajectory with
FlowMatchEulerDiscreteScheduler, optionally through a cache installed from a `caches` section.
Must not know: which cache settings are compared or how results are shown (see `__main__`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from diffusers.models.transformers.transformer_sd3 import SD3Transformer2DModel
from diffusers.schedulers.scheduling_flow_match_euler_discrete import (
    FlowMatchEulerDiscreteScheduler,
)

from flextensor_runtime.cache_section import CacheReport, CacheSection, install_cache

__all__ = ["Scene", "Trajectory", "build_scene", "run_trajectory"]


@dataclass(frozen=True)
class Scene:
    """The model plus fixed inputs: initial noise and text conditioning."""

    model: SD3Transformer2DModel
    noise: torch.Tensor  # [B, C, H, W]
    text: torch.Tensor  # [B, T, joint_attention_dim]
    pooled: torch.Tensor  # [B, pooled_projection_dim]


@dataclass(frozen=True)
class Trajectory:
    final: torch.Tensor  # [B, C, H, W]
    dense_calls: int
    steps: int
    wall_ms: float
    report: CacheReport | None


def build_scene(seed: int = 0, size: int = 16, layers: int = 3) -> Scene:
    torch.manual_seed(seed)
    model = SD3Transformer2DModel(
        sample_size=size, patch_size=2, in_channels=4, num_layers=layers,
        attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
        caption_projection_dim=64, pooled_projection_dim=16, out_channels=4,
        pos_embed_max_size=size,
    ).eval()  # fmt: skip
    noise = torch.randn(1, 4, size, size)
    return Scene(model, noise, torch.randn(1, 8, 32), torch.randn(1, 16))


def run_trajectory(scene: Scene, steps: int, section: CacheSection | None) -> Trajectory:
    """Denoise `scene.noise` over `steps` Euler steps; count real transformer computations."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(steps)
    computed = [0]
    hook = scene.model.pos_embed.register_forward_hook(
        lambda *_: computed.__setitem__(0, computed[0] + 1)
    )
    installation = install_cache(scene.model, section) if section is not None else None
    latents = scene.noise.clone()
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            for i, t in enumerate(scheduler.timesteps):
                if installation is not None:
                    installation.set_step(i, steps)
                velocity = scene.model(
                    hidden_states=latents, encoder_hidden_states=scene.text,
                    pooled_projections=scene.pooled, timestep=t.expand(latents.shape[0]),
                ).sample  # fmt: skip
                latents = scheduler.step(velocity, t, latents).prev_sample
    finally:
        hook.remove()
        report = installation.report() if installation is not None else None
        if installation is not None:
            installation.remove()
    wall_ms = (time.perf_counter() - start) * 1e3
    return Trajectory(latents, computed[0], steps, wall_ms, report)
