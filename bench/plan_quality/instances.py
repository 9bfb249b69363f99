"""Realistic solver instances in the stats format, with shapes from published architectures.

Each builder returns `Stats` for one iteration (one forward) with roofline compute times:
- llama-8b-decode / llama-8b-prefill2k: Llama-3-8B (bf16), one trap per attention and per MLP;
- llama-70b-fp8-prefill2k: Llama-3-70B with FP8 weights, one trap per layer, 24 tensors each
  (weights, per-channel weight scales, input scales, norms, rotary buffer): 80 traps x 24 tensors;
- mixtral-8x7b-prefill2k: a mixture-of-experts model (8 experts, top-2), attention and MoE traps;
- flux-12b-1024px: a 12B image DiT (19 double-stream + 38 single-stream blocks, 4096+512 tokens);
- wan-14b-480p: a 14B video DiT (40 blocks, 32,760 video tokens, 512 text tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

from bench.plan_quality.copy_models import CURVE, CopyModel
from bench.plan_quality.roofline import trap_ms
from flextensor_compile.stats import Stats, TensorStat, TrapStat
from flextensor_runtime.profile import DTYPE_ITEMSIZE, BandwidthPoint, DeviceSpec

__all__ = ["BANDWIDTHS", "INSTANCES", "device"]

BANDWIDTHS = {"pcie4": 25e9, "pcie5": 50e9}  # effective host-to-device bytes/s (pinned)


def device(bytes_per_s: float, model: CopyModel = CURVE) -> DeviceSpec:
    """An 80 GiB device whose copies follow `model` (`copy_models`: by default whole-copy rates
    that reach the link rate at 256 MiB and are slower when small) at `bytes_per_s`."""
    curve = tuple(BandwidthPoint(b, bytes_per_s * f) for b, f in model.fractions)
    return DeviceSpec("h100-class", 80 << 30, bytes_per_s, model.latency_ms, curve, "target")


def _t(name: str, shape: tuple[int, ...], dtype: str = "bfloat16", kind: str = "parameter"
       ) -> TensorStat:  # fmt: skip
    return TensorStat(name, prod(shape) * DTYPE_ITEMSIZE[dtype], dtype, shape, kind=kind)


def _trap(name: str, tensors: list[TensorStat], flops: float, act_bytes: float) -> TrapStat:
    weight_bytes = sum(t.bytes for t in tensors)
    return TrapStat(name, round(trap_ms(flops, weight_bytes + act_bytes), 6), tuple(tensors))


def _llama_attn(p: str, h: int, kv: int, dtype: str, fp8: bool) -> list[TensorStat]:
    shapes = {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h)}
    return _linears(p + "self_attn.", shapes, dtype, fp8)


def _linears(p: str, shapes: dict, dtype: str, fp8: bool) -> list[TensorStat]:
    out = []
    for name, shape in shapes.items():
        out.append(_t(f"{p}{name}.weight", shape, "float8_e4m3fn" if fp8 else dtype))
        if fp8:
            out.append(_t(f"{p}{name}.weight.scale", (shape[0], 1), "float32", "inner"))
            out.append(_t(f"{p}{name}.input_scale", (1,), "float32"))
    return out


def _llama(name: str, layers: int, h: int, ffn: int, kv: int, vocab: int, tokens: int,
           context: int, fp8: bool = False, per_layer: bool = False) -> Stats:  # fmt: skip
    dt = "bfloat16"
    act = tokens * h * 2
    traps = [_trap("embed_tokens", [_t("model.embed_tokens.weight", (vocab, h))], 0, act)]
    attn_flops = 2 * tokens * (2 * h * h + 2 * kv * h) + 4 * tokens * context * h
    mlp_flops = 2 * tokens * 3 * h * ffn
    kv_bytes = 2 * context * kv * 2
    for i in range(layers):
        p = f"model.layers.{i}."
        attn = [_t(p + "input_layernorm.weight", (h,)), *_llama_attn(p, h, kv, dt, fp8)]
        mlp_shapes = {"gate_proj": (ffn, h), "up_proj": (ffn, h), "down_proj": (h, ffn)}
        mlp = [_t(p + "post_attention_layernorm.weight", (h,)),
               *_linears(p + "mlp.", mlp_shapes, dt, fp8)]  # fmt: skip
        if per_layer:
            rope = _t(p + "self_attn.rotary_emb.inv_freq", (64,), "float32", "buffer")
            traps.append(_trap(p[:-1], [*attn, *mlp, rope], attn_flops + mlp_flops,
                               4 * act + kv_bytes))  # fmt: skip
        else:
            traps.append(_trap(p + "self_attn", attn, attn_flops, 3 * act + kv_bytes))
            traps.append(_trap(p + "mlp", mlp, mlp_flops, 2 * act + 2 * tokens * ffn * 2))
    head = [_t("model.norm.weight", (h,)), _t("lm_head.weight", (vocab, h))]
    traps.append(_trap("lm_head", head, 2 * h * vocab, act))
    return Stats(name, device(BANDWIDTHS["pcie4"]), tuple(traps), timing_source="roofline")


def _mixtral(tokens: int = 2048) -> Stats:
    h, ffn, kv, vocab, experts = 4096, 14336, 1024, 32000, 8
    act = tokens * h * 2
    traps = [_trap("embed_tokens", [_t("model.embed_tokens.weight", (vocab, h))], 0, act)]
    for i in range(32):
        p = f"model.layers.{i}."
        attn = [_t(p + "input_layernorm.weight", (h,)), *_llama_attn(p, h, kv, "bfloat16", False)]
        flops = 2 * tokens * (2 * h * h + 2 * kv * h) + 4 * tokens * tokens * h
        traps.append(_trap(p + "self_attn", attn, flops, 3 * act))
        moe = [_t(p + "post_attention_layernorm.weight", (h,)),
               _t(p + "block_sparse_moe.gate.weight", (experts, h))]  # fmt: skip
        for e in range(experts):
            q = f"{p}block_sparse_moe.experts.{e}."
            moe += [_t(q + "w1.weight", (ffn, h)), _t(q + "w2.weight", (h, ffn)),
                    _t(q + "w3.weight", (ffn, h))]  # fmt: skip
        traps.append(_trap(p + "block_sparse_moe", moe, 2 * tokens * 2 * 3 * h * ffn, 4 * act))
    head = [_t("model.norm.weight", (h,)), _t("lm_head.weight", (vocab, h))]
    traps.append(_trap("lm_head", head, 2 * h * vocab, act))
    return Stats("mixtral-8x7b-prefill2k", device(25e9), tuple(traps), timing_source="roofline")


def _flux_stream(p: str, h: int) -> list[TensorStat]:
    out = []
    for name, shape in (("mod.lin", (6 * h, h)), ("attn.qkv", (3 * h, h)),
                        ("attn.proj", (h, h)), ("mlp.0", (4 * h, h)), ("mlp.2", (h, 4 * h))):  # fmt: skip
        out += [_t(f"{p}{name}.weight", shape), _t(f"{p}{name}.bias", (shape[0],))]
    return [*out, _t(p + "attn.norm.query_norm.scale", (128,))]


def _flux(img: int = 4096, txt: int = 512) -> Stats:
    h, t = 3072, img + txt
    attn = 4 * t * t * h
    embed = [_t("img_in.weight", (h, 64)), _t("txt_in.weight", (h, 4096)),
             _t("time_in.in_layer.weight", (h, 256)), _t("vector_in.in_layer.weight", (h, 768))]  # fmt: skip
    traps = [_trap("embedders", embed, 2 * txt * 4096 * h, t * h * 2)]
    for i in range(19):
        p = f"double_blocks.{i}."
        ts = _flux_stream(p + "img_", h) + _flux_stream(p + "txt_", h)
        params = sum(prod(x.shape) for x in ts) / 2
        traps.append(_trap(p[:-1], ts, 2 * params * t + attn, 8 * t * h * 2))
    for i in range(38):
        p = f"single_blocks.{i}."
        ts = [_t(p + "linear1.weight", (7 * h, h)), _t(p + "linear1.bias", (7 * h,)),
              _t(p + "linear2.weight", (h, 5 * h)), _t(p + "linear2.bias", (h,)),
              _t(p + "modulation.lin.weight", (3 * h, h)), _t(p + "modulation.lin.bias", (3 * h,)),
              _t(p + "norm.query_norm.scale", (128,)), _t(p + "norm.key_norm.scale", (128,))]  # fmt: skip
        params = sum(prod(x.shape) for x in ts)
        traps.append(_trap(p[:-1], ts, 2 * params * t + attn, 6 * t * h * 2))
    final = [_t("final_layer.linear.weight", (64, h)),
             _t("final_layer.adaLN_modulation.1.weight", (2 * h, h))]  # fmt: skip
    traps.append(_trap("final_layer", final, 2 * img * 64 * h, img * h * 2))
    return Stats("flux-12b-1024px", device(25e9), tuple(traps), timing_source="roofline")


def _wan(video: int = 32760, text: int = 512) -> Stats:
    h, ffn = 5120, 13824
    embed = [_t("patch_embedding.weight", (h, 16, 1, 2, 2)),
             _t("text_embedding.0.weight", (h, 4096)), _t("text_embedding.2.weight", (h, h)),
             _t("time_embedding.0.weight", (h, 256)), _t("time_projection.1.weight", (6 * h, h))]  # fmt: skip
    traps = [_trap("embeddings", embed, 2 * text * 4096 * h, video * h * 2)]
    for i in range(40):
        p = f"blocks.{i}."
        ts = [_t(p + "modulation", (1, 6, h)), _t(p + "norm3.weight", (h,)),
              _t(p + "norm3.bias", (h,))]  # fmt: skip
        for a in ("self_attn", "cross_attn"):
            for m in ("q", "k", "v", "o"):
                ts += [_t(f"{p}{a}.{m}.weight", (h, h)), _t(f"{p}{a}.{m}.bias", (h,))]
            ts += [_t(f"{p}{a}.norm_q.weight", (h,)), _t(f"{p}{a}.norm_k.weight", (h,))]
        ts += [_t(p + "ffn.0.weight", (ffn, h)), _t(p + "ffn.0.bias", (ffn,)),
               _t(p + "ffn.2.weight", (h, ffn)), _t(p + "ffn.2.bias", (h,))]  # fmt: skip
        flops = (2 * video * (4 * h * h + 2 * h * ffn) + 2 * video * 2 * h * h
                 + 2 * text * 2 * h * h + 4 * video * video * h + 4 * video * text * h)  # fmt: skip
        traps.append(_trap(p[:-1], ts, flops, 10 * video * h * 2))
    head = [_t("head.head.weight", (64, h)), _t("head.modulation", (1, 2, h))]
    traps.append(_trap("head", head, 2 * video * 64 * h, video * h * 2))
    return Stats("wan-14b-480p", device(25e9), tuple(traps), timing_source="roofline")


INSTANCES: dict[str, Callable[[], Stats]] = {
    "llama-8b-decode": lambda: _llama("llama-8b-decode", 32, 4096, 14336, 1024, 128256, 1, 2048),
    "llama-8b-prefill2k": lambda: _llama(
        "llama-8b-prefill2k", 32, 4096, 14336, 1024, 128256, 2048, 2048
    ),
    "llama-70b-fp8-prefill2k": lambda: _llama(
        "llama-70b-fp8-prefill2k",
        80,
        8192,
        28672,
        1024,
        128256,
        2048,
        2048,
        fp8=True,
        per_layer=True,
    ),
    "mixtral-8x7b-prefill2k": _mixtral,
    "flux-12b-1024px": _flux,
    "wan-14b-480p": _wan,
}
