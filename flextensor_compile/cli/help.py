"""The click classes every `ftc` command and the `ftc` group are made with.

Owns: how `--help` lists options (an on/off option shows no value placeholder: `FLAG`, the
metavar our on/off options declare; typer prints `<bool>` after flags otherwise), and how the
click layer ends a run: a usage mistake is one `ftc: usage:` line (exit 2) instead of a box, and
Ctrl-C inside a command becomes `Interrupted` (typer would swallow it into a silent exit 130).
Must not know: what the commands do.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from flextensor_compile.cli.errors import Interrupted, usage_line

__all__ = ["FLAG", "FtcCommand", "FtcGroup"]

FLAG = " "  # the metavar of an on/off option: --help shows no value placeholder after it

# The click typer runs on (its own copy in recent typer, `click` before): its exception types.
_CLICK_ERRORS = importlib.import_module(typer.BadParameter.__module__)
_NO_ARGS = getattr(_CLICK_ERRORS, "NoArgsIsHelpError", ())
_ABORTS = tuple(getattr(_CLICK_ERRORS, n) for n in ("Abort",) if hasattr(_CLICK_ERRORS, n))


def _quiet(option: Any) -> Any:
    if option is not None:
        option.metavar = FLAG
    return option


class FtcCommand(TyperCommand):
    """A typer command whose `--help` option shows no `<bool>` and whose Ctrl-C is reported."""

    def get_help_option(self, ctx: Any) -> Any:
        return _quiet(super().get_help_option(ctx))

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise Interrupted.from_traceback(exc) from None


class FtcGroup(TyperGroup):
    """The `ftc` group: its `--help` shows no `<bool>` either, and usage errors are one line."""

    def get_help_option(self, ctx: Any) -> Any:
        return _quiet(super().get_help_option(ctx))

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except _NO_ARGS:
            sys.exit(2)  # typer has printed the help already
        except _CLICK_ERRORS.ClickException as exc:
            print(usage_line(exc), file=sys.stderr)
            sys.exit(exc.exit_code)
        except (typer.Abort, *_ABORTS):
            print("ftc: aborted", file=sys.stderr)
            sys.exit(1)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv
