"""The plan-quality instances at leaf granularity: what `ftc --granularity leaves` records.

Owns: `LEAF_INSTANCES`, for every instance of `instances.INSTANCES` the stats of the same model,
selected modules and workload with each selected module refined into the descendants that own
its parameters (every linear its own trap with its weight, bias and FP8 scales; every norm with
a weight its own tiny trap), in the architecture's forward order, and the parameter-free compute
between them (rotary and attention, activations, residual adds, routing) as gap traps
(`gap:after:<trap>`, no tensors). Tensors of a selected module that no leaf owns (the rotary
buffer of Llama-70B's layers, a Wan block's own `modulation`) stay resident as `untrapped`.
The embedding, head and embedder traps stay as the module instances have them.
Must not know: the solver, plans, the benchmark's rows.

Times: each leaf and gap gets its own roofline (`roofline.work_ms`: a linear's 2 * tokens * in *
out flops over its weights plus its input and output activations; attention's 4 * tokens *
context * width flops and, for Llama, the KV-cache bytes; elementwise ops by the activation
bytes they read and write) plus an equal share of the module trap's launch overhead (the same
kernels run at either granularity; the runtime's per-call host cost is `prefer_leaves`'s to
charge). Those own rooflines add up, per module trap, to 1.001 (Llama-8B decode, all memory
bound) to 1.131 (Mixtral's MoE) x the module trap's time (`roofline_ratios`): more, because the
module's roofline takes max(math, memory) over the whole module and so hides its memory-bound
norms, activations and small per-expert products under its math. The pieces are then scaled so that each module trap's leaves and gaps add up
to its time exactly (to the microsecond rounding of the stats): both granularities carry the
same work, and the lower bound LB of the module instance bounds both. Per layer (a gap counted
with the trap it follows) the leaf instances are within 1.1% of the module instances (a Wan
block's leading gap counts with the block before; every other instance within 0.001%). Where the module instance's workload is a convention
(a Flux modulation linear charged for every token of its stream, as the module instance charges
it, though the model applies it to one vector), the leaves keep the same convention.
Mixtral's experts each see tokens * 2 / 8 tokens (top-2 of 8, balanced routing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from bench.plan_quality.instances import INSTANCES
from bench.plan_quality.refine import (
    Piece,
    Refiner,
    flux_refiner,
    llama_refiner,
    mixtral_refiner,
    wan_refiner,
)
from bench.plan_quality.roofline import LAUNCH_MS, work_ms
from flextensor_compile.stats import Stats, TensorStat, TrapStat

__all__ = ["LEAF_INSTANCES", "REFINERS", "leaf_stats", "roofline_ratios"]

REFINERS: dict[str, Refiner] = {
    "llama-8b-decode": llama_refiner(4096, 14336, 1024, tokens=1, context=2048),
    "llama-8b-prefill2k": llama_refiner(4096, 14336, 1024, tokens=2048, context=2048),
    "llama-70b-fp8-prefill2k": llama_refiner(8192, 28672, 1024, tokens=2048, context=2048),
    "mixtral-8x7b-prefill2k": mixtral_refiner(4096, 14336, 1024, tokens=2048),
    "flux-12b-1024px": flux_refiner(3072, img=4096, txt=512),
    "wan-14b-480p": wan_refiner(5120, 13824, video=32760, text=512),
}


@dataclass(frozen=True)
class _Unit:
    """One module trap cut into pieces: per piece its tensors and its own roofline time."""

    pieces: tuple[Piece, ...]
    tensors: tuple[tuple[TensorStat, ...], ...]
    own_ms: tuple[float, ...]
    rest: tuple[TensorStat, ...]  # the module's tensors no leaf owns


def _unit(trap: TrapStat, pieces: list[Piece]) -> _Unit:
    owned = []
    for piece in pieces:
        prefix = f"{piece.leaf}." if piece.leaf is not None else None
        owned.append(tuple(t for t in trap.tensors if prefix and t.name.startswith(prefix)))
    claimed = [t.name for group in owned for t in group]
    assert len(claimed) == len(set(claimed)), f"{trap.name}: a tensor in two leaves"
    rest = tuple(t for t in trap.tensors if t.name not in set(claimed))
    share = LAUNCH_MS / len(pieces)
    own = tuple(work_ms(p.flops, sum(t.bytes for t in g) + p.act_bytes) + share
                for p, g in zip(pieces, owned, strict=True))  # fmt: skip
    return _Unit(tuple(pieces), tuple(owned), own, rest)


def _leaf_traps(trap: TrapStat, unit: _Unit, before: str | None) -> list[TrapStat]:
    scale = trap.compute_ms / sum(unit.own_ms)
    out: list[TrapStat] = []
    for piece, tensors, own_ms in zip(unit.pieces, unit.tensors, unit.own_ms, strict=True):
        compute_ms = round(own_ms * scale, 6)
        if piece.leaf is None:
            last = out[-1].name if out else before
            assert not out or out[-1].kind != "gap", f"{trap.name}: two gaps in a row"
            name = f"gap:after:{last}" if last is not None else "gap:start"
            out.append(TrapStat(name, compute_ms, (), "gap"))
        else:
            assert tensors, f"{piece.leaf} owns no tensor of {trap.name}"
            out.append(TrapStat(piece.leaf, compute_ms, tensors))
    return out


def leaf_stats(base: Stats, refine: Refiner) -> Stats:
    """`base` with each trap `refine` cuts into pieces replaced by its leaf and gap traps."""
    traps: list[TrapStat] = []
    untrapped = list(base.untrapped)
    for trap in base.traps:
        pieces = refine(trap.name)
        if pieces is None:
            traps.append(trap)
            continue
        unit = _unit(trap, pieces)
        new = _leaf_traps(trap, unit, traps[-1].name if traps else None)
        assert not traps or traps[-1].kind != "gap" or new[0].kind != "gap"
        traps += new
        untrapped += unit.rest
    return replace(base, traps=tuple(traps), untrapped=tuple(untrapped))


def roofline_ratios(name: str) -> dict[str, float]:
    """Per refined module trap of instance `name`: its leaves' and gaps' own rooflines (before
    scaling) added up, over the module trap's time."""
    out = {}
    for trap in INSTANCES[name]().traps:
        pieces = REFINERS[name](trap.name)
        if pieces is not None:
            out[trap.name] = sum(_unit(trap, pieces).own_ms) / trap.compute_ms
    return out


def _builder(name: str) -> Callable[[], Stats]:
    return lambda: leaf_stats(INSTANCES[name](), REFINERS[name])


LEAF_INSTANCES: dict[str, Callable[[], Stats]] = {name: _builder(name) for name in INSTANCES}
