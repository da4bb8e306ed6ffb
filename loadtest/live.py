"""The live progress line of `python -m loadtest`: phase, done/total, failures, in flight, req/s, tok/s, ETA.

It reads the runner's `Progress` counters on rich's refresh thread, 4 times a second, so the request path only
increments integers. Rendered on stderr, and only when stderr is a terminal (the CLI decides), so piped output
and CI logs stay clean.
"""

from __future__ import annotations

import time

from loadtest.runner import Progress


class LiveDisplay:
    """A one-line rich Live view of `Progress`, refreshed 4 times a second on rich's own thread."""

    def __init__(self, progress: Progress, enabled: bool) -> None:
        self.progress, self.enabled, self.title = progress, enabled, ""
        self._live = None

    def __rich__(self):
        from rich.text import Text

        p = self.progress
        elapsed = time.perf_counter() - p.start_time if p.start_time else 0.0
        rate = p.completed / elapsed if elapsed > 0 else 0.0
        tok = p.output_tokens / elapsed if elapsed > 0 else 0.0
        done = p.completed + p.failed
        total = f"/{p.total}" if p.total else ""
        eta = ""
        if p.total and rate > 0:
            eta = f" ETA {max(0.0, (p.total - done) / max(rate, 1e-9)):.0f}s"
        elif p.duration_s:
            eta = f" ETA {max(0.0, p.duration_s - elapsed):.0f}s"
        return Text.assemble(
            (f"{self.title} ", "bold"),
            (f"{p.phase} ", "cyan"),
            f"{done}{total} done, ",
            (f"{p.failed} failed", "red" if p.failed else ""),
            f", {p.in_flight} in flight | {rate:.1f} req/s, {tok:,.0f} tok/s | {elapsed:.1f}s{eta}",
        )

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self, console=Console(stderr=True), refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc):
        if self._live is not None:
            self._live.__exit__(*exc)
