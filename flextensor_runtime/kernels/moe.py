"""Token-routed SwiGLU mixture of experts: the portable reference and the dispatcher.

Owns: the MoE semantics, argument checks and the reference. For every token t and each of its
K routes (expert e = selected_experts[t, k], weight w = routing_weights[t, k]):
    out[t] += w * down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t]))
Weights are packed per expert: gate/up [E, I, D], down [E, D, I] (the row-major layout of
`nn.Linear` weights stacked over experts). Only tokens routed to an expert are evaluated for it.
Contributions are summed in float32 (float64 for float64 inputs); the result has hidden_states' shape and dtype.
Must not know: Triton (the kernel module is imported only when the Triton path runs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from flextensor_runtime.errors import ConfigError
from flextensor_runtime.kernels.backend import check_one_device, resolve_allow_triton

__all__ = ["MoeShape", "check_moe_args", "routed_swiglu_moe", "routed_swiglu_moe_pytorch"]

Workspace = dict[str, torch.Tensor] | Callable[[], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class MoeShape:
    tokens: int  # T
    top_k: int  # K
    experts: int  # E
    hidden: int  # D
    intermediate: int  # I


def _check_weights(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> tuple[int, ...]:
    op = "routed_swiglu_moe"
    if gate.dim() != 3 or up.shape != gate.shape:
        raise ConfigError(
            f"{op}: gate_weight {tuple(gate.shape)} and up_weight {tuple(up.shape)} must both "
            "be [E, I, D]; stack the experts' nn.Linear weights"
        )
    n_e, n_i, n_d = gate.shape
    if down.shape != (n_e, n_d, n_i):
        raise ConfigError(
            f"{op}: down_weight must be [E, D, I] = {(n_e, n_d, n_i)}, got {tuple(down.shape)}"
        )
    return n_e, n_i, n_d


def check_moe_args(
    hidden_states: torch.Tensor,
    routing_weights: torch.Tensor,
    selected_experts: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
) -> MoeShape:
    """Validate shapes and dtypes (no device sync); return the problem's sizes."""
    op = "routed_swiglu_moe"
    named = {"hidden_states": hidden_states, "routing_weights": routing_weights,
             "selected_experts": selected_experts, "gate_weight": gate_weight,
             "up_weight": up_weight, "down_weight": down_weight}  # fmt: skip
    for name, value in named.items():
        if not isinstance(value, torch.Tensor):
            raise ConfigError(f"{op}: {name} must be a torch.Tensor, got {type(value).__name__}")
    n_e, n_i, n_d = _check_weights(gate_weight, up_weight, down_weight)
    if hidden_states.dim() < 1 or hidden_states.shape[-1] != n_d:
        raise ConfigError(
            f"{op}: hidden_states must be [..., D={n_d}], got {tuple(hidden_states.shape)}"
        )
    dtypes = {t.dtype for t in (hidden_states, gate_weight, up_weight, down_weight)}
    if len(dtypes) != 1 or not hidden_states.is_floating_point():
        raise ConfigError(
            f"{op}: hidden_states and expert weights must share one floating dtype, got "
            f"{sorted(str(d) for d in dtypes)}; cast them with .to(dtype)"
        )
    check_one_device(
        op, hidden_states, routing_weights, selected_experts, gate_weight, up_weight, down_weight
    )
    n_t = hidden_states.shape[:-1].numel()
    if routing_weights.dim() != 2 or routing_weights.shape[0] != n_t:
        raise ConfigError(
            f"{op}: routing_weights must be [T={n_t}, K], got {tuple(routing_weights.shape)}"
        )
    is_int = not selected_experts.is_floating_point() and selected_experts.dtype != torch.bool
    if selected_experts.shape != routing_weights.shape or not is_int:
        raise ConfigError(
            f"{op}: selected_experts must be an integer tensor of shape "
            f"{tuple(routing_weights.shape)}, got {selected_experts.dtype} "
            f"{tuple(selected_experts.shape)}"
        )
    if not routing_weights.is_floating_point():
        raise ConfigError(f"{op}: routing_weights must be floating, got {routing_weights.dtype}")
    return MoeShape(n_t, routing_weights.shape[1], n_e, n_d, n_i)


def _check_expert_ids(flat_experts: torch.Tensor, n_experts: int) -> None:
    if flat_experts.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(flat_experts))
    if lo < 0 or hi >= n_experts:
        bad = lo if lo < 0 else hi
        raise ConfigError(
            f"routed_swiglu_moe: selected_experts holds expert id {bad} outside [0, {n_experts}); "
            "pass ids from the router's top-k over E experts"
        )


def routed_swiglu_moe_pytorch(
    hidden_states: torch.Tensor,
    routing_weights: torch.Tensor,
    selected_experts: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
) -> torch.Tensor:
    """Evaluate a token-routed SwiGLU MoE with portable PyTorch operators (autograd works).

    hidden_states [..., D] (T = number of rows); routing_weights, selected_experts [T, K];
    gate_weight, up_weight [E, I, D]; down_weight [E, D, I]. Only the tokens routed to an
    expert are gathered and evaluated for it; experts with no tokens cost nothing.
    Raises ConfigError for expert ids outside [0, E). Syncs with the host (group sizes).
    """
    shape = check_moe_args(
        hidden_states, routing_weights, selected_experts, gate_weight, up_weight, down_weight
    )
    x = hidden_states.reshape(shape.tokens, shape.hidden)  # [T, D]
    flat_experts = selected_experts.reshape(-1)  # [T*K], route r = t * K + k
    flat_weights = routing_weights.reshape(-1)  # [T*K]
    _check_expert_ids(flat_experts, shape.experts)
    acc_dtype = torch.promote_types(x.dtype, torch.float32)  # sum in float32 (or float64)
    out = torch.zeros(shape.tokens, shape.hidden, dtype=acc_dtype, device=x.device)
    order = torch.argsort(flat_experts, stable=True)  # routes grouped by expert
    counts = torch.bincount(flat_experts, minlength=shape.experts).tolist()
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        routes = order[start : start + count]  # [n]
        start += count
        tokens = routes // shape.top_k  # [n]
        xe = x[tokens]  # [n, D]
        h = F.silu(xe @ gate_weight[expert].T) * (xe @ up_weight[expert].T)  # [n, I]
        ye = h @ down_weight[expert].T  # [n, D]
        contrib = ye.to(acc_dtype) * flat_weights[routes].to(acc_dtype).unsqueeze(1)
        out.index_add_(0, tokens, contrib)
    return out.to(hidden_states.dtype).reshape(hidden_states.shape)


def _check_workspace_entries(buffers: Mapping[Any, object]) -> None:
    """Every entry must be a str name and a tensor: the Triton path reads tensor fields of
    the buffers it finds (an AttributeError deep inside it otherwise)."""
    for key, value in buffers.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ConfigError(
                f"routed_swiglu_moe: workspace entry {key!r} holds {type(value).__name__}, not a "
                "torch.Tensor under a str name; pass an empty dict {} and let the kernel fill "
                "it, or remove the entry"
            )


def _check_workspace(workspace: object) -> None:
    if workspace is not None and not isinstance(workspace, dict) and not callable(workspace):
        raise ConfigError(
            f"routed_swiglu_moe: workspace must be a dict, a callable returning one, or None; "
            f"got {type(workspace).__name__}; pass {{}} once and reuse it"
        )
    if isinstance(workspace, dict):
        _check_workspace_entries(workspace)


def _workspace_dict(workspace: Workspace | None) -> dict[str, torch.Tensor]:
    """The dict whose buffers the Triton path reuses; a factory is called once per call."""
    buffers = workspace() if callable(workspace) else workspace
    if buffers is None:
        return {}
    if not isinstance(buffers, dict):
        raise ConfigError(
            f"routed_swiglu_moe: the workspace factory returned {type(buffers).__name__}, "
            "not a dict; return the same dict on every call"
        )
    _check_workspace_entries(buffers)
    return buffers


def routed_swiglu_moe(
    hidden_states: torch.Tensor,
    routing_weights: torch.Tensor,
    selected_experts: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    workspace: dict[str, torch.Tensor] | Callable[[], dict[str, torch.Tensor]] | None = None,
    allow_triton: bool | None = None,
) -> torch.Tensor:
    """Dispatch packed SwiGLU MoE to Triton or the portable PyTorch reference.

    Same arguments and result as `routed_swiglu_moe_pytorch`, plus:
    workspace: a dict (or a callable returning one) whose buffers the Triton path reuses
    across calls and grows when too small; None allocates per call.
    allow_triton: None = Triton for CUDA tensors when installed and no grad is needed,
    True = force Triton (BackendUnavailableError when it cannot run), False = reference.
    The Triton path never syncs with the host; expert ids outside [0, E) contribute nothing.
    """
    shape = check_moe_args(
        hidden_states, routing_weights, selected_experts, gate_weight, up_weight, down_weight
    )
    chosen = resolve_allow_triton(
        "routed_swiglu_moe",
        allow_triton,
        hidden_states,
        routing_weights,
        selected_experts,
        gate_weight,
        up_weight,
        down_weight,
    )
    _check_workspace(workspace)
    if chosen == "torch":
        return routed_swiglu_moe_pytorch(
            hidden_states, routing_weights, selected_experts, gate_weight, up_weight, down_weight
        )
    from flextensor_runtime.kernels import triton_moe

    return triton_moe.routed_swiglu_moe_triton(
        hidden_states,
        routing_weights,
        selected_experts,
        (gate_weight, up_weight, down_weight),
        shape,
        _workspace_dict(workspace),
    )
