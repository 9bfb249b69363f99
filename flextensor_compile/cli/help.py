"""The click classes every `ftc` command and the `ftc` group are made with.

Owns: how `--help` lists options (an on/off option shows no value placeholder: `FLAG`, the
metavar our on/off options declare; typer prints `<bool>` after flags otherwise), and how the
click layer ends a run: a usage mistake is one `ftc: usage:` line (exit 2) instead of a box (an
option that takes one value given twice is one too), and Ctrl-C inside a command becomes
`Interrupted` (typer would swallow it into a silent exit 130).
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


def _option_names(params: Sequence[Any]) -> dict[str, Any]:
    """Every option string (`-o`, `--output`) -> its parameter."""
    return {opt: p for p in params if getattr(p, "opts", None) is not None
            for opt in (*p.opts, *getattr(p, "secondary_opts", ()))}  # fmt: skip


def _check_tokens(params: Sequence[Any], args: Sequence[str], ctx: Any) -> None:
    """Usage errors click would pass over in silence: an option that takes one value given twice
    (`--budget 1 --budget 2`: click keeps the last), and an option whose value is another
    option's name (`--budget --strategy greedy`, `-o --json`: click takes the name as the
    value, then reports the word after it as an extra argument, or writes a file `--json`)."""
    names = _option_names(params)
    first: dict[str, str] = {}
    for i, token in enumerate(args):
        after = args[i + 1] if i + 1 < len(args) else None
        if token == "--":
            break
        if token.startswith("--"):
            opt = token.split("=", 1)[0]
        else:  # `-ofile`: a short option with its value attached
            opt = token[:2] if token.startswith("-") and token[:2] in names else token
        param = names.get(opt)
        if param is None or getattr(param, "is_flag", False):
            continue  # a flag (or a value): nothing follows it
        if opt == token and after is not None and after.split("=", 1)[0] in names:
            raise _CLICK_ERRORS.UsageError(f"{opt} needs a value, got the option {after}", ctx)
        if getattr(param, "multiple", False) or getattr(param, "count", False):
            continue
        if param.name in first:
            said = f"{opt}" if opt == first[param.name] else f"{opt} (and {first[param.name]})"
            raise _CLICK_ERRORS.UsageError(f"{said} was given twice; pass it once", ctx)
        first[param.name] = opt


class FtcCommand(TyperCommand):
    """A typer command whose `--help` option shows no `<bool>`, whose Ctrl-C is reported, and
    where an option given twice is a usage error."""

    def get_help_option(self, ctx: Any) -> Any:
        return _quiet(super().get_help_option(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _check_tokens(self.get_params(ctx), args, ctx)
        return super().parse_args(ctx, args)

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
