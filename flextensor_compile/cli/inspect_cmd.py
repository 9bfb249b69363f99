"""`ftc inspect PROFILE`: what a profile plans and what it predicts.

Owns: the inspect command's options. Must not know: the wire format (it uses the profile package)
or how documents are drawn (render).
"""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["register"]


def inspect(
    profile: Path = typer.Argument(..., help="An offload profile (.msgpack) written by ftc."),
    as_json: bool = typer.Option(False, "--json", help="Print the stable JSON document."),
) -> None:
    """Show a profile: model, device, budget, resident/streamed bytes, blocks, predictions, traps."""
    from flextensor_compile.cli.render import out_console, print_json, render_inspect
    from flextensor_compile.inspect_doc import inspect_document
    from flextensor_runtime.profile import load

    doc = inspect_document(load(profile))
    if as_json:
        print_json(doc)
    else:
        render_inspect(doc, out_console())


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect)
