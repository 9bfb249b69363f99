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
from flextensor_compile.units import printable
from flextensor_runtime.errors import ConfigError
from flextensor_runtime.profile import DeviceSpec, Profile

__all__ = ["bandwidth_of", "import_pyplot", "plot_timeline", "simulate_profile"]


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


def plot_timeline(profile: Profile, path: str | os.PathLike[str]) -> Path:
    """Draw one steady-state iteration (compute lane above, copy lane below) to a PNG."""
    plt = import_pyplot()
    sim = simulate_profile(profile)
    block_of = {t.trap: t.block for t in profile.schedule}
    fig, ax = plt.subplots(figsize=(12, 2.8))
    colors = plt.get_cmap("tab10")
    for order, (start, end) in enumerate(sim.trap_spans_ms):
        stall = sim.trap_stall_ms[order]
        if stall > 0:
            ax.broken_barh([(start - stall, stall)], (1.1, 0.8), color="#d62728", alpha=0.35)
        ax.broken_barh([(start, end - start)], (1.1, 0.8), color="#4c72b0",
                       edgecolor="white", linewidth=0.3)  # fmt: skip
    for trap, start, end in sim.copy_spans_ms:
        ax.broken_barh([(start, end - start)], (0.1, 0.8), color=colors(block_of[trap] % 10),
                       edgecolor="white", linewidth=0.3)  # fmt: skip
    ax.set_yticks([0.5, 1.5], ["copy (colour = block)", "compute (red = stall)"])
    ax.set_xlabel("ms")
    ax.set_title(f"{_plain(profile.meta.command or 'profile')}: makespan {sim.makespan_ms:.2f} ms, "
                 f"stall {sim.stall_ms:.2f} ms, {len(profile.schedule)} copies")  # fmt: skip
    ax.set_xlim(min([0.0] + [s for _, s, _ in sim.copy_spans_ms]), sim.makespan_ms)
    fig.tight_layout()
    target = Path(path)
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target


def _plain(text: str) -> str:
    """`text` drawn as written: control characters as escapes (no font has them) and `$`
    escaped (matplotlib would read `$...$` as math)."""
    return printable(text).replace("$", r"\$")
