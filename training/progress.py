"""A progress display for long loops: a rich bar with throughput and ETA on a terminal, sparse log lines otherwise.

`with Progress(total, "train") as p: p.resume_from(k); p.advance(rows, tokens=n, **fields)` — `tokens` drives
the tokens/s column; extra fields (loss, τ, ...) are shown beside it. Off a TTY (CI, nohup, pipes) it prints one
line at most every `log_every_seconds`, so log files stay readable. Work finished by an earlier run
(`resume_from`) moves the bar but not the ETA: a resumed job must not promise the remaining rows at the speed of
skipping the finished ones.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, description: str, *, log_every_seconds: float = 30.0, enabled: bool = True):
        self.total, self.description = total, description
        self.done, self.tokens = 0, 0
        self.resumed = 0
        self.fields: dict[str, object] = {}
        self.log_every_seconds = log_every_seconds
        self.enabled = enabled
        self._tty = enabled and sys.stderr.isatty()
        self._bar = None
        self._start = self._last_log = time.perf_counter()

    def __enter__(self) -> Progress:
        if self._tty:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[extra]}"),
                transient=False,
            )
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

    def resume_from(self, done: int) -> None:
        """Count `done` units as finished before this run started, and restart the clock."""
        self.done = self.resumed = done
        self._start = self._last_log = time.perf_counter()
        if self._bar is not None:
            self._bar.reset(self._task, completed=done)

    @property
    def eta_seconds(self) -> float:
        """Remaining units at this run's own pace (nan until it has finished one)."""
        elapsed, run_done = time.perf_counter() - self._start, self.done - self.resumed
        return elapsed / run_done * (self.total - self.done) if run_done > 0 else float("nan")

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
        eta = self.eta_seconds
        extra = " ".join(f"{k}={_fmt(v)}" for k, v in self.fields.items())
        print(
            f"[{self.description}] {self.done}/{self.total} {self.tokens_per_second:,.0f} tok/s "
            f"elapsed {elapsed:,.0f}s eta {eta:,.0f}s {extra}",
            file=sys.stderr,
            flush=True,
        )


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
