"""Tensor factories and hypothesis strategies shared by the kernel tests."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LAYOUTS = ("contiguous", "strided", "transposed")
# conditioning shape forms against x [B, T, D]
COND_FORMS = ("bd", "b1d", "d", "btd", "11d")

# Triton (fp32 accumulation, one rounding) vs the upcast reference: one rounding of the output
ROW_TOLERANCE = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
}


def make(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    seed: int,
    layout: str = "contiguous",
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Random normal tensor with the given logical shape and memory layout."""
    gen = torch.Generator().manual_seed(seed)
    if layout == "strided" and shape:  # every other element of a wider last dim
        base = torch.randn(*shape[:-1], shape[-1] * 2, generator=gen).to(dtype).to(device)
        return base[..., ::2]
    if layout == "transposed" and len(shape) >= 2:  # last two dims swapped in memory
        swapped = (*shape[:-2], shape[-1], shape[-2])
        return torch.randn(*swapped, generator=gen).to(dtype).to(device).transpose(-1, -2)
    return torch.randn(*shape, generator=gen).to(dtype).to(device)


def cond_shape(form: str, b: int, t: int, d: int) -> tuple[int, ...]:
    return {"bd": (b, d), "b1d": (b, 1, d), "d": (d,), "btd": (b, t, d), "11d": (1, 1, d)}[form]


def cond_as_3d(cond: torch.Tensor, form: str) -> torch.Tensor:
    """The conditioning tensor viewed the way DiT code applies it to x [B, T, D]."""
    return cond[:, None] if form == "bd" else cond


@st.composite
def row_problems(draw: st.DrawFn) -> dict:
    """x [B, T, D] with dtype, layout and conditioning forms (T = 0 gives an empty input)."""
    return {
        "b": draw(st.integers(1, 3)),
        "t": draw(st.integers(0, 5)),
        "d": draw(st.integers(1, 80)),
        "dtype": draw(st.sampled_from(DTYPES)),
        "layout": draw(st.sampled_from(LAYOUTS)),
        "form": draw(st.sampled_from(COND_FORMS)),
        "seed": draw(st.integers(0, 2**16)),
    }
