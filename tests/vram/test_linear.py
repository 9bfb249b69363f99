"""AutoWrappedLinear: outputs, disk loading, vram_limit behaviour, FP8 paths and LoRA."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from flextensor_runtime import AutoWrappedLinear, ConfigError, DiskMap
from flextensor_runtime.errors import VramManagementError
from flextensor_runtime.vram.fp8 import fp8_matmul, quantize_rowwise, scaled_mm_supported
from flextensor_runtime.vram.placement import GIB

CPU32 = dict(computation_dtype=torch.float32, computation_device="cpu")


@pytest.fixture
def linear() -> nn.Linear:
    torch.manual_seed(2)
    return nn.Linear(12, 7)


def test_output_is_bit_exact_when_dtypes_match(linear) -> None:
    x = torch.randn(3, 5, 12)
    expected = linear(x)
    wrapped = AutoWrappedLinear(copy.deepcopy(linear), **CPU32)
    assert torch.equal(wrapped(x), expected)
    assert wrapped.weight is not None and wrapped.in_features == 12 and wrapped.out_features == 7


def test_reuses_the_wrapped_parameters(linear) -> None:
    weight = linear.weight
    wrapped = AutoWrappedLinear(linear, **CPU32)
    assert wrapped.weight is weight  # offload placement equals current: no copy


def test_bias_free_linear(linear) -> None:
    plain = nn.Linear(12, 7, bias=False)
    wrapped = AutoWrappedLinear(copy.deepcopy(plain), offload_dtype=torch.bfloat16, **CPU32)
    x = torch.randn(4, 12)
    assert wrapped.bias is None
    bf16_weight = plain.weight.detach().to(torch.bfloat16).float()
    assert torch.equal(wrapped(x), x @ bf16_weight.t())


def test_vram_limit_reached_stays_at_onload_and_computes_from_a_copy(linear, fake_reader) -> None:
    x = torch.randn(2, 12)
    wrapped = AutoWrappedLinear(
        copy.deepcopy(linear), onload_dtype=torch.bfloat16, vram_limit=1.0,
        memory_reader=fake_reader, **CPU32,
    )  # fmt: skip
    wrapped.onload()
    stored = wrapped.weight
    fake_reader.used = 2 * GIB  # over the limit
    out = wrapped(x)
    assert wrapped.state == 1 and wrapped.weight is stored and stored.dtype == torch.bfloat16
    expected = nn.functional.linear(x, stored.float(), wrapped.bias.float())
    assert torch.equal(out, expected)
    fake_reader.used = 0  # room again: the next forward promotes
    assert torch.equal(wrapped(x), expected)
    assert wrapped.state == 2 and wrapped.weight.dtype == torch.float32


def test_no_vram_limit_never_promotes(linear) -> None:
    wrapped = AutoWrappedLinear(copy.deepcopy(linear), onload_dtype=torch.float16, **CPU32)
    wrapped.onload()
    wrapped(torch.randn(1, 12))
    assert wrapped.state == 1 and wrapped.weight.dtype == torch.float16


def test_disk_offload_keeps_meta_and_loads_for_compute(tiny_net, tiny_checkpoint) -> None:
    disk_map = DiskMap(tiny_checkpoint, "cpu")
    x = torch.randn(3, 8)
    expected = tiny_net.proj_in(x)
    wrapped = AutoWrappedLinear(
        copy.deepcopy(tiny_net.proj_in), offload_device="disk", onload_device="disk",
        name="proj_in", disk_map=disk_map, **CPU32,
    )  # fmt: skip
    assert wrapped.weight.device.type == "meta"
    assert torch.equal(wrapped(x), expected)
    assert wrapped.weight.device.type == "meta"  # the compute copy did not assign
    wrapped.onload()  # onload target is still disk: nothing materialised
    assert wrapped.weight.device.type == "meta"
    weight, bias = wrapped.load_from_disk(torch.float16, "cpu", assign=False)
    assert bias is not None and bias.dtype == torch.float16
    assert weight.dtype == torch.float16 and wrapped.weight.device.type == "meta"
    wrapped.load_from_disk(torch.float32, "cpu")
    assert torch.equal(wrapped.weight, tiny_net.proj_in.weight)
    wrapped.offload()
    assert wrapped.weight.device.type == "meta"


def test_onload_from_disk_to_host(tiny_net, tiny_checkpoint) -> None:
    wrapped = AutoWrappedLinear(
        copy.deepcopy(tiny_net.proj_out), offload_device="disk", onload_dtype=torch.bfloat16,
        onload_device="cpu", name="proj_out", disk_map=DiskMap(tiny_checkpoint, "cpu"), **CPU32,
    )  # fmt: skip
    wrapped.onload()
    assert wrapped.weight.dtype == torch.bfloat16 and wrapped.state == 1
    assert torch.equal(wrapped.weight, tiny_net.proj_out.weight.detach().to(torch.bfloat16))


def test_meta_weights_without_disk_map_is_an_error() -> None:
    with torch.device("meta"):
        meta_linear = nn.Linear(3, 3)
    with pytest.raises(VramManagementError, match="disk_map"):
        AutoWrappedLinear(meta_linear, **CPU32)


def test_unknown_wrapper_option_is_an_error(linear) -> None:
    with pytest.raises(ConfigError, match="unknown VRAM wrapper option"):
        AutoWrappedLinear(linear, colour="blue", **CPU32)


# -- FP8 ------------------------------------------------------------------------------------
def fp8_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Hand-written: quantise both operands per row, multiply the dequantised values."""
    dtype = torch.float8_e4m3fn
    xq = (x / (x.abs().amax(-1, keepdim=True) / 448)).to(dtype)
    x_deq = xq.float() * (x.abs().amax(-1, keepdim=True) / 448)
    w_deq = weight.to(dtype).float()  # stored fp8 weight: scale 1
    return x_deq @ w_deq.t() + bias


@pytest.mark.parametrize("backend", ["dequantize", "auto"])
def test_fp8_matches_hand_computed_quantisation(linear, backend) -> None:
    if backend == "auto" and not scaled_mm_supported(torch.device("cpu"), torch.float8_e4m3fn):
        pytest.skip("no _scaled_mm on this CPU build")
    x = torch.randn(5, 12)
    wrapped = AutoWrappedLinear(
        copy.deepcopy(linear), offload_dtype=torch.float32, computation_dtype=torch.float8_e4m3fn,
        computation_device="cpu", fp8_backend=backend,
    )  # fmt: skip
    out = wrapped(x)
    expected = fp8_reference(x, linear.weight.detach(), linear.bias.detach())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # documented tolerance against the float32 layer: FP8 keeps ~3 mantissa bits
    exact = linear(x).detach()
    assert (out - exact).abs().max() <= 0.1 * exact.abs().max()


def test_fp8_bias_keeps_its_dtype_and_weight_is_float8(linear) -> None:
    wrapped = AutoWrappedLinear(
        copy.deepcopy(linear), computation_dtype=torch.float8_e4m3fn, computation_device="cpu",
        offload_dtype=torch.float8_e4m3fn,
    )  # fmt: skip
    assert wrapped.weight.dtype == torch.float8_e4m3fn and wrapped.bias.dtype == torch.float32


def test_fp8_unquantised_weight_gets_rowwise_scales() -> None:
    torch.manual_seed(3)
    weight = torch.randn(6, 16) * 1000  # far outside the e4m3 range: needs a scale
    q, scale = quantize_rowwise(weight, torch.float8_e4m3fn)
    assert scale.shape == (6, 1) and torch.isfinite(q.float()).all()
    layer = AutoWrappedLinear(nn.Linear(16, 6), **CPU32)
    layer.computation_dtype = torch.float8_e4m3fn
    x = torch.randn(3, 16)
    out = layer.fp8_linear(x, weight, None)
    torch.testing.assert_close(
        out, x @ weight.t(), rtol=0.1, atol=0.1 * (x @ weight.t()).abs().max().item()
    )


def test_fp8_scaled_mm_and_dequantize_agree(linear) -> None:
    if not scaled_mm_supported(torch.device("cpu"), torch.float8_e4m3fn):
        pytest.skip("no _scaled_mm on this CPU build")
    x = torch.randn(9, 12)
    outs = []
    for backend in ("scaled_mm", "dequantize"):
        wrapped = AutoWrappedLinear(
            copy.deepcopy(linear), computation_dtype=torch.float8_e4m3fn,
            computation_device="cpu", fp8_backend=backend,
        )  # fmt: skip
        outs.append(wrapped(x))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_fp8_scaled_mm_takes_strided_operands(device: str) -> None:
    # CUDA's FP8 GEMM needs a row-major activation and a column-major weight operand; a
    # transposed activation or weight must still run (and agree with the dequantise path)
    if not scaled_mm_supported(torch.device(device), torch.float8_e4m3fn):
        pytest.skip(f"no _scaled_mm on this {device}")
    torch.manual_seed(4)
    x = torch.randn(32, 16, device=device).t()  # [16, 32], column-major
    for weight in (torch.randn(32, 32, device=device), torch.randn(32, 32, device=device).t()):
        got = fp8_matmul(x, weight, None, torch.float8_e4m3fn, "scaled_mm")
        want = fp8_matmul(x, weight, None, torch.float8_e4m3fn, "dequantize")
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_invalid_fp8_backend(linear) -> None:
    with pytest.raises(ConfigError, match="fp8_backend"):  # at construction, not first forward
        AutoWrappedLinear(
            linear, computation_dtype=torch.float8_e4m3fn, computation_device="cpu", fp8_backend="x"
        )


# -- LoRA -----------------------------------------------------------------------------------
def test_lora_matches_hand_computed_peft_order(linear) -> None:
    torch.manual_seed(4)
    a, b = torch.randn(3, 12), torch.randn(7, 3)
    x = torch.randn(2, 4, 12)
    wrapped = AutoWrappedLinear(copy.deepcopy(linear), **CPU32)
    wrapped.add_lora(a, b, scale=0.5)
    expected = linear(x) + (x @ a.t()) @ b.t() * 0.5  # delta on the activation, after the GEMM
    torch.testing.assert_close(wrapped(x), expected.detach(), rtol=1e-6, atol=1e-6)
    wrapped.clear_loras()
    assert torch.equal(wrapped(x), linear(x))


def test_second_adapter_through_lora_merger(linear) -> None:
    torch.manual_seed(5)
    a1, b1, a2, b2 = torch.randn(2, 12), torch.randn(7, 2), torch.randn(4, 12), torch.randn(7, 4)
    x = torch.randn(3, 12)
    wrapped = AutoWrappedLinear(copy.deepcopy(linear), **CPU32)
    wrapped.add_lora(a1, b1)
    wrapped.add_lora(a2, b2, scale=2.0)
    seen: list[tuple[int, ...]] = []

    def blend(out: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(deltas.shape))
        return out + 0.25 * deltas[0] + 0.75 * deltas[1]

    wrapped.lora_merger = blend
    d1 = (x @ a1.t()) @ b1.t()
    d2 = (x @ a2.t()) @ b2.t() * 2.0
    expected = linear(x) + 0.25 * d1 + 0.75 * d2
    torch.testing.assert_close(wrapped(x), expected.detach(), rtol=1e-5, atol=1e-5)
    assert seen == [(2, 3, 7)]
    wrapped.lora_merger = None  # plain sum
    torch.testing.assert_close(wrapped(x), (linear(x) + d1 + d2).detach(), rtol=1e-5, atol=1e-5)


def test_lora_shape_errors(linear) -> None:
    wrapped = AutoWrappedLinear(linear, **CPU32)
    with pytest.raises(ConfigError, match="do not fit"):
        wrapped.add_lora(torch.randn(2, 11), torch.randn(7, 2))
    with pytest.raises(ConfigError, match="rank mismatch"):
        wrapped.add_lora(torch.randn(2, 12), torch.randn(7, 3))


def test_fp8_max_of_e4m3fnuz_is_half_of_e4m3fn() -> None:
    from flextensor_runtime.vram.fp8 import fp8_max

    assert fp8_max(torch.float8_e4m3fn) == 448.0
    assert fp8_max(torch.float8_e4m3fnuz) == 240.0  # about half: baked into the scales


def test_preparing_materializes_only_when_leaving_disk(tiny_net, tiny_checkpoint) -> None:
    wrapped = AutoWrappedLinear(
        copy.deepcopy(tiny_net.proj_in), offload_device="disk", onload_device="disk",
        preparing_dtype=torch.float16, name="proj_in", disk_map=DiskMap(tiny_checkpoint, "cpu"),
        **CPU32,
    )  # fmt: skip
    wrapped.onload()
    assert wrapped.weight.device.type == "meta"
    wrapped.preparing()
    assert wrapped.weight.dtype == torch.float16 and wrapped.state == 1
    expected = tiny_net.proj_in.weight.detach().to(torch.float16)
    assert torch.equal(wrapped.weight, expected)


@pytest.mark.cuda
def test_cuda_offload_promotion_and_fp8(linear) -> None:
    x = torch.randn(4, 12, device="cuda")
    expected = nn.functional.linear(x, linear.weight.cuda(), linear.bias.cuda())
    wrapped = AutoWrappedLinear(
        copy.deepcopy(linear), offload_device="cpu", computation_dtype=torch.float32,
        computation_device="cuda", vram_limit=1024.0,
    )  # fmt: skip
    wrapped.onload()
    assert wrapped.weight.device.type == "cuda"  # onload defaults to computation
    wrapped.offload()
    assert wrapped.weight.is_pinned()  # host placement pinned: per-call copies are async
    torch.testing.assert_close(wrapped(x), expected)
    assert wrapped.state == 2 and wrapped.weight.device.type == "cuda"  # promoted under the limit
    fp8 = AutoWrappedLinear(
        copy.deepcopy(linear), offload_device="cpu", computation_dtype=torch.float8_e4m3fn,
        computation_device="cuda",
    )  # fmt: skip
    out = fp8(x)
    assert (out - expected).abs().max() <= 0.1 * expected.abs().max()


@pytest.mark.cuda
def test_cuda_lora_adapters_live_on_the_computation_device(linear) -> None:
    wrapped = AutoWrappedLinear(copy.deepcopy(linear), offload_device="cpu",
                                computation_device="cuda")  # fmt: skip
    a, b = torch.randn(2, 12), torch.randn(7, 2)
    wrapped.add_lora(a, b, 0.5)  # host tensors: moved once, here
    assert wrapped.loras[0].lora_A.device.type == wrapped.loras[0].lora_B.device.type == "cuda"
    x = torch.randn(4, 12, device="cuda")
    base = nn.functional.linear(x, linear.weight.cuda(), linear.bias.cuda())
    torch.testing.assert_close(wrapped(x), base + (x @ a.cuda().t()) @ b.cuda().t() * 0.5)


@pytest.mark.cuda
def test_cuda_host_weights_built_on_the_cpu_are_pinned(linear) -> None:
    # offloaded to the CPU where they already are: pinned all the same, so the per-call copies
    # to the GPU are asynchronous
    wrapped = AutoWrappedLinear(
        copy.deepcopy(linear), offload_device="cpu", computation_device="cuda",
    )  # fmt: skip
    wrapped.offload()
    assert wrapped.weight.device.type == "cpu" and wrapped.weight.is_pinned()
    x = torch.randn(4, 12, device="cuda")
    expected = nn.functional.linear(x, linear.weight.cuda(), linear.bias.cuda())
    torch.testing.assert_close(wrapped(x), expected)


@pytest.mark.parametrize("module", [nn.ReLU(), nn.Conv1d(2, 2, 1), None])
def test_non_linear_module_is_a_config_error(module) -> None:
    with pytest.raises(ConfigError, match=rf"wraps an nn\.Linear, got {type(module).__name__}"):
        AutoWrappedLinear(module)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"fp8_backend": "x"}, "invalid fp8_backend 'x'"), ({"vram_limit": -1}, "vram_limit=-1"),
     ({"vram_limit": "1"}, "vram_limit='1'"), ({"vram_limit": float("nan")}, "vram_limit=nan")],
)  # fmt: skip
def test_bad_wrapper_options_fail_at_construction(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        AutoWrappedLinear(nn.Linear(2, 2), **kwargs)


def test_add_lora_with_non_tensors_or_non_number_scale_is_a_config_error(linear) -> None:
    wrapped = AutoWrappedLinear(linear)
    a, b = torch.randn(2, linear.in_features), torch.randn(linear.out_features, 2)
    for args in ((a, b, "x"), ([1.0], b, 1.0)):
        with pytest.raises(ConfigError, match="add_lora got A"):
            wrapped.add_lora(*args)  # type: ignore[arg-type]
    assert wrapped.loras == []
