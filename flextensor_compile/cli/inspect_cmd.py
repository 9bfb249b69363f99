"""`ftc inspect PROFILE`: what a profile plans and what it predicts.

Owns: the inspect command's options. Must not know: the wire format (it uses the profile package)
or how documents are drawn (render).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from flextensor_compile.cli.help import FLAG, FtcCommand
from flextensor_compile.cli.streams import dash_is_stdout

__all__ = ["register"]


_EXPLAIN_HELP = "Say why each tensor streams or stays, and list the blocks."
_TIMELINE_HELP = "Draw one iteration's compute and copy lanes to this PNG."


def inspect(
    profile: Path = typer.Argument(..., help="An offload profile (.msgpack) written by ftc."),
    as_json: bool = typer.Option(
        False, "--json", metavar=FLAG, help="Print the stable JSON document."
    ),
    explain: bool = typer.Option(False, "--explain", metavar=FLAG, help=_EXPLAIN_HELP),
    timeline: Path = typer.Option(None, "--timeline", help=_TIMELINE_HELP, callback=dash_is_stdout),
) -> None:
    """Show a profile: model, device, budget, resident/streamed bytes, blocks, predictions, traps."""
    from flextensor_compile.cli.inputs import check_regular_file
    from flextensor_compile.cli.paths import check_distinct, check_image_file, write_image
    from flextensor_compile.cli.render import out_console, print_json, render_inspect, safe
    from flextensor_compile.cli.streams import check_stdout_outputs, text_off_stdout
    from flextensor_compile.inspect_doc import inspect_document
    from flextensor_runtime.errors import ProfileFormatError
    from flextensor_runtime.profile import load

    check_image_file(timeline, "--timeline")
    check_stdout_outputs(as_json, [("--timeline", timeline)])
    check_distinct([("--timeline", timeline)], [("the input profile", profile)])
    check_regular_file(profile, ProfileFormatError, "pass the .msgpack file `ftc profile` wrote")
    _reject_json(profile)
    loaded = load(profile)
    doc = inspect_document(loaded)
    if timeline is not None:
        from flextensor_compile.timeline import plot_timeline

        write_image(timeline, lambda tmp, fmt: plot_timeline(loaded, tmp, fmt))
    if explain:
        from flextensor_compile.explain import explain_profile, explanation_json

        expl = explain_profile(loaded)
        doc = {**doc, "explain": explanation_json(expl)}
    with text_off_stdout(timeline):  # `--timeline /dev/stdout`: the image alone on stdout
        if as_json:
            print_json(doc)
            return
        console = out_console()
        render_inspect(doc, console)
        if explain:
            _render_explain(doc["explain"], console, _replan(profile, doc["meta"]["command"]))
        if timeline is not None:
            console.print(f"timeline written to {safe(timeline)}")


def _replan(profile: Path, command: str | None) -> str:
    """The `ftc plan` line that re-plans `profile` with the options it records (its budget:
    without them the plan would be a latency-mode one)."""
    recorded = (
        command.removeprefix("ftc plan") if command and command.startswith("ftc plan ") else ""
    )
    return f"ftc plan {profile}{recorded} -o OUT"


def _render_explain(expl: dict, console: Any, replan: str) -> None:
    from rich.table import Table

    from flextensor_compile.cli.render import safe
    from flextensor_compile.units import format_bytes, format_ms

    left = expl["budget_left_bytes"]
    console.print(f"\nbudget left: {'no cap' if left is None else format_bytes(left)}")
    bound, makespan = expl["bound_ms"], expl["makespan_ms"]
    if bound and makespan < bound * (1 - 1e-6):  # no plan predicts less: the file was edited
        console.print(f"predicted makespan {format_ms(makespan)} ms is below the staging bound "
                      f"{format_ms(bound)} ms of the profile's own traps: its predictions do not "
                      f"match its traps (edited by hand?); re-plan it with `{safe(replan)}`")  # fmt: skip
    elif bound:
        console.print(f"predicted makespan {format_ms(makespan)} ms = {makespan / bound:.3f} x "
                      f"the staging bound {format_ms(bound)} ms (no plan within this budget "
                      "predicts less)")  # fmt: skip
    why = Table(title="why each tensor streams or stays", title_justify="left",
                header_style="bold")  # fmt: skip
    for col in ("tensor", "placement", "size", "window ms", "copy ms", "reason"):
        numeric = col in ("size", "window ms", "copy ms")
        # names fold (never cut to an ellipsis: the row would not say which tensor it is)
        why.add_column(col, justify="right" if numeric else "left", no_wrap=numeric,
                       overflow="fold", min_width=12 if col == "tensor" else None)  # fmt: skip
    for t in expl["tensors"]:
        why.add_row(safe(t["name"]), safe(t["placement"]), format_bytes(t["bytes"]),
                    f"{t['window_ms']:.3f}", f"{t['copy_ms']:.3f}", safe(t["reason"]))  # fmt: skip
    console.print(why)
    blocks = Table(title="block assignment (transfers in trap order: issued at -> released after)",
                   title_justify="left", header_style="bold")  # fmt: skip
    for col in ("block", "size", "transfers"):
        blocks.add_column(col, justify="right" if col != "transfers" else "left",
                          no_wrap=col != "transfers", overflow="fold")  # fmt: skip
    for b in expl["blocks"]:
        users = ", ".join(f"{safe(u['trap'])} {safe(u['name'])} ({format_bytes(u['bytes'])}"
                          f"{' @' + format_bytes(u['offset']) if u['offset'] else ''}, "
                          f"{u['issue_at']}->{u['release_after']})" for u in b["transfers"])  # fmt: skip
        blocks.add_row(str(b["block"]), format_bytes(b["bytes"]), users)
    console.print(blocks)


def _reject_json(path: Path) -> None:
    """A JSON file (a stats file given by mistake) is named as such, not as a damaged profile."""
    from flextensor_runtime.errors import ProfileFormatError

    if path.is_file():
        with open(path, "rb") as fh:
            if fh.read(256).lstrip()[:1] in (b"{", b"["):  # a profile starts with a msgpack map
                raise ProfileFormatError(
                    f"{path}: is a JSON text file (a stats file?), not a profile; inspect the "
                    "profile, or make one with `ftc plan STATS -o profile.msgpack`"
                )


def register(app: typer.Typer) -> None:
    app.command("inspect", cls=FtcCommand)(inspect)
