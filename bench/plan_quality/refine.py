"""Where each plan-quality architecture's selected modules split into leaves and gaps.

Owns: per architecture, a `Refiner` that maps a module trap's name to its pieces in forward
order: leaves (a module path that owns the tensors under it) and gaps (parameter-free compute
between leaves), each with the flops it does and the activation bytes it reads and writes (a
leaf's weight bytes are added from its tensors). The orders follow the published forward code:
- Llama (HF): input_layernorm, q, k, v, [rotary + SDPA], o, [residual], post_attention_layernorm,
  gate, [SiLU], up, [multiply], down, [residual];
- Mixtral (HF, per-expert modules): attention as Llama, then post_attention_layernorm, the router
  gate, [softmax + top-2 + first gather], and per expert w1, [SiLU], w3, [multiply], w2,
  [routing weight + index_add + next gather];
- Flux double block: img_mod.lin, txt_mod.lin, then per stream [norm1 + modulate], attn.qkv,
  [split heads], attn.norm.query_norm; [key norms + concat + rope + attention]; per stream
  attn.proj, [residual + norm2 + modulate], mlp.0, [GELU], mlp.2, [residual];
  single block: modulation.lin, [pre_norm + modulate], linear1, [split heads], norm.query_norm,
  norm.key_norm, [rope + attention + GELU + concat], linear2, [residual];
- Wan block: [residual + modulation + norm1 + modulate], self_attn q, norm_q, k, norm_k, v,
  [rope + attention], o, [residual], norm3, cross_attn q, norm_q, k, norm_k, v (k and v on the
  text tokens), [attention], o, [residual + norm2 + modulate], ffn.0, [GELU], ffn.2.
Must not know: stats, tensors, the solver.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Piece", "Refiner", "flux_refiner", "llama_refiner", "mixtral_refiner", "wan_refiner"]

BF16 = 2  # bytes per activation element


@dataclass(frozen=True)
class Piece:
    """A leaf trap (`leaf` = its module path) or, with `leaf=None`, a gap."""

    leaf: str | None
    flops: float
    act_bytes: float


Refiner = Callable[[str], list[Piece] | None]  # module trap name -> pieces (None: kept whole)


def _gap(flops: float, act_bytes: float) -> Piece:
    return Piece(None, flops, act_bytes)


def _linear(path: str, tokens: int, n_in: int, n_out: int) -> Piece:
    return Piece(path, 2 * tokens * n_in * n_out, tokens * (n_in + n_out) * BF16)


def _norm(path: str, tokens: int, width: int) -> Piece:
    return Piece(path, 0, 2 * tokens * width * BF16)


def _attn(p: str, a: str, h: int, kv: int, tokens: int, context: int, kv_cache: bool
          ) -> list[Piece]:  # fmt: skip
    act, kva = tokens * h * BF16, tokens * kv * BF16
    cache = 2 * context * kv * BF16 if kv_cache else 0
    return [_norm(p + "input_layernorm", tokens, h), _linear(a + "q_proj", tokens, h, h),
            _linear(a + "k_proj", tokens, h, kv), _linear(a + "v_proj", tokens, h, kv),
            _gap(4 * tokens * context * h, 2 * act + 2 * kva + cache),
            _linear(a + "o_proj", tokens, h, h), _gap(0, 3 * act)]  # fmt: skip


def _mlp(p: str, h: int, ffn: int, tokens: int) -> list[Piece]:
    m, fa = p + "mlp.", tokens * ffn * BF16
    return [_norm(p + "post_attention_layernorm", tokens, h),
            _linear(m + "gate_proj", tokens, h, ffn), _gap(0, 2 * fa),
            _linear(m + "up_proj", tokens, h, ffn), _gap(0, 3 * fa),
            _linear(m + "down_proj", tokens, ffn, h), _gap(0, 3 * tokens * h * BF16)]  # fmt: skip


def _layer(name: str) -> tuple[str, str] | None:
    """`model.layers.3.self_attn` -> (`model.layers.3.`, `self_attn`); a whole layer -> ''."""
    m = re.fullmatch(r"(model\.layers\.\d+\.)(.*)", name + ".")
    return (m.group(1), m.group(2).rstrip(".")) if m else None


def llama_refiner(h: int, ffn: int, kv: int, tokens: int, context: int) -> Refiner:
    def refine(name: str) -> list[Piece] | None:
        layer = _layer(name)
        if layer is None:
            return None
        p, part = layer
        attn = _attn(p, p + "self_attn.", h, kv, tokens, context, kv_cache=True)
        mlp = _mlp(p, h, ffn, tokens)
        return {"self_attn": attn, "mlp": mlp, "": attn + mlp}[part]

    return refine


def _moe(p: str, h: int, ffn: int, tokens: int, experts: int = 8, top_k: int = 2) -> list[Piece]:
    m, per = p + "block_sparse_moe.", tokens * top_k // experts
    ea, ef = per * h * BF16, per * ffn * BF16
    out = [_norm(p + "post_attention_layernorm", tokens, h),
           _linear(m + "gate", tokens, h, experts), _gap(0, 3 * tokens * experts * 4 + 2 * ea)]  # fmt: skip
    for e in range(experts):
        q = f"{m}experts.{e}."
        last = 3 * tokens * h * BF16 if e == experts - 1 else 2 * ea  # residual / next gather
        out += [_linear(q + "w1", per, h, ffn), _gap(0, 2 * ef), _linear(q + "w3", per, h, ffn),
                _gap(0, 3 * ef), _linear(q + "w2", per, ffn, h), _gap(0, 3 * ea + last)]  # fmt: skip
    return out


def mixtral_refiner(h: int, ffn: int, kv: int, tokens: int) -> Refiner:
    def refine(name: str) -> list[Piece] | None:
        layer = _layer(name)
        if layer is None:
            return None
        p, part = layer
        if part == "self_attn":
            return _attn(p, p + "self_attn.", h, kv, tokens, tokens, kv_cache=False)
        return _moe(p, h, ffn, tokens)

    return refine


def _flux_double(p: str, h: int, img: int, txt: int) -> list[Piece]:
    streams = (("img_", img), ("txt_", txt))
    out = [_linear(f"{p}{s}mod.lin", n, h, 6 * h) for s, n in streams]
    for s, n in streams:
        out += [_gap(0, 3 * n * h * BF16), _linear(f"{p}{s}attn.qkv", n, h, 3 * h),
                _gap(0, 2 * n * 3 * h * BF16), _norm(f"{p}{s}attn.norm.query_norm", n, h)]  # fmt: skip
    t = img + txt
    out.append(_gap(4 * t * t * h, 8 * t * h * BF16))
    for s, n in streams:
        out += [_linear(f"{p}{s}attn.proj", n, h, h), _gap(0, 5 * n * h * BF16),
                _linear(f"{p}{s}mlp.0", n, h, 4 * h), _gap(0, 2 * n * 4 * h * BF16),
                _linear(f"{p}{s}mlp.2", n, 4 * h, h), _gap(0, 3 * n * h * BF16)]  # fmt: skip
    return out


def _flux_single(p: str, h: int, t: int) -> list[Piece]:
    return [_linear(p + "modulation.lin", t, h, 3 * h), _gap(0, 3 * t * h * BF16),
            _linear(p + "linear1", t, h, 7 * h), _gap(0, 2 * t * 3 * h * BF16),
            _norm(p + "norm.query_norm", t, h), _norm(p + "norm.key_norm", t, h),
            _gap(4 * t * t * h, (6 * h + 8 * h + 10 * h) * t * BF16),
            _linear(p + "linear2", t, 5 * h, h), _gap(0, 3 * t * h * BF16)]  # fmt: skip


def flux_refiner(h: int, img: int, txt: int) -> Refiner:
    def refine(name: str) -> list[Piece] | None:
        if re.fullmatch(r"double_blocks\.\d+", name):
            return _flux_double(name + ".", h, img, txt)
        if re.fullmatch(r"single_blocks\.\d+", name):
            return _flux_single(name + ".", h, img + txt)
        return None

    return refine


def _wan_attn(a: str, h: int, q_tokens: int, kv_tokens: int) -> list[Piece]:
    return [_linear(a + "q", q_tokens, h, h), _norm(a + "norm_q", q_tokens, h),
            _linear(a + "k", kv_tokens, h, h), _norm(a + "norm_k", kv_tokens, h),
            _linear(a + "v", kv_tokens, h, h),
            _gap(4 * q_tokens * kv_tokens * h, (2 * q_tokens + 2 * kv_tokens) * h * BF16),
            _linear(a + "o", q_tokens, h, h)]  # fmt: skip


def _wan_block(p: str, h: int, ffn: int, video: int, text: int) -> list[Piece]:
    act = video * h * BF16
    return [_gap(0, 6 * act), *_wan_attn(p + "self_attn.", h, video, video), _gap(0, 3 * act),
            _norm(p + "norm3", video, h), *_wan_attn(p + "cross_attn.", h, video, text),
            _gap(0, 5 * act), _linear(p + "ffn.0", video, h, ffn),
            _gap(0, 2 * video * ffn * BF16), _linear(p + "ffn.2", video, ffn, h)]  # fmt: skip


def wan_refiner(h: int, ffn: int, video: int, text: int) -> Refiner:
    def refine(name: str) -> list[Piece] | None:
        if re.fullmatch(r"blocks\.\d+", name):
            return _wan_block(name + ".", h, ffn, video, text)
        return None

    return refine
