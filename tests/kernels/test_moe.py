"""routed_swiglu_moe: reference vs naive per-token loops, Triton (interpreter) vs reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.kernels import routed_swiglu_moe, routed_swiglu_moe_pytorch
from tests.kernels.moe_problems import MOE_TOLERANCE, MoeCase, build_case, moe_cases
from tests.kernels.naive import naive_moe


@settings(max_examples=20, deadline=None)
@given(case=moe_cases(dtypes=(torch.float64, torch.float32)))
def test_reference_matches_naive(case: MoeCase) -> None:
    out = routed_swiglu_moe_pytorch(*case.args())
    assert out.shape == case.hidden.shape and out.dtype == case.hidden.dtype
    expected = naive_moe(*case.args())
    torch.testing.assert_close(out.double(), expected, **MOE_TOLERANCE[case.hidden.dtype])


@settings(max_examples=20, deadline=None)
@given(case=moe_cases())
def test_triton_matches_reference(case: MoeCase, kernel_device: torch.device) -> None:
    case = case.to(kernel_device)
    out = routed_swiglu_moe(*case.args(), allow_triton=True)
    ref = routed_swiglu_moe_pytorch(*case.args())
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **MOE_TOLERANCE[case.hidden.dtype])


def test_reference_gradients_match_naive() -> None:
    case = build_case(tokens=5, top_k=2, experts=3, hidden=6, inter=4, dtype=torch.float64)
    args = [t.clone().requires_grad_(t.is_floating_point()) for t in case.args()]
    differentiable = [t for t in args if t.requires_grad]
    loss = routed_swiglu_moe_pytorch(*args).sin().sum()
    grads = torch.autograd.grad(loss, differentiable)
    naive_grads = torch.autograd.grad(naive_moe(*args).sin().sum(), differentiable)
    for got, want in zip(grads, naive_grads, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("allow_triton", [False, True])
def test_unrouted_experts_are_never_evaluated(allow_triton: bool, kernel_device) -> None:
    """NaN weights in experts that receive no token must not reach the output."""
    case = build_case(tokens=9, top_k=2, experts=4, hidden=16, inter=24, used_experts=2)
    for weight in (case.gate, case.up, case.down):
        weight[2:] = float("nan")
    case = case.to(kernel_device)
    out = routed_swiglu_moe(*case.args(), allow_triton=allow_triton)
    assert torch.isfinite(out).all()
    expected = naive_moe(*case.to("cpu").args())
    torch.testing.assert_close(out.cpu().double(), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("allow_triton", [False, True])
@pytest.mark.parametrize("tokens", [0, 1])
def test_empty_and_single_token(tokens: int, allow_triton: bool, kernel_device) -> None:
    case = build_case(tokens=tokens, top_k=2, experts=3, hidden=8, inter=16).to(kernel_device)
    out = routed_swiglu_moe(*case.args(), allow_triton=allow_triton)
    assert out.shape == (tokens, 8)
    expected = naive_moe(*case.to("cpu").args())
    torch.testing.assert_close(out.cpu().double(), expected, atol=1e-5, rtol=1e-5)


def test_batched_hidden_states_keep_their_shape(kernel_device: torch.device) -> None:
    case = build_case(tokens=6, top_k=2, experts=3, hidden=8, inter=16).to(kernel_device)
    batched = case.hidden.reshape(2, 3, 8)
    args = (batched, *case.args()[1:])
    out = routed_swiglu_moe(*args, allow_triton=True)
    assert out.shape == (2, 3, 8)
    torch.testing.assert_close(out, routed_swiglu_moe_pytorch(*args), atol=1e-5, rtol=1e-5)


def test_workspace_buffers_are_reused_and_grown(kernel_device: torch.device) -> None:
    small = build_case(tokens=4, top_k=2, experts=3, hidden=8, inter=16).to(kernel_device)
    large = build_case(tokens=40, top_k=2, experts=3, hidden=8, inter=16).to(kernel_device)
    workspace: dict[str, torch.Tensor] = {}
    routed_swiglu_moe(*large.args(), workspace=workspace, allow_triton=True)
    pointers = {key: buf.data_ptr() for key, buf in workspace.items()}
    assert {"intermediate", "expert_out", "sorted_routes", "block_expert"} <= set(pointers)
    out = routed_swiglu_moe(*small.args(), workspace=workspace, allow_triton=True)
    assert {key: buf.data_ptr() for key, buf in workspace.items()} == pointers
    torch.testing.assert_close(out, routed_swiglu_moe_pytorch(*small.args()))
    bigger = build_case(tokens=40, top_k=2, experts=3, hidden=8, inter=64).to(kernel_device)
    routed_swiglu_moe(*bigger.args(), workspace=workspace, allow_triton=True)
    assert workspace["intermediate"].data_ptr() != pointers["intermediate"]


def test_a_workspace_filled_under_inference_mode_works_outside_it(kernel_device) -> None:
    case = build_case(tokens=6, top_k=2, experts=3, hidden=8, inter=16).to(kernel_device)
    workspace: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        routed_swiglu_moe(*case.args(), workspace=workspace, allow_triton=True)
    with torch.no_grad():  # the inference-mode buffers cannot be written here: made anew
        out = routed_swiglu_moe(*case.args(), workspace=workspace, allow_triton=True)
    torch.testing.assert_close(out, routed_swiglu_moe_pytorch(*case.args()))


def test_workspace_factory_is_called_per_call(kernel_device: torch.device) -> None:
    case = build_case(tokens=5, top_k=1, experts=2, hidden=8, inter=8).to(kernel_device)
    shared: dict[str, torch.Tensor] = {}
    calls = []

    def factory() -> dict[str, torch.Tensor]:
        calls.append(1)
        return shared

    for _ in range(2):
        out = routed_swiglu_moe(*case.args(), workspace=factory, allow_triton=True)
    assert len(calls) == 2 and "expert_out" in shared
    torch.testing.assert_close(out, routed_swiglu_moe_pytorch(*case.args()))


def test_out_of_range_expert_ids(kernel_device: torch.device) -> None:
    case = build_case(tokens=4, top_k=2, experts=3, hidden=8, inter=16)
    case.selected_experts[1, 0] = 7
    with pytest.raises(ConfigError, match="expert id 7 outside"):
        routed_swiglu_moe_pytorch(*case.args())
    out = routed_swiglu_moe(*case.to(kernel_device).args(), allow_triton=True)
    dropped = MoeCase(*case.args())
    dropped.selected_experts[1, 0] = 0
    dropped.routing_weights[1, 0] = 0.0  # the Triton path ignores the invalid route
    torch.testing.assert_close(out.cpu(), routed_swiglu_moe_pytorch(*dropped.args()))


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"down": torch.zeros(3, 16, 8)}, r"down_weight must be \[E, D, I\]"),
        ({"up": torch.zeros(3, 16, 9)}, "must both be"),
        ({"hidden": torch.zeros(4, 8, dtype=torch.float64)}, "share one floating dtype"),
        ({"selected_experts": torch.zeros(4, 2)}, "must be an integer tensor"),
        ({"selected_experts": torch.zeros(4, 2, dtype=torch.bool)}, "got torch.bool"),
        ({"hidden": [[0.0] * 8] * 4}, "hidden_states must be a torch.Tensor, got list"),
        ({"routing_weights": torch.zeros(5, 2)}, r"routing_weights must be \[T=4, K\]"),
    ],
)
def test_bad_arguments_raise(change: dict, fragment: str) -> None:
    case = build_case(tokens=4, top_k=2, experts=3, hidden=8, inter=16)
    fields = {name: getattr(case, name) for name in MoeCase.__dataclass_fields__}
    with pytest.raises(ConfigError, match=fragment):
        routed_swiglu_moe(*MoeCase(**{**fields, **change}).args())


def test_bad_workspace_raises(kernel_device: torch.device) -> None:
    case = build_case(tokens=2, top_k=1, experts=2, hidden=8, inter=8).to(kernel_device)
    with pytest.raises(ConfigError, match="workspace must be a dict, a callable"):
        routed_swiglu_moe(*case.args(), workspace=[], allow_triton=False)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="workspace factory returned list"):
        routed_swiglu_moe(*case.args(), workspace=list, allow_triton=True)  # type: ignore[arg-type]
