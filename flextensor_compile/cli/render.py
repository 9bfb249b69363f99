"""Rich rendering shared by `ftc` commands: consoles, JSON output, the profile summary and trap table.

Owns: how documents look in a terminal, and `safe`: text read from a file or given by the user
(names, the recorded command, paths) is shown literally, never as rich markup or terminal
control characters. Must not know: how they are computed.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flextensor_compile.units import (
    count_of,
    format_bytes,
    format_fraction,
    format_ms,
    format_rate,
    printable,
)

__all__ = ["err_console", "out_console", "print_json", "render_inspect", "safe", "sweep_table"]


def safe(text: object) -> str:
    """`text` as literal console text: markup escaped, control characters shown as escapes."""
    return escape(printable(text))


_PIPE_WIDTH = 200  # piped output (logs, grep) is not cropped or wrapped at 80 columns


def _width(stream: TextIO) -> int | None:
    """None (rich's own: the terminal's, or $COLUMNS) for a terminal, else a wide fixed width."""
    if "COLUMNS" in os.environ or (hasattr(stream, "isatty") and stream.isatty()):
        return None
    return _PIPE_WIDTH


def out_console() -> Console:
    return Console(highlight=False, width=_width(sys.stdout))


def err_console() -> Console:
    return Console(stderr=True, highlight=False, width=_width(sys.stderr))


def print_json(doc: Any) -> None:
    """Machine-readable output: one JSON document on stdout, strict JSON (a number that is not
    finite, which JSON cannot hold, is written as null rather than as `NaN`)."""
    sys.stdout.write(json.dumps(_finite(doc), indent=2, sort_keys=False, allow_nan=False) + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _share_of_device(budget: int | None, memory: int) -> str:
    """A budget against the device's memory: a percentage, or a multiple past 10 x (a budget
    far over an emulated device, whose memory is the model's weights)."""
    if not budget or memory <= 0:
        return "device memory unknown"
    ratio = budget / memory
    return f"{ratio:.0%} of device" if ratio <= 10 else f"{ratio:.4g} x device memory"


def _summary(doc: dict[str, Any]) -> Table:
    dev, tot, pred = doc["device"], doc["totals"], doc["predicted"]
    budget = doc["budget_bytes"]
    memory = dev["memory_bytes"]  # 0 only in a hand-made profile: show it, divide by nothing
    share = _share_of_device(budget, memory)
    budget_text = "none (latency mode)" if budget is None else f"{format_bytes(budget)} ({share})"
    reserve = doc["config"].get("activation_reserve_bytes", 0)
    if reserve:  # in latency mode too: the peak counts it
        of_it = "" if budget is None else " of it"
        budget_text += f", {format_bytes(reserve)}{of_it} kept for activations"
    transfers = count_of(tot["transfer_count"], "transfer")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows = [
        ("model", f"{count_of(doc['model']['tensor_count'], 'tensor')}, "
                  f"{format_bytes(doc['model']['total_bytes'])}  [dim]{safe(doc['model']['digest'][:16])}[/]"),
        ("device", f"{safe(dev['name'])} ({safe(dev['kind'])}), "
                   f"{format_bytes(memory) if memory > 0 else 'device memory unknown'}, "
                   f"h2d {format_rate(dev['h2d_bytes_per_s'])}"),
        ("budget", budget_text),
        ("strategy", safe(f"{doc['config']['strategy']}, {doc['config']['transfer_mode']}")),
        ("resident", format_bytes(tot["resident_bytes"])),
        ("streamed", f"{format_bytes(tot['streamed_bytes'])} in {transfers}"
                     + (f" ({format_bytes(tot['disk_bytes'])} from disk)" if tot["disk_bytes"] else "")),
        ("blocks", f"{count_of(len(doc['blocks']), 'block')}, {format_bytes(tot['blocks_bytes'])}"),
        ("peak", format_bytes(pred["peak_bytes"])),
        ("predicted", f"compute {format_ms(pred['compute_ms'])} ms, makespan "
                      f"{format_ms(pred['makespan_ms'])} ms, stall {format_ms(pred['stall_ms'])} ms "
                      f"(overhead {_percent(pred['overhead'])})"),
        ("made by", safe(doc["meta"]["command"] or "-")),
    ]  # fmt: skip
    if doc["extensions"]:
        rows.append(("sections", safe(", ".join(doc["extensions"]))))
    for key, value in rows:
        grid.add_row(key, value)
    return grid


def _percent(value: float) -> str:
    """`12.5%`; a rounding residue such as -1e-17 shows as 0.0%, not -0.0%; past 10^6 % in 4
    significant figures (absurd measurements), as `format_ms` does."""
    if abs(value) >= 1e4:
        return f"{value * 100:.4g}%"
    return f"{value:.1%}" if abs(value) >= 0.0005 else "0.0%"


def _ms(value: float) -> str:
    """Milliseconds in at most 6 characters: 0.105, 17.2, 1.2e+03."""
    return "0" if value == 0 else f"{value:.3g}"


def _short_bytes(n: int) -> str:
    """Table cells: "-", "768K", "4.5M" (binary units)."""
    return "-" if not n else format_bytes(n).replace(" KiB", "K").replace(" MiB", "M").replace(
        " GiB", "G").replace(" TiB", "T").replace(" B", "B")  # fmt: skip


def _trap_table(doc: dict[str, Any]) -> Table:
    table = Table(
        title="traps in execution order (ms: compute per iteration, all calls; block, prefetch: of the trap's "
        "first copy, ×N when it has N; prefetch: the trap during which the copy is issued, ↺ in "
        "the previous iteration, ↓ at the trap's own entry; stall: predicted wait, ms)",
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("#", justify="right", no_wrap=True, min_width=2)
    table.add_column("trap", overflow="fold", min_width=8)  # long names fold, columns stay
    for col in ("kind", "ms", "resident", "streamed", "block", "prefetch", "stall"):
        table.add_column(
            col, justify="left" if col == "kind" else "right", no_wrap=True, min_width=len(col)
        )
    for t in doc["traps"]:
        at, order = t["prefetch_at"], t["order"]
        mark = "" if at is None or at < order else ("↺" if at > order else "↓")
        prefetch = "-" if at is None else f"{at}{mark}"
        count = len(t.get("transfers", ()))
        block = "-" if t["block"] is None else f"{t['block']}{f'×{count}' if count > 1 else ''}"
        table.add_row(
            str(t["order"]), safe(t["name"]), safe(t["kind"]), _ms(t["compute_ms"]),
            _short_bytes(t["resident_bytes"]), _short_bytes(t["streamed_bytes"]), block, prefetch,
            "-" if t["stall_ms"] is None else _ms(t["stall_ms"]),
        )  # fmt: skip
    return table


def render_inspect(doc: dict[str, Any], console: Console) -> None:
    """The human view of a profile: a summary, then the per-trap table."""
    console.print(_summary(doc))
    console.print()
    console.print(_trap_table(doc))


def sweep_table(points: Sequence[Any]) -> Table:
    """`ftc sweep`'s table: one row per budget fraction (points from `flextensor_compile.sweep`)."""
    table = Table(title="predicted iteration per budget (frac = fraction of the weight bytes; "
                  "makespan and stall in ms; x bound = makespan over the least any plan at "
                  "that budget can predict)", title_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True,
                  pad_edge=False)  # fmt: skip
    for col in ("frac", "budget", "makespan", "x bound", "stall", "streamed", "peak"):
        table.add_column(col, justify="right", no_wrap=True)
    # the strategy (or why no plan) folds before it is squeezed out of an 80-column terminal
    table.add_column("strategy", overflow="fold", min_width=12)
    for p in points:
        frac = format_fraction(p.fraction)
        if p.makespan_ms is None:
            table.add_row(frac, format_bytes(p.budget_bytes), "-", "-", "-", "-", "-",
                          safe(p.status))  # fmt: skip
            continue
        ratio = f"{p.makespan_ms / p.bound_ms:.3f}" if p.bound_ms else "-"
        table.add_row(frac, format_bytes(p.budget_bytes), format_ms(p.makespan_ms), ratio,
                      format_ms(p.stall_ms), format_bytes(p.streamed_bytes),
                      format_bytes(p.peak_bytes), safe(p.strategy or "-"))  # fmt: skip
    return table
