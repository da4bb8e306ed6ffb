"""A progress display for long loops: a rich bar with throughput and ETA on a terminal, sparse log lines otherwise.

`with Progress(total, "train", unit="tok") as p: p.advance(rows, tokens=n, **fields)` — `tokens` drives the
tokens/s column; extra fields (loss, τ, ...) are shown beside it. Off a TTY (CI, nohup, pipes) it prints one
line at most every `log_every_seconds`, so log files stay readable.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, description: str, *, log_every_seconds: float = 30.0, enabled: bool = True):
        self.total, self.description = total, description
        self.done, self.tokens = 0, 0
        self.fields: dict[str, object] = {}
        self.log_every_seconds = log_every_seconds
        self.enabled = enabled
        self._tty = enabled and sys.stderr.isatty()
        self._bar = None
        self._start = self._last_log = time.perf_counter()

    def __enter__(self) -> "Progress":
        if self._tty:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                     TimeRemainingColumn(), TextColumn("{task.fields[extra]}"), transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total, rate="", extra="")
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
        elif self.enabled:
            self._log()

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(time.perf_counter() - self._start, 1e-9)

    def advance(self, n: int = 1, *, tokens: int = 0, **fields) -> None:
        self.done += n
        self.tokens += tokens
        self.fields.update(fields)
        if self._bar is not None:
            extra = " ".join(f"{k}={_fmt(v)}" for k, v in self.fields.items())
            self._bar.update(self._task, advance=n, rate=f"{self.tokens_per_second:,.0f} tok/s", extra=extra)
        elif self.enabled and time.perf_counter() - self._last_log >= self.log_every_seconds:
            self._log()

    def _log(self) -> None:
        self._last_log = now = time.perf_counter()
        elapsed = now - self._start
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        extra = " ".join(f"{k}={_fmt(v)}" for k, v in self.fields.items())
        print(f"[{self.description}] {self.done}/{self.total} {self.tokens_per_second:,.0f} tok/s "
              f"elapsed {elapsed:,.0f}s eta {eta:,.0f}s {extra}", file=sys.stderr, flush=True)


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
