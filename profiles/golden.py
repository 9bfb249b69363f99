"""The format golden: a hand-built profile exercising every section of the wire format.

Owns: `format_golden()`, a deterministic profile with streamed, disk, resident, tied and inner
tensors, a gap trap, cyclic prefetch, two blocks and an extension section. Its bytes are pinned
in `format_golden.msgpack`; they change only when the wire format changes on purpose
(`make golden`). Must not know: the solver or torch.
"""

from __future__ import annotations

from flextensor_runtime.profile import (
    BandwidthPoint,
    Block,
    DeviceSpec,
    Meta,
    PlanConfig,
    Predicted,
    Profile,
    TensorEntry,
    Transfer,
    Trap,
    fingerprint,
)

__all__ = ["format_golden"]

_D = 64  # hidden size
_F32 = 4


def _w(name: str, shape: tuple[int, ...], **kw: object) -> TensorEntry:
    n = 1
    for d in shape:
        n *= d
    stride: list[int] = []
    step = 1
    for d in reversed(shape):
        stride.insert(0, step)
        step *= d
    return TensorEntry(name=name, bytes=n * _F32, dtype="float32", shape=shape, stride=tuple(stride),
                       **kw)  # type: ignore[arg-type]  # fmt: skip


def _layer(i: int, block: int, disk: bool = False) -> Trap:
    qkv = _w(f"layers.{i}.attn.qkv.weight", (3 * _D, _D), placement="streamed", block=block,
             offset=0)  # fmt: skip
    mlp = _w(f"layers.{i}.mlp.weight", (4 * _D, _D), placement="disk" if disk else "streamed",
             block=block, offset=qkv.bytes)  # fmt: skip
    tensors = [qkv, mlp, _w(f"layers.{i}.norm.weight", (_D,))]
    if i == 1:
        tensors.append(_w("layers.1.mlp.weight.scale", (4 * _D,), placement="streamed",
                          block=block, offset=qkv.bytes + mlp.bytes, kind="inner"))  # fmt: skip
    return Trap(name=f"layers.{i}", kind="module", compute_ms=0.5 + 0.1 * i, tensors=tuple(tensors))


def format_golden() -> Profile:
    """A fixed profile covering every field of the wire format."""
    embed = _w("embed.weight", (1000, _D))
    head = _w("lm_head.weight", (1000, _D), tie="embed.weight")
    traps = (
        Trap("embed", "module", 0.05, (embed,)),
        _layer(0, 0), _layer(1, 1), _layer(2, 0), _layer(3, 1, disk=True),
        Trap("gap:5", "gap", 0.2),
        Trap("lm_head", "module", 0.3, (head,)),
    )  # fmt: skip
    layer_bytes = 7 * _D * _D * _F32 + 4 * _D * _F32  # qkv + mlp + the inner scale of layer 1
    blocks = (Block(0, layer_bytes), Block(1, layer_bytes))
    span = 7 * _D * _D * _F32
    schedule = (
        Transfer(trap=1, block=0, offset=0, bytes=span, issue_at=5, release_after=1),
        Transfer(trap=2, block=1, offset=0, bytes=span + 4 * _D * _F32, issue_at=0,
                 release_after=2),
        Transfer(trap=3, block=0, offset=0, bytes=span, issue_at=2, release_after=3),
        Transfer(trap=4, block=1, offset=0, bytes=span, issue_at=3, release_after=4),
    )  # fmt: skip
    untrapped = (_w("final_norm.weight", (_D,)),)
    all_entries = [t for trap in traps for t in trap.tensors] + list(untrapped)
    resident = sum(t.bytes for t in all_entries if t.placement == "resident" and t.tie is None)
    streamed = sum(t.bytes for t in all_entries if t.placement != "resident" and t.tie is None)
    compute = sum(t.compute_ms for t in traps)
    return Profile(
        meta=Meta(tool_version="0.1.0", torch_version="2.13.0", command="make golden",
                  timing_source="synthetic"),
        model=fingerprint(all_entries),
        device=DeviceSpec(name="example-gpu", memory_bytes=16 << 20, h2d_bytes_per_s=25e9,
                          h2d_latency_ms=0.01, kind="target",
                          bandwidth_curve=(BandwidthPoint(1 << 16, 8e9),
                                           BandwidthPoint(1 << 24, 25e9))),
        config=PlanConfig(include_patterns=("layers.*",), budget_bytes=4 << 20,
                          mem_fraction=0.25, strategy="knapsack", num_blocks=2),
        traps=traps, blocks=blocks, schedule=schedule, untrapped=untrapped,
        predicted=Predicted(compute_ms=compute, makespan_ms=compute + 0.1, stall_ms=0.1,
                            peak_bytes=resident + 2 * layer_bytes, resident_bytes=resident,
                            streamed_bytes=streamed,
                            trap_stall_ms=(0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0)),
        extensions={"x-notes": {"purpose": "format golden", "values": [1, 2.5, "three"]}},
    )  # fmt: skip
