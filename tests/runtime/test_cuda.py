"""The CUDA backend (copy stream, events, pinned memory): same outputs as the plain model on
the GPU, device memory within the plan's peak. Skipped on machines without a GPU."""

from __future__ import annotations

import pytest
import torch

from flextensor_runtime.backend import CudaBackend
from flextensor_runtime.deploy import handle, offload_from_profile
from tests.runtime.conftest import assert_same, snapshot
from tests.runtime.models import block_names, on_cuda, tiny_lm
from tests.runtime.plans import build_profile, record_order

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy", "raw_block_transfer"])
def test_tiny_lm_on_cuda(mode: str) -> None:
    model = tiny_lm()
    ids = torch.randint(0, 64, (2, 8))
    order, _ = record_order(model, block_names(model), ids)
    profile = build_profile(model, order, num_blocks=2, prefetch=2, mode=mode)
    plain_model = on_cuda(tiny_lm())
    with torch.no_grad():
        plain = plain_model(ids.cuda())
    before = snapshot(model)
    backend = CudaBackend()
    assert backend.alloc_host(16).is_pinned()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    offload_from_profile(model, profile, backend=backend)
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(model(ids.cuda()), plain)
    h = handle(model)
    assert h.report().stalls == 0
    assert backend.peak_held_bytes <= profile.predicted.peak_bytes
    assert torch.cuda.max_memory_allocated() - base >= backend.held_bytes
    h.remove()
    assert_same(model, before)


def test_llama_on_cuda_lazy_checkpoint(tmp_path) -> None:
    from accelerate import init_empty_weights
    from safetensors.torch import save_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    real = LlamaForCausalLM(config).eval()
    save_model(real, str(tmp_path / "model.safetensors"))
    ids = torch.randint(0, 128, (1, 10))
    traps = [f"model.layers.{i}" for i in range(4)]
    profile = build_profile(real, traps, num_blocks=2, prefetch=1)
    with torch.no_grad():
        plain = real.cuda()(ids.cuda()).logits
    with init_empty_weights():
        meta = LlamaForCausalLM(config).eval()
    offload_from_profile(meta, profile, device="cuda", checkpoint=tmp_path / "model.safetensors")
    with torch.no_grad():
        got = meta(ids.cuda()).logits
    torch.testing.assert_close(got, plain, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy", "raw_block_transfer"])
@pytest.mark.parametrize("layout", ["two_blocks", "on_entry", "ring"])
def test_split_transfers_on_cuda(layout: str, mode: str) -> None:
    # several transfers per trap and on-entry copies: the copy stream must wait for the
    # release of the bytes it overwrites, the compute stream for every transfer a trap reads
    from tests.runtime.test_split_transfers import _profile

    model, profile = _profile(layout, mode)
    ids = torch.randint(0, 64, (2, 8))
    plain_model = on_cuda(tiny_lm())
    with torch.no_grad():
        plain = plain_model(ids.cuda())
    offload_from_profile(model, profile, backend=CudaBackend())
    with torch.no_grad():
        for _ in range(5):
            assert torch.equal(model(ids.cuda()), plain)
    h = handle(model)
    assert h.report().stalls == 0
    h.remove()


def test_cuda_backend_names_its_device_as_ftc_records_it() -> None:
    # `ftc profile` records `get_device_properties(...).name`; deployment compares with this
    backend = CudaBackend()
    assert backend.device_name() == torch.cuda.get_device_properties(backend.device).name
