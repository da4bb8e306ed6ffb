"""SIGTERM / SIGINT as an asyncio event, for every long-running process of the service (worker, gateway, embedded).

Its own module so that the command line (`service.cli`) and what it starts (`service.gateway.app`,
`service.embedded`) all import it without importing each other: the command line sits on top, nothing imports it.
"""

from __future__ import annotations

import asyncio
import signal


def install_stop_signals() -> asyncio.Event:
    """SIGTERM / SIGINT set the returned event (a second SIGINT exits at once)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(sig):
        if stop.is_set() and sig == signal.SIGINT:
            raise SystemExit(130)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    return stop
