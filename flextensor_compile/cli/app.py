"""The `ftc` typer application: global options and command registration.

Owns: the command tree and the entry point. Commands live in `<name>_cmd.py` modules, each with a
`register(app)` function; heavy imports (torch, the compiler) happen inside commands so
`ftc --help` is instant and imports no torch. Must not know: what commands compute.
"""

from __future__ import annotations

import signal
import sys

import typer

from flextensor_compile import __version__
from flextensor_compile.cli import inspect_cmd, plan_cmd, profile_cmd, sweep_cmd
from flextensor_compile.cli.errors import run_guarded
from flextensor_compile.cli.help import FLAG, FtcGroup

__all__ = ["app", "main"]

app = typer.Typer(
    cls=FtcGroup,
    name="ftc",
    help="flextensor offload profile compiler: plan weight offloading ahead of time.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

# Each command module adds its commands here.
for _module in (inspect_cmd, profile_cmd, plan_cmd, sweep_cmd):
    _module.register(app)


def _version(value: bool) -> None:
    if value:
        print(f"ftc {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(
        False, "--debug", metavar=FLAG, help="Show the traceback when a command fails."
    ),
    version: bool = typer.Option(
        False,
        "--version",
        metavar=FLAG,
        callback=_version,
        is_eager=True,
        help="Print the version and exit.",
    ),
) -> None:
    """flextensor offload profile compiler."""


def _split_debug(argv: list[str]) -> tuple[list[str], bool]:
    """`--debug` is accepted anywhere on the line (`ftc inspect p.msgpack --debug` too)."""
    return [a for a in argv if a != "--debug"], "--debug" in argv


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (`timeout`, a job scheduler) ends a run like Ctrl-C


def main() -> None:
    """Console entry point: run the app and map errors to one line and an exit code.

    SIGTERM is handled like Ctrl-C, so temp files are removed and the message is one line."""
    args, debug = _split_debug(sys.argv[1:])
    signal.signal(signal.SIGTERM, _terminate)
    code = run_guarded(lambda: app(args, prog_name="ftc"), debug)
    _leave_model_threads(code)
    sys.exit(code)


def _leave_model_threads(code: int) -> None:
    """A model file may start a thread that never ends (not a daemon): Python would wait for it
    at exit for ever after the outputs are written. Say so, and exit without waiting."""
    import os
    import threading

    left = [t.name for t in threading.enumerate()
            if t is not threading.main_thread() and not t.daemon and t.is_alive()]  # fmt: skip
    if not left:
        return
    from flextensor_compile.units import count_of, printable

    print(f"ftc: note: not waiting for {count_of(len(left), 'thread')} the model file started and left "
          f"running ({printable(', '.join(left[:3]))}); exiting", file=sys.stderr)  # fmt: skip
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
