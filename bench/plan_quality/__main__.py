"""Plan-quality benchmark: `python -m bench.plan_quality [--peer-python PY] [--json out.json]`.

For every instance x bandwidth (PCIe4, PCIe5) x budget (30/50/70/90% of weight bytes) it prints
our predicted makespan over the lower bound LB = max(total compute, copy time of (weights -
budget)) and over the staging bound LB* (`staging_bound_ms`: what every plan must also stage and
copy, and the copy engine's idle time while traps compute), the stall, the peak against the
budget and the solve time (CPU, the least of 5 passes over all cases); and the same for FlexTensor 0.5's AdaptiveStrategy
(streamed set judged by our simulator) when `--peer-python` names an interpreter that has
`flextensor==0.5.0` installed (`make bench-plan-quality` sets one up).

Beside the module traps, each case is also solved at leaf granularity (`leaves.py`: the traps
`ftc --granularity leaves` records for the same model and workload; least CPU time of
`auto.LEAF_REPEATS` passes) and the plan `prefer_leaves` keeps of the two is reported as `auto`
(what `--granularity auto` emits; its solve time is both solves). LB keeps one definition for
every column, max(total compute of the MODULE instance, copy time of (weights - budget)), so the
ratios compare; the leaf instances carry the same compute and weights. `/LB*` columns are over
the staging bound of the problem each plan solves. FlexTensor runs on the module instances only.
Solve times are pure-Python CPU times, so the summary also prints a reference loop's time
(`cpu_reference_ms`) to compare them across machines.
`--copy-model curve|latency` or `--copy-curve FILE` (a curve `python -m bench.gpu --curve-out`
measured) sets how the devices time a copy (`copy_models`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import replace

from bench.plan_quality import auto, targets
from bench.plan_quality.copy_models import COPY_MODELS, CURVE, CopyModel, measured_model
from bench.plan_quality.instances import BANDWIDTHS, INSTANCES, device
from bench.plan_quality.peer import PeerResult, cached_peer, judge, peer_document
from flextensor_compile.solve import Plan, Problem, problem_from_stats, solve, staging_bound_ms
from flextensor_compile.stats import Stats
from flextensor_runtime.profile import PlanConfig

FRACTIONS = (0.3, 0.5, 0.7, 0.9)
REPEATS = 5
HEADER = (f"{'instance':<26}{'link':<6}{'budget':>7}{'LB ms':>10}{'ours/LB':>9}{'ours/LB*':>9}"
          f"{'stall ms':>10}{'peak/bud':>9}{'solve ms':>9}{auto.COLUMNS}{'FT/LB':>8}{'FT peak/bud':>12}{'FT s':>7}  FT pick")  # fmt: skip


Case = tuple[str, str, float, Stats, Problem, int]  # name, link, fraction, stats, problem, weights


def _cases(names: list[str], fractions: tuple[float, ...], blocks: int | None = None,
           model: CopyModel = CURVE) -> Iterator[Case]:  # fmt: skip
    """Every instance x link x budget; `blocks`: exactly that many memory blocks
    (`--num-blocks N --min-blocks N`); `model`: how the devices time a copy."""
    for name in names:
        base = INSTANCES[name]()
        weights = sum(t.bytes for tr in base.traps for t in tr.tensors if t.tie is None)
        for link, rate in BANDWIDTHS.items():
            stats = replace(base, device=device(rate, model))
            for frac in fractions:
                config = PlanConfig(budget_bytes=int(frac * weights), num_blocks=blocks,
                                    min_blocks=blocks or 1)  # fmt: skip
                yield name, link, frac, stats, problem_from_stats(stats, config), weights


def lower_bound_ms(problem: Problem, weights: int) -> float:
    """LB = max(total compute, copy time of (weights - budget)): that copy as one copy, or, with
    a curve, at the least per-byte time of any copy size when some size copies faster per byte
    than it (a measured curve can, by noise or caches; then one copy is not the fastest way to
    move the bytes). The suite's own curves copy larger sizes no slower per byte, so there it is
    the one copy's time (to float rounding)."""
    budget = problem.budget_bytes
    assert budget is not None  # every case has a budget
    need = max(0, weights - budget)
    bw = problem.bandwidth
    copy_ms = bw.copy_ms(need)
    if need and bw.points:  # per-byte time is monotone between knots and tends to the tail's
        per_byte = [bw.copy_ms(b) / b for b, _ in bw.points] + [1 / bw.tail_bytes_per_ms]
        copy_ms = min(copy_ms, need * min(per_byte))
    return max(problem.compute_ms, copy_ms)


def _row(case: Case, plan: Plan, solve_ms: float, peer: PeerResult | None) -> dict:
    name, link, frac, _stats, problem, weights = case
    budget = problem.budget_bytes
    assert budget is not None  # every case has a budget
    lb = lower_bound_ms(problem, weights)
    lb_star = staging_bound_ms(problem)
    row = {"instance": name, "link": link, "fraction": frac, "lb_ms": lb, "lb_star_ms": lb_star,
           "ratio": plan.makespan_ms / lb, "ratio_star": plan.makespan_ms / lb_star,
           "stall_ms": plan.simulation.stall_ms, "peak_over_budget": plan.peak_bytes / budget,
           "solve_ms": solve_ms, "strategy": plan.strategy, "blocks": len(plan.block_bytes)}  # fmt: skip
    if peer is not None:
        ok = peer.plan is not None and not peer.error
        ft_ms = peer.plan.makespan_ms if ok and peer.plan else None
        row.update({"ft_ratio": ft_ms / lb if ft_ms else None,
                    "ft_ratio_star": ft_ms / lb_star if ft_ms else None,
                    "ft_peak_over_budget": peer.peak_bytes / budget if ok else None,
                    "ft_solve_s": peer.solve_s, "ft_pick": peer.selected or peer.error[:40]})  # fmt: skip
    return row


def _fmt(row: dict) -> str:
    ft = ""
    if "ft_pick" in row:
        r, p = row["ft_ratio"], row["ft_peak_over_budget"]
        ft = (f"{r:>8.3f}" if r else f"{'-':>8}") + (f"{p:>12.3f}" if p else f"{'-':>12}")
        ft += f"{row['ft_solve_s']:>7.2f}  {row['ft_pick']}"
    return (f"{row['instance']:<26}{row['link']:<6}{row['fraction']:>7.0%}{row['lb_ms']:>10.1f}"
            f"{row['ratio']:>9.3f}{row['ratio_star']:>9.3f}{row['stall_ms']:>10.1f}"
            f"{row['peak_over_budget']:>9.3f}{row['solve_ms']:>9.1f}{auto.fmt_columns(row)}{ft}")  # fmt: skip


def _against_star(ratios: list[float]) -> str:
    return (f"against the staging bound: median {statistics.median(ratios):.3f}, "
            f"worst {max(ratios):.3f}")  # fmt: skip


def _bound_itself(rows: list[dict]) -> str:
    """How far the staging bound is above LB: where it is above 1.03 x LB no plan reaches 1.03."""
    tight = [r["lb_star_ms"] / r["lb_ms"] for r in rows]
    above = sum(t > 1.03 for t in tight)
    return (f"the bound itself: median {statistics.median(tight):.3f} x LB, "
            f"above 1.03 x LB on {above} of {len(rows)}")  # fmt: skip


def _summary(rows: list[dict], reference_ms: float) -> list[str]:
    ratios = [r["ratio"] for r in rows]
    solves = [r["solve_ms"] for r in rows]
    lines = [f"ours: median makespan/LB {statistics.median(ratios):.3f}, worst {max(ratios):.3f}, "
             f"median solve {statistics.median(solves):.1f} ms, max {max(solves):.1f} ms; "
             f"{_against_star([r['ratio_star'] for r in rows])}; {_bound_itself(rows)}"]  # fmt: skip
    big = [r["solve_ms"] for r in rows if r["instance"] == "llama-70b-fp8-prefill2k"]
    if big:
        lines.append(f"80-layer x 24-tensor instance (82 traps): max solve {max(big):.1f} ms")
    lines.append(f"CPU reference (the sum of 10,000 squares in Python, least of one run beside "
                 f"each timed solve): "
                 f"{reference_ms:.3f} ms on this machine; solve times scale with it")  # fmt: skip
    peer = [r for r in rows if r.get("ft_ratio")]
    if peer:
        ft = [r["ft_ratio"] for r in peer]
        worse = [r for r in peer if r["ratio"] > r["ft_ratio"] * (1 + 1e-9)]
        over = [r for r in peer if r["ft_peak_over_budget"] > 1]
        lines.append(f"FlexTensor Adaptive: median {statistics.median(ft):.3f}, worst {max(ft):.3f}"
                     f", median solve {statistics.median(r['ft_solve_s'] for r in peer):.2f} s, "
                     f"over budget on {len(over)} of {len(peer)}; ours worse on {len(worse)}; "
                     f"{_against_star([r['ft_ratio_star'] for r in peer])}")  # fmt: skip
    return lines


def cpu_reference_ms(repeats: int = REPEATS) -> float:
    """The least CPU time of a fixed pure-Python loop (the sum of 10,000 squares): solve times
    are CPU times of pure Python, so they compare across machines in units of this."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        sum(i * i for i in range(10_000))
        best = min(best, (time.process_time() - start) * 1e3)
    return best


def _solve_times(cases: list) -> tuple[list[float], float]:
    """Per case the least CPU time of `REPEATS` solves, one per pass over all the cases (the
    machine's other load only adds time, and a slow spell then spoils one pass, not every try),
    and the least time of the CPU reference loop, run beside every case in those same passes
    (on a machine whose speed drifts, a reference taken once would not match the solves)."""
    best = [float("inf")] * len(cases)
    reference = float("inf")
    for _ in range(REPEATS):
        for k, case in enumerate(cases):
            reference = min(reference, cpu_reference_ms(1))
            start = time.process_time()
            solve(case[4], "adaptive")
            best[k] = min(best[k], (time.process_time() - start) * 1e3)
    return best, reference


def add_copy_model_options(ap: argparse.ArgumentParser) -> None:
    group = ap.add_mutually_exclusive_group()
    group.add_argument(
        "--copy-model",
        choices=COPY_MODELS,
        default="curve",
        help="how the devices time a copy (copy_models.COPY_MODELS)",
    )
    group.add_argument("--copy-curve", metavar="FILE", help="time copies by a curve that "
                       "`python -m bench.gpu --curve-out FILE` measured on a GPU")  # fmt: skip


def copy_model(ap: argparse.ArgumentParser, args: argparse.Namespace) -> CopyModel:
    """The copy model the options name (exits with the file's error for a bad curve file)."""
    if args.copy_curve is None:
        return COPY_MODELS[args.copy_model]
    try:
        return measured_model(args.copy_curve)
    except ValueError as exc:
        ap.error(str(exc))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.plan_quality")
    ap.add_argument("--peer-python", help="interpreter with flextensor==0.5.0 installed")
    ap.add_argument("--instances", nargs="*", default=list(INSTANCES))
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--peer-cache", help="reuse/keep FlexTensor's answers in this JSON file "
                    "(keyed by a hash of the instances)")  # fmt: skip
    ap.add_argument("--blocks", type=int, help="plan with exactly this many memory blocks, as "
                    "--num-blocks N --min-blocks N (FlexTensor is not run)")  # fmt: skip
    add_copy_model_options(ap)
    args = ap.parse_args()
    if args.blocks is not None and (args.blocks < 1 or args.peer_python):
        ap.error("--blocks must be at least 1, and FlexTensor is not run with it")
    model = copy_model(ap, args)
    print(f"copy model: {model.name}")
    cases = list(_cases(args.instances, FRACTIONS, args.blocks, model))
    answers: list[dict | None] = [None] * len(cases)
    if args.peer_python:
        docs = [peer_document(c[3], c[4]) for c in cases]
        answers = list(cached_peer(args.peer_python, docs, args.peer_cache))
    else:
        print("FlexTensor 0.5 not run: pass --peer-python (make bench-plan-quality does)")
    solve_ms, reference_ms = _solve_times(cases)
    leaf_problems = auto.leaf_problems([(c[0], c[3], c[4]) for c in cases])
    leaf_plans, leaf_ms = auto.solve_leaves(leaf_problems, min(REPEATS, auto.LEAF_REPEATS))
    print(HEADER)
    rows = []
    for k, (case, answer, ms) in enumerate(zip(cases, answers, solve_ms, strict=True)):
        plan = solve(case[4], "adaptive")
        peer = judge(case[4], answer) if answer is not None else None
        rows.append(_row(case, plan, ms, peer))
        leaves = (leaf_problems[k], leaf_plans[k])
        rows[-1] |= auto.auto_fields(rows[-1]["lb_ms"], (case[4], plan), leaves, (ms, leaf_ms[k]))
        print(_fmt(rows[-1]), flush=True)
    for line in (_summary(rows, reference_ms) + auto.summary(rows)
                 + targets.target_lines(rows, reference_ms)):  # fmt: skip
        print(line)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
