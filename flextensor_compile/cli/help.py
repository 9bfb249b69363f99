"""How `ftc ... --help` lists options: an on/off option shows no value placeholder.

Owns: `FLAG` (the metavar our on/off options declare) and the command and group classes every
`ftc` command is registered with, which give `--help` itself the same treatment (typer prints
`<bool>` after flags otherwise). Must not know: what the commands do.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup

__all__ = ["FLAG", "FtcCommand", "FtcGroup"]

FLAG = " "  # the metavar of an on/off option: --help shows no value placeholder after it


def _quiet(option: Any) -> Any:
    if option is not None:
        option.metavar = FLAG
    return option


class FtcCommand(TyperCommand):
    """A typer command whose `--help` option shows no `<bool>`."""

    def get_help_option(self, ctx: Any) -> Any:
        return _quiet(super().get_help_option(ctx))


class FtcGroup(TyperGroup):
    """The `ftc` group: its `--help` option shows no `<bool>` either."""

    def get_help_option(self, ctx: Any) -> Any:
        return _quiet(super().get_help_option(ctx))
