"""The public kernel entry points against inputs that would give a silently wrong result: an
infinite LayerNorm eps (every row normalised to zero) and complex conditioning (its imaginary
part dropped by the cast to the compute dtype). PyTorch reference path, on CPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from flextensor_runtime import layer_norm_scale_shift, residual_gate_add
from flextensor_runtime.errors import ConfigError

GEN = torch.Generator().manual_seed(0)
X = torch.randn(2, 3, 4, generator=GEN)
COND = torch.randn(2, 4, generator=GEN)
COMPLEX = torch.ones(4, dtype=torch.complex64)

BAD_CALLS: list[tuple[str, Callable[[], object], str]] = [
    ("infinite eps", lambda: layer_norm_scale_shift(X, COND, COND, eps=float("inf")),
     "eps must be a positive finite float, got inf"),
    ("complex scale", lambda: layer_norm_scale_shift(X, COMPLEX, COND),
     "scale must be real, got torch.complex64"),
    ("complex shift", lambda: layer_norm_scale_shift(X, COND, COMPLEX),
     "shift must be real, got torch.complex64"),
    ("complex gate", lambda: residual_gate_add(X, X, COMPLEX),
     "gate must be real, got torch.complex64"),
]  # fmt: skip


@pytest.mark.parametrize("call, message", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_kernel_refuses_input_that_would_give_a_silently_wrong_result(
    call: Callable[[], object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        call()


def test_kernel_valid_neighbours_still_compute() -> None:
    out = layer_norm_scale_shift(X, COND, COND, eps=1e30)  # huge but finite: rows shrink to 0
    torch.testing.assert_close(out, COND[:, None, :].expand_as(X), atol=1e-6, rtol=0)
    gate = torch.ones(4, dtype=torch.int64)  # integer gates are cast exactly
    torch.testing.assert_close(residual_gate_add(X, X, gate), 2 * X)
