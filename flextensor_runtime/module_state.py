"""Putting a model's module tree back as it was when a change to it fails half-way.

Owns: `unchanged_on_error(model)`, a context manager that records every module's children,
parameter and buffer objects and each parameter's data, and restores them if the body raises
(the error propagates). Installers that replace those objects (VRAM wrappers, layer-wise
offload) run inside it, so a failed install leaves the model unchanged.
Must not know: what the installers do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["unchanged_on_error"]


@contextmanager
def unchanged_on_error(model: nn.Module) -> Iterator[None]:
    """Put back every child module, parameter and buffer of `model` if the body raises."""
    modules = list(model.modules())
    saved = [(m, dict(m._modules), dict(m._parameters), dict(m._buffers)) for m in modules]
    datas = [(p, p.data) for m in modules for p in m._parameters.values() if p is not None]
    try:
        yield
    except BaseException:
        for module, children, params, buffers in saved:
            module._modules.clear()
            module._modules.update(children)
            module._parameters.clear()
            module._parameters.update(params)
            module._buffers.clear()
            module._buffers.update(buffers)
        for param, data in datas:
            param.data = data
        raise
