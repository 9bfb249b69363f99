"""One table from error types to the one-line message `ftc` prints, and the exit codes.

Owns: how failures look on the command line. Without `--debug` every error is one line on
stderr and exit code 1; with it, the traceback follows. Must not know: what the commands do.
"""

from __future__ import annotations

import sys
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flextensor_compile.units import printable
from flextensor_runtime import errors as e

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "Interrupted", "label_for", "run_guarded",
           "usage_line"]  # fmt: skip

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130

# Most specific first: the first matching type gives the label.
_LABELS: tuple[tuple[type[BaseException], str], ...] = (
    (e.ProfileVersionError, "profile version"),
    (e.ProfileMismatchError, "profile mismatch"),
    (e.ProfileFormatError, "invalid profile"),
    (e.BudgetError, "budget"),
    (e.StatsFormatError, "invalid stats"),
    (e.ModelFileError, "model file"),
    (e.ConfigError, "invalid option"),
    (e.BackendUnavailableError, "unavailable"),
    (e.FlextensorError, "error"),
    (OSError, "file error"),
    (MemoryError, "out of memory"),
)


class Interrupted(Exception):
    """Ctrl-C inside a command; `where` names the user's file and line it stopped in, if any."""

    def __init__(self, where: str = "") -> None:
        super().__init__(where)
        self.where = where

    @classmethod
    def from_traceback(cls, exc: BaseException) -> Interrupted:
        """The deepest frame outside Python, its packages and flextensor: the model file's."""
        library = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        library |= {str(Path(__file__).parents[2] / p) for p in ("flextensor_compile",
                                                                  "flextensor_runtime")}  # fmt: skip
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            name = frame.filename
            if name.startswith("<") or any(name.startswith(d) for d in library if d):
                continue
            return cls(f"{name} line {frame.lineno}")
        return cls()

    def line(self) -> str:
        at = f" at {self.where}" if self.where else ""
        return (f"ftc: interrupted{at}; no partial file was left (outputs are replaced whole "
                "or not at all); rerun the command for any output that is missing")  # fmt: skip


def usage_line(exc: Any) -> str:
    """A click usage error as one line that says which `--help` to read."""
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else "ftc"
    message = _unknown_option(exc, ctx) or exc.format_message()
    return f"ftc: usage: {_one_line(message).rstrip('.')}; see `{where} --help`"


def _unknown_option(exc: Any, ctx: Any) -> str | None:
    """An unknown option's message: close names of this command's options (not `--help`, which
    click offers for any name), and the other `ftc` commands that take it (None: not that
    error)."""
    if type(exc).__name__ != "NoSuchOption":  # click's, or the copy typer ships
        return None
    name = exc.option_name
    close = [p for p in sorted(exc.possibilities or ()) if p != "--help"]
    message = f"No such option: {name}" + (f" (did you mean {', '.join(close)}?)" if close else "")
    group = ctx.parent.command if ctx is not None and ctx.parent is not None else None
    commands = getattr(group, "commands", {})
    takes = [f"`ftc {cmd}`" for cmd, command in sorted(commands.items())
             if command is not ctx.command and any(
                 name in p.opts or name in p.secondary_opts for p in command.params)]  # fmt: skip
    return message + (f"; {name} is an option of {' and '.join(takes)}" if takes else "")


def label_for(exc: BaseException) -> str | None:
    """The label for an expected error type, or None for a bug."""
    for kind, label in _LABELS:
        if isinstance(exc, kind):
            return label
    return None


def _one_line(text: str) -> str:
    """Runs of spaces and newlines as one space (a message may span lines), every other control
    character as an escape (`\\t`, `\\r`, `\\x1b`): a path or name in a message never moves the
    cursor or recolours the terminal, and a tab in a file name is not shown as a space."""
    return printable(" ".join(text.replace("\t", "\\t").replace("\r", "\\r").split()))


def run_guarded(fn: Callable[[], object], debug: bool) -> int:
    """Run the CLI; turn any exception into one stderr line (plus traceback with --debug)."""
    try:
        fn()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        print(Interrupted().line(), file=sys.stderr)
        return EXIT_INTERRUPTED
    except Interrupted as exc:
        if debug:
            traceback.print_exc()
        print(exc.line(), file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as exc:
        if debug:
            traceback.print_exc()
        label = label_for(exc)
        if label is None:
            msg = f"ftc: internal error: {type(exc).__name__}: {_one_line(str(exc))}"
            msg += "" if debug else " (rerun with --debug for the traceback and report it)"
        else:
            msg = f"ftc: {label}: {_one_line(str(exc))}"
        print(msg, file=sys.stderr)
        return EXIT_ERROR
    return 0
