"""A rich progress bar on stderr for the long steps (dequantizing, converting, hashing); silent when stderr is not a
terminal, so logs of the chart's init container stay one line per export."""

from __future__ import annotations

import contextlib

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as _RichProgress


class Progress:
    """`with progress.task("converting", total=n) as advance: ... advance(1)`."""

    def __init__(self, enabled: bool | None = None):
        console = Console(stderr=True)
        self.enabled = console.is_terminal if enabled is None else enabled
        self._bar = _RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not self.enabled,
            transient=False,
        )

    def __enter__(self) -> Progress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    @contextlib.contextmanager
    def task(self, description: str, total: int):
        task_id = self._bar.add_task(description, total=total)
        yield lambda n=1: self._bar.advance(task_id, n)
        self._bar.update(task_id, completed=total)


def quiet() -> Progress:
    """For library callers and tests: no output at all."""
    return Progress(enabled=False)
