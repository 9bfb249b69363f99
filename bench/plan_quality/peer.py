"""FlexTensor 0.5's AdaptiveStrategy as a peer, judged by our simulator.

Owns: describing an instance to `peer_worker.py` (run by the interpreter of a separate venv where
`flextensor==0.5.0` is installed), and turning its answer (which tensors each trap offloads, how
many blocks) into one of our plans: its streamed set, scheduled by our assignment with its block
count, simulated by our simulator. Its peak is our resident bytes plus its own block sizes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from flextensor_compile.solve import Plan, Problem, build_plan
from flextensor_compile.stats import Stats

__all__ = ["PeerResult", "cached_peer", "judge", "peer_document", "run_peer"]

_SIZES = tuple(1 << k for k in range(10, 36))


@dataclass(frozen=True)
class PeerResult:
    plan: Plan | None
    peak_bytes: int
    solve_s: float
    selected: str
    error: str = ""


def peer_document(stats: Stats, problem: Problem) -> dict:
    bw = problem.bandwidth
    streamable = {it.name for t in problem.traps for it in t.items}
    traps = [{"name": t.name, "compute_ms": t.compute_ms,
              "tensors": [{"name": x.name, "bytes": x.bytes, "copy_ms": bw.copy_ms(x.bytes)}
                          for x in t.tensors if x.name in streamable]} for t in stats.traps]  # fmt: skip
    return {"traps": traps, "memory_stats": [[b, bw.copy_ms(b)] for b in _SIZES],
            "budget_bytes": problem.budget_bytes}  # fmt: skip


def run_peer(python: str, docs: list[dict], timeout_s: float = 3600) -> list[dict]:
    """Run the worker once for all instances (imports are paid once)."""
    proc = subprocess.run(
        [python, "-m", "bench.plan_quality.peer_worker"], input=json.dumps(docs),
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"FlexTensor worker failed: {tail[0][:300]}")
    return json.loads(proc.stdout)


def cached_peer(python: str, docs: list[dict], cache: str | None) -> list[dict]:
    """`run_peer`, reusing answers saved in `cache` for exactly these instances."""
    key = hashlib.sha256(json.dumps(docs, sort_keys=True).encode()).hexdigest()
    path = Path(cache) if cache else None
    if path is not None and path.exists():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return saved["answers"]
    answers = run_peer(python, docs)
    if path is not None:
        path.write_text(json.dumps({"key": key, "answers": answers}))
    return answers


def judge(problem: Problem, answer: dict) -> PeerResult:
    """Our simulation of the peer's streamed set (and its own block sizes for the peak)."""
    if "error" in answer:
        return PeerResult(None, 0, 0.0, "", answer["error"])
    # its map is keyed by the trap during which a copy runs, not the trap that reads it
    names = {name for group in answer["offloaded"].values() for name in group}
    selection = []
    for trap in problem.traps:
        selection.append(tuple(k for k, it in enumerate(trap.items) if it.name in names))
    sel = tuple(selection)
    plan = None
    for k in range(max(1, answer["n_blocks"]), answer["n_blocks"] + 4):
        plan = build_plan(problem, sel, k, "flextensor-adaptive")
        if plan is not None:
            break
    peak = 0
    if plan is not None:
        peak = plan.resident_bytes + sum(answer["block_bytes"]) + problem.reserve_bytes
    return PeerResult(plan, peak, answer["solve_s"], answer["selected"])
