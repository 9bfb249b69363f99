"""One iteration of a profile on a timeline: the compute lane and the copy lane, and its plot.

Owns: replaying a profile's schedule through the solver's simulator (`simulate_profile`), and
drawing both lanes to a PNG with matplotlib (optional: a clear `ConfigError` when absent).
Must not know: how the plan was chosen, the CLI, torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flextensor_compile.solve import BandwidthModel, CopyJob, Simulation, simulate
from flextensor_compile.units import count_of, printable
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import DeviceSpec, Profile

__all__ = ["bandwidth_of", "import_pyplot", "one_period", "plot_timeline", "simulate_profile"]


def bandwidth_of(device: DeviceSpec) -> BandwidthModel:
    curve = tuple((p.bytes, p.bytes_per_s) for p in device.bandwidth_curve)
    return BandwidthModel.from_curve(curve, device.h2d_bytes_per_s, device.h2d_latency_ms)


def simulate_profile(profile: Profile) -> Simulation:
    """The simulator's steady-state iteration for this profile's schedule."""
    bw = bandwidth_of(profile.device)
    jobs = tuple(CopyJob(t.trap, t.issue_at, bw.copy_ms(t.bytes)) for t in profile.schedule)
    return simulate(tuple(t.compute_ms for t in profile.traps), jobs)


def import_pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend, or a ConfigError naming the fix."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(
            "plotting needs matplotlib, which is not installed; install it with "
            "`pip install 'flextensor-compiler[plot]'`"
        ) from None
    return plt


def plot_timeline(
    profile: Profile, path: str | os.PathLike[str], image_format: str | None = None
) -> Path:
    """Draw one steady-state iteration (compute lane above, copy lane below) to an image in
    `image_format` (None: from the suffix); copies issued in the iteration before are drawn
    where they run for the next one (`one_period`)."""
    plt = import_pyplot()
    sim = simulate_profile(profile)
    fig, ax = plt.subplots(figsize=(12, 2.8))
    colors = plt.get_cmap("tab10")
    # one call per colour, not per span: thousands of leaf traps draw in well under a second;
    # stalls last, over the edges of the computes beside them
    ax.broken_barh([(s, e - s) for s, e in sim.trap_spans_ms], (1.1, 0.8), color="#4c72b0",
                   edgecolor="white", linewidth=0.3)  # fmt: skip
    stalls = [(s - w, w) for (s, _), w in zip(sim.trap_spans_ms, sim.trap_stall_ms, strict=True)
              if w > 0]  # fmt: skip
    ax.broken_barh(stalls, (1.1, 0.8), color="#d62728", alpha=0.35)
    by_colour: dict[int, list[tuple[float, float]]] = {}
    for job, (_, start, end) in zip(sim.copy_jobs, sim.copy_spans_ms, strict=True):
        pieces = by_colour.setdefault(profile.schedule[job].block % 10, [])
        pieces.extend(one_period(start, end, sim.makespan_ms))
    for colour, spans in sorted(by_colour.items()):
        ax.broken_barh(spans, (0.1, 0.8), color=colors(colour), edgecolor="white",
                       linewidth=0.3)  # fmt: skip
    ax.set_yticks([0.5, 1.5], ["copy (colour = block)", "compute (red = stall)"])
    ax.set_xlabel("ms")
    ax.set_title(f"{_plain(profile.meta.command or 'profile')}: makespan {sim.makespan_ms:.2f} ms, "
                 f"stall {sim.stall_ms:.2f} ms, {count_of(len(profile.schedule), 'copy')}")  # fmt: skip
    if sim.makespan_ms > 0:  # an iteration of no compute and no copies: matplotlib's own range
        ax.set_xlim(0.0, sim.makespan_ms)
    fig.tight_layout()
    target = Path(path)
    fig.savefig(target, dpi=120, format=image_format)
    plt.close(fig)
    return target


def one_period(start: float, end: float, period: float) -> list[tuple[float, float]]:
    """A copy's (start, width) pieces within one period [0, `period`): the schedule repeats
    every iteration, so a copy issued during the iteration before (a negative start) is drawn
    where the same copy for the next iteration runs, split where it wraps."""
    width = end - start
    if not period > 0 or width <= 0:
        return [(start, width)] if width > 0 else []
    if width >= period:  # not in a steady state (copies fit in one period), but never outside
        return [(0.0, period)]
    at = start % period
    if at >= period:  # a start a hair below 0: float `%` rounds it up to the period
        at = 0.0
    if at + width <= period:
        return [(at, width)]
    return [(at, period - at), (0.0, at + width - period)]


def _plain(text: str) -> str:
    """`text` drawn as written: control characters as escapes (no font has them) and `$`
    escaped (matplotlib would read `$...$` as math)."""
    return printable(text).replace("$", r"\$")
