"""Tensor discovery: which trap reads which model tensor, by intercepting torch functions.

Owns: a `TorchFunctionMode` active during the discovery forward (the glossary's indirect mode)
that looks at every torch function's arguments, records each model tensor it sees (parameters,
buffers, inner tensor fields) against the trap active at that moment (or None: outside every
trap; outside traps, also against the gap slot it runs in), and tells the hooks when compute runs outside traps (gap candidates). Metadata reads
(`.shape`, `.dtype`, `size()`, ...) are not reads of the data and are ignored. Tensors handed to
custom CUDA/Triton kernels are seen through the torch calls that prepare them (`data_ptr()`,
`contiguous()`, ...).
Must not know: ownership rules, timing, the profile.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from flextensor_compile.discover.hooks import TrapHooks
from flextensor_compile.discover.slots import gap_name

__all__ = ["ReadRecorder"]

_METADATA = frozenset({
    "dtype", "shape", "device", "size", "dim", "ndim", "ndimension", "numel", "nelement",
    "is_cuda", "is_meta", "is_cpu", "requires_grad", "layout", "is_floating_point",
    "is_complex", "element_size", "is_contiguous", "stride", "grad", "names", "is_sparse",
    "is_quantized", "is_leaf", "grad_fn", "itemsize", "nbytes", "__len__", "get_device",
    "storage_offset", "_is_view", "is_nested", "requires_grad_", "__hash__", "__eq__",
    "__format__", "__repr__", "__bool__",
})  # fmt: skip


def _func_name(func: Any) -> str:
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__"):
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", name)
    return name


class ReadRecorder(TorchFunctionMode):
    """Record reads of model tensors (by object identity) against the active trap."""

    def __init__(self, hooks: TrapHooks, tensor_names: dict[int, str]) -> None:
        super().__init__()
        self.hooks = hooks
        self.tensor_names = tensor_names
        self.reads: dict[str, set[str | None]] = defaultdict(set)
        self.gap_reads: dict[str, set[str]] = defaultdict(set)  # gap slot -> tensors read there

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _func_name(func) not in _METADATA:
            self._observe(args, kwargs)
        return func(*args, **kwargs)

    def _observe(self, args: Any, kwargs: Any) -> None:
        # Reads outside the root forward (in run() itself) count as reads outside traps.
        current = self.hooks.current
        leaves, _ = tree_flatten((args, kwargs))
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                name = self.tensor_names.get(id(leaf))
                if name is not None:
                    self.reads[name].add(current)
                    if current is None:
                        self.gap_reads[gap_name(self.hooks.last_exit)].add(name)
        if current is None:
            self.hooks.mark_op()
