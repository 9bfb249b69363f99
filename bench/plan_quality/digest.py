"""Plan digests, to show a solver change alters no plan: `python -m bench.plan_quality.digest
OUT.json [--against BASE.json] [--instances ...] [--fractions F ...]`.

Solves every plan-quality case (each instance x link x budget) under both copy models at module
and at leaf granularity, the module cases with exactly two and three blocks, the wide
random instances of `wide` (sizes that thin every subset table; `--no-wide` leaves them out)
and the large real-shaped instances of `large` (MoE traps of hundreds of equal experts, 1,766
leaf traps; 7-9 s of solving on a 2-core machine; `--no-large` leaves them out), and writes per
case a SHA-256 of the whole plan: strategy, selection, blocks, transfers, bytes and every
simulation figure (floats by `repr`, so a change in the last bit shows), with the strategy and
makespan beside it to read. `--against` compares with an earlier file and exits 1 on any
difference. Run it before and after a refactor of `flextensor_compile/solve/`.
Must not know: how plans are searched.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

from bench.plan_quality import auto, large, wide
from bench.plan_quality.__main__ import FRACTIONS, _cases
from bench.plan_quality.copy_models import COPY_MODELS
from bench.plan_quality.instances import INSTANCES
from flextensor_compile.solve import Plan, Problem, solve
from flextensor_runtime.errors import BudgetError

__all__ = ["compare", "digests", "plan_digest"]


def _exact(value: Any) -> Any:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return [_exact(v) for v in value]
    return value


def plan_digest(plan: Plan) -> list[str]:
    """[SHA-256 of everything the plan holds, 'strategy makespan'] (JSON-ready)."""
    sim = plan.simulation
    doc = [plan.strategy, repr(plan.selection), repr(plan.block_bytes), repr(plan.transfers),
           plan.resident_bytes, plan.streamed_bytes, plan.peak_bytes,
           {k: _exact(getattr(sim, k)) for k in sim.__dataclass_fields__}]  # fmt: skip
    text = json.dumps(doc, sort_keys=True)
    return [hashlib.sha256(text.encode()).hexdigest(), f"{plan.strategy} {plan.makespan_ms!r}"]


def _problems(names: list[str], fractions: tuple[float, ...]) -> Iterator[tuple[str, Problem]]:
    for model_name, model in COPY_MODELS.items():
        cases = list(_cases(names, fractions, None, model))
        leaves = auto.leaf_problems([(c[0], c[3], c[4]) for c in cases])
        for (name, link, frac, _stats, problem, _w), leaf in zip(cases, leaves, strict=True):
            key = f"{model_name} {name} {link} {frac:g}"
            yield f"{key} modules", problem
            yield f"{key} leaves", leaf
        for blocks in (2, 3):
            for name, link, frac, _stats, problem, _w in _cases(names, fractions, blocks, model):
                yield f"{model_name} {name} {link} {frac:g} blocks={blocks}", problem


def _wide_problems() -> Iterator[tuple[str, Problem]]:
    for label, problem in wide.wide_problems(list(wide.SHAPES), list(wide.FRACTIONS)):
        yield f"wide {label}", problem


def _large_problems(layers: int | None = None) -> Iterator[tuple[str, Problem]]:
    names, fractions = list(large.LARGE_INSTANCES), list(large.FRACTIONS)
    for label, problem in large.large_problems(names, fractions, layers):
        yield f"large {label}", problem


def digests(names: list[str], fractions: tuple[float, ...] = FRACTIONS,
            with_wide: bool = True, with_large: bool = True) -> dict[str, list[str]]:  # fmt: skip
    """Case -> `plan_digest` of its `adaptive` plan, or ['BudgetError', message]."""
    out: dict[str, list[str]] = {}
    cases = chain(_problems(names, fractions), _wide_problems() if with_wide else (),
                  _large_problems() if with_large else ())  # fmt: skip
    for key, problem in cases:
        try:
            out[key] = plan_digest(solve(problem, "adaptive"))
        except BudgetError as exc:  # a fixed block count may fit no plan: that is an outcome too
            out[key] = ["BudgetError", str(exc)]
    return out


def compare(base: dict[str, list[str]], new: dict[str, list[str]]) -> list[str]:
    """The cases whose digest differs, or that only one side has."""
    return sorted(k for k in base.keys() | new.keys() if base.get(k) != new.get(k))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.plan_quality.digest")
    ap.add_argument("out", type=Path, help="where to write the digests (JSON)")
    ap.add_argument("--against", type=Path, help="digests from before the change")
    ap.add_argument("--instances", nargs="*", default=list(INSTANCES))
    ap.add_argument("--fractions", type=float, nargs="*", default=list(FRACTIONS))
    ap.add_argument("--no-wide", action="store_true", help="leave out the wide random instances")
    ap.add_argument("--no-large", action="store_true", help="leave out the large instances")
    args = ap.parse_args()
    new = digests(args.instances, tuple(args.fractions), not args.no_wide, not args.no_large)
    args.out.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    print(f"{len(new)} plans digested into {args.out}")
    if args.against is None:
        return
    differ = compare(json.loads(args.against.read_text()), new)
    for key in differ:
        print(f"differs: {key}")
    print(f"compared with {args.against}: {len(differ)} of {len(new)} differ")
    if differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
