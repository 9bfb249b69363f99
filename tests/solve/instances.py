"""Hypothesis strategies and small builders for solver tests (random stats documents)."""

from __future__ import annotations

from hypothesis import strategies as st

from flextensor_compile.stats import Stats, TensorStat, TrapStat
from flextensor_runtime.profile import DeviceSpec


def tensor(
    name: str, elems: int, *, tie: str | None = None, offloadable: bool = True
) -> TensorStat:
    return TensorStat(name, elems * 2, "bfloat16", (elems,), (1,), tie=tie, offloadable=offloadable)


def device(bytes_per_s: float = 1e9, latency_ms: float = 0.0, curve: tuple = ()) -> DeviceSpec:
    return DeviceSpec("test", 1 << 40, bytes_per_s, latency_ms, curve, "target")


def uniform_stats(layers: int, compute_ms: float = 1.0, elems: int = 1000) -> Stats:
    traps = tuple(
        TrapStat(f"l{i}", compute_ms, (tensor(f"l{i}.a", elems), tensor(f"l{i}.b", elems // 2)))
        for i in range(layers)
    )
    return Stats("uniform", device(), traps)


@st.composite
def random_stats(
    draw: st.DrawFn, max_traps: int = 8, max_tensors: int = 4, nested: bool | None = None
) -> Stats:
    """`nested`: trap names with parent paths, so `adaptive`'s grouped candidates run (None:
    drawn)."""
    n = draw(st.integers(1, max_traps))
    drawn = draw(st.booleans())
    nested = drawn if nested is None else nested
    traps = []
    names: list[tuple[int, str]] = []
    for i in range(n):
        kind = draw(st.sampled_from(["module", "module", "module", "gap"]))
        compute = draw(st.floats(0.0, 5.0, allow_nan=False))
        tensors = []
        if kind == "module":
            for k in range(draw(st.integers(0, max_tensors))):
                name = f"t{i}.{k}"
                tie = None
                if names and draw(st.integers(0, 9)) == 0:
                    tie = draw(st.sampled_from(names))[1]
                elems = draw(st.integers(1, 5000))
                tensors.append(tensor(name, elems, tie=tie,
                                      offloadable=draw(st.integers(0, 9)) > 0))  # fmt: skip
                if tie is None:
                    names.append((i, name))
        # nested: two traps under each of a layer's two parts (`layer.0.a.p1`), so grouping by
        # parent path and by stack element give different groups
        name = f"layer.{i // 4}.{'ab'[i % 4 // 2]}.p{i % 2}" if nested else f"trap{i}"
        traps.append(TrapStat(name, compute, tuple(tensors), kind=kind))
    untrapped = (tensor("untrapped.w", draw(st.integers(1, 3000))),) if draw(st.booleans()) else ()
    bw = draw(st.sampled_from([1e6, 5e6, 2e7]))
    latency = draw(st.sampled_from([0.0, 0.01]))
    return Stats("random", device(bw, latency), tuple(traps), untrapped)


def total_bytes(stats: Stats) -> int:
    every = [t for trap in stats.traps for t in trap.tensors] + list(stats.untrapped)
    return sum(t.bytes for t in every if t.tie is None)
