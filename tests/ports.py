"""Free TCP ports for tests that start servers: one helper for the whole suite.

The kernel hands out an ephemeral port on `bind(0)` and may hand the same one out again as soon as the probe socket
closes, so two back-to-back calls can return the same port (a gateway given it for both HTTP and gRPC then cannot
start). `free_port` remembers what it returned in this test process and never returns a port twice.
"""

from __future__ import annotations

import socket

_handed_out: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now and that no earlier call in this process returned."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
