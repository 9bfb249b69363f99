"""Kernel tests run the Triton kernels in Triton's CPU interpreter when there is no GPU.

TRITON_INTERPRET must be set before the kernel modules decorate their kernels; those modules
are imported lazily on the first Triton call, so setting it here (at collection, in every
xdist worker) is early enough, even if another test imported triton itself before (see
test_interpreter_import_order.py). With a GPU the kernels run natively on CUDA tensors instead.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def kernel_device() -> torch.device:
    """Where Triton kernels run in these tests: CUDA when present, else CPU (interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
