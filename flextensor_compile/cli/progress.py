"""Progress bars for long commands: one rich bar per phase on stderr, with elapsed time and ETA.

Owns: `PhaseBars`, a progress sink (`start(phase, total)`, `advance(phase)`) that draws nothing
when quiet or when stderr is not a terminal, so scripts and `--json` output stay clean.
Must not know: what the phases do.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PhaseBars"]


class PhaseBars:
    """A ProgressSink drawing one rich bar per phase on stderr (nothing when quiet)."""

    def __init__(self, quiet: bool) -> None:
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        from flextensor_compile.cli.render import err_console

        self.console = err_console()
        self.tasks: dict[str, Any] = {}
        self.progress = Progress(
            TextColumn("{task.description:<18}"), BarColumn(), TaskProgressColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=self.console, disable=quiet or not self.console.is_terminal, transient=True,
        )  # fmt: skip

    def __enter__(self) -> PhaseBars:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)  # type: ignore[arg-type]

    def start(self, phase: str, total: int) -> None:
        self.tasks[phase] = self.progress.add_task(phase, total=total)

    def advance(self, phase: str) -> None:
        self.progress.advance(self.tasks[phase])
