"""`python -m bench.caches`: the speed/quality curve of the cross-step caches.

Runs one dense trajectory and one per cache setting (fixed skip sets with and without
extrapolation, adaptive thresholds), all installed from `caches` section specs exactly as a
profile would carry them, and reports dense calls saved and the final output's relative error
against the dense trajectory, as a table and (with --plot PATH) a figure.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.caches.denoiser import Scene, Trajectory, build_scene, run_trajectory
from flextensor_runtime.cache_section import parse_cache_section, parse_cache_spec


@dataclass(frozen=True)
class Row:
    family: str
    spec: str
    dense_calls: int
    steps: int
    rel_error: float
    wall_ms: float

    @property
    def saved(self) -> float:
        return 1.0 - self.dense_calls / self.steps


def _specs(steps: int, thresholds: list[float]) -> list[tuple[str, str]]:
    last = steps - 3  # keep the first two and the last two steps dense
    specs = []
    for delta in (0, 1):
        family = "fixed-step" if delta == 0 else "fixed-step, delta_scale=1"
        for stride in (4, 3, 2):
            skip = f"{2 + stride - 1}-{last}/{stride}"
            specs.append(
                (family, f"fixed-step:skip={skip};dense_first=2;dense_last=2;delta_scale={delta}")
            )
    for threshold in thresholds:
        specs.append((
            "adaptive-residual",
            f"adaptive-residual:threshold={threshold};signal=hidden_states",
        ))  # fmt: skip
    return specs


def _row(family: str, spec: str, run: Trajectory, dense: Trajectory) -> Row:
    diff = (run.final - dense.final).norm() / dense.final.norm()
    return Row(family, spec, run.dense_calls, run.steps, float(diff), run.wall_ms)


def _table(rows: list[Row], dense: Trajectory) -> str:
    lines = [
        f"dense: {dense.steps} steps, {dense.wall_ms:.0f} ms",
        f"{'policy':<28} {'dense calls':>11} {'saved':>6} {'rel. error':>10} {'ms':>6}  spec",
    ]
    for r in rows:
        lines.append(
            f"{r.family:<28} {r.dense_calls:>5}/{r.steps:<5} {r.saved:>6.0%} {r.rel_error:>10.2e} "
            f"{r.wall_ms:>6.0f}  {r.spec.split(':', 1)[1]}"
        )
    return "\n".join(lines)


def _plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for family, marker in (("fixed-step", "o"), ("fixed-step, delta_scale=1", "s"),
                           ("adaptive-residual", "^")):  # fmt: skip
        pts = sorted((r.saved * 100, max(r.rel_error, 1e-8)) for r in rows if r.family == family)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=marker, label=family)
    ax.set_xlabel("dense calls saved (%)")
    ax.set_ylabel("final output relative error vs dense")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(prog="python -m bench.caches", description=__doc__)
    parser.add_argument("--steps", type=int, default=28, help="sampler steps (default 28)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--thresholds", default="0.01,0.02,0.03,0.05,0.1",
                        help="adaptive thresholds, comma separated")  # fmt: skip
    parser.add_argument("--plot", type=Path, help="write the speed/quality figure here (PNG)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    scene: Scene = build_scene()
    run_trajectory(scene, 2, None)  # warm up kernels and allocator
    dense = run_trajectory(scene, args.steps, None)
    thresholds = [float(x) for x in args.thresholds.split(",") if x]
    rows = []
    for family, spec in _specs(args.steps, thresholds):
        section = parse_cache_section(parse_cache_spec(spec))
        rows.append(_row(family, spec, run_trajectory(scene, args.steps, section), dense))
    print(_table(rows, dense))
    if args.plot:
        _plot(rows, args.plot)
        print(f"plot written to {args.plot}")
    if args.json:
        args.json.write_text(json.dumps([vars(r) | {"saved": r.saved} for r in rows], indent=1))
    return rows


if __name__ == "__main__":
    main()
