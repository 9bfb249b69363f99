"""Runs FlexTensor 0.5's AdaptiveStrategy on one instance (executed by FlexTensor's own venv).

Reads a JSON list of instances on stdin, writes a JSON list of results on stdout. It imports
only the standard library and the installed `flextensor` package (a peer to measure, not a
dependency). Instance and result:
    {"traps": [{"name", "compute_ms", "tensors": [{"name", "bytes", "copy_ms"}]}],
     "memory_stats": [[bytes, ms], ...], "budget_bytes": int | null}
 -> {"offloaded": {trap: [tensor, ...]}, "n_blocks": int, "block_bytes": [int, ...],
     "selected": str, "solve_s": float}  or  {"error": str}
"""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings


def main() -> None:
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from flextensor.collectors import LayerStatistics, TensorStatistics
    from flextensor.strategy.adaptive import AdaptiveStrategy

    json.dump([_run(doc, AdaptiveStrategy, LayerStatistics, TensorStatistics)
               for doc in json.load(sys.stdin)], sys.stdout)  # fmt: skip


def _run(doc: dict, adaptive: type, layer_cls: type, tensor_cls: type) -> dict:
    layer_stats, tensor_id = [], 0
    for trap in doc["traps"]:
        tensors = []
        for t in trap["tensors"]:
            tensors.append(
                tensor_cls(
                    tensor_id=tensor_id,
                    name=t["name"],
                    size_bytes=t["bytes"],
                    load_time_ms=t["copy_ms"],
                )
            )
            tensor_id += 1
        layer_stats.append(
            layer_cls(label=trap["name"], tensors=tensors, duration=trap["compute_ms"])
        )
    memory_stats = {int(b): float(ms) for b, ms in doc["memory_stats"]}
    strategy = adaptive(
        scale=1.0, loader_type="allocation_block_transfer", n_blocks=4, min_blocks=4
    )  # FlexTensor 0.5's config defaults
    start = time.perf_counter()
    try:
        result = strategy.compute(layer_stats, memory_stats, doc["budget_bytes"])
    except Exception as exc:  # the peer's own failure is a result to report
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    solve_s = time.perf_counter() - start
    offloaded = {label: [t.name for t in ts] for label, ts in result.strategy_map.items() if ts}
    sizes = result.block_data.block_sizes if result.block_data else []
    block_bytes = list(sizes.values()) if isinstance(sizes, dict) else list(sizes)
    return {
        "offloaded": offloaded,
        "n_blocks": len(block_bytes),
        "block_bytes": [int(b) for b in block_bytes],
        "selected": strategy.selected_strategy_name,
        "solve_s": solve_s,
    }


if __name__ == "__main__":
    main()
