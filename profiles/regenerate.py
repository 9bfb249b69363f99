"""Regenerate the golden profiles in this folder (`make golden`): only on purpose, when the wire
format or the solver changes intentionally. Tests pin these bytes.

- `format_golden.msgpack`: a hand-built profile exercising every field of the format.
- `tiny_transformer.<case>.msgpack`: the solver's plans for the recorded measurements of the
  bundled example (`tiny_transformer.stats.json`) under fixed options (`SOLVER_GOLDENS`).
"""

from __future__ import annotations

from pathlib import Path

from flextensor_runtime.profile import PlanConfig, Profile, save
from profiles.golden import format_golden

HERE = Path(__file__).parent
STATS = HERE / "tiny_transformer.stats.json"

# case name -> plan options; versions are fixed so the bytes do not depend on the environment
SOLVER_GOLDENS: dict[str, PlanConfig] = {
    "f40": PlanConfig(mem_fraction=0.4),
    "f60": PlanConfig(mem_fraction=0.6),
    "f60-knapsack": PlanConfig(mem_fraction=0.6, strategy="knapsack"),
    "latency": PlanConfig(),
}


def solver_golden(case: str) -> Profile:
    """The profile the solver makes today for one golden case."""
    from flextensor_compile.config import plan_command
    from flextensor_compile.planning import plan_profile
    from flextensor_compile.stats import load_stats

    config = SOLVER_GOLDENS[case]
    return plan_profile(load_stats(STATS), config, command=plan_command(config),
                        tool_version="golden", torch_version="golden")  # fmt: skip


def main() -> None:
    written = [save(format_golden(), HERE / "format_golden.msgpack")]
    for case in SOLVER_GOLDENS:
        written.append(save(solver_golden(case), HERE / f"tiny_transformer.{case}.msgpack"))
    for path in written:
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
