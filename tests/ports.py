"""Free TCP ports for tests that start servers: one helper for the whole suite.

The kernel hands out an ephemeral port on `bind(0)` and may hand the same one out again as soon as the probe socket
closes, so two back-to-back calls can return the same port (a gateway given it for both HTTP and gRPC then cannot
start). The suite also runs in several processes at once (pytest-xdist workers, or two checkouts on one machine),
each of which would keep its own memory of what it handed out. So `free_port`:

- picks from the ports *below* the kernel's ephemeral range, where no outgoing connection is given a port behind
  our back between the probe and the server's bind; each xdist worker starts in its own slice of that range;
- records every port it returns in one registry shared by all processes on the machine (a JSON file under a
  `flock`), and never returns a port that a live process holds there; a dead process's ports are reclaimed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

#: ports below this are left alone (well-known services, and Prometheus-style 9xxx defaults)
LOW_PORT = 10000
#: the range used when the kernel's ephemeral range leaves too little room below it
_FALLBACK_RANGE = (LOW_PORT, 32768)
#: how many xdist workers' slices the range is cut into (a worker beyond this shares a slice: still safe)
_SLICES = 16

_handed_out: set[int] = set()


def registry_dir() -> Path:
    """Where the shared registry lives; DEEPSPEC_TEST_PORTS_DIR overrides (tests of this module use their own)."""
    return Path(os.environ.get("DEEPSPEC_TEST_PORTS_DIR") or Path(tempfile.gettempdir()) / "deepspec-test-ports")


def port_range() -> tuple[int, int]:
    """[low, high): the ports under the kernel's ephemeral range (Linux), or a fixed range elsewhere."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_RANGE
    return (LOW_PORT, ephemeral_low) if ephemeral_low - LOW_PORT >= 4096 else _FALLBACK_RANGE


def _worker_index() -> int:
    """0 for a plain pytest run, N for xdist worker gwN."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


@contextmanager
def _registry():
    """The {port: pid} registry, locked for the block; entries of dead processes are dropped on the way in."""
    folder = registry_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "ports.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            path = folder / "ports.json"
            try:
                held = {int(port): int(pid) for port, pid in json.loads(path.read_text()).items()}
            except (OSError, ValueError):
                held = {}
            held = {port: pid for port, pid in held.items() if _alive(pid)}
            yield held
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({str(port): pid for port, pid in held.items()}))
            tmp.replace(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _bindable(port: int) -> bool:
    """Nothing listens on the port, on any IPv4 address (a wildcard probe also clashes with 127.0.0.1 binds)."""
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port() -> int:
    """A port nothing listens on now and that no live process (this one included) was handed before."""
    low, high = port_range()
    width = (high - low) // _SLICES
    start = low + (_worker_index() % _SLICES) * width + random.randrange(width)
    with _registry() as held:
        for offset in range(high - low):
            port = low + (start - low + offset) % (high - low)
            if port in _handed_out or port in held or not _bindable(port):
                continue
            _handed_out.add(port)
            held[port] = os.getpid()
            return port
    raise RuntimeError(f"free_port: no free TCP port left in [{low}, {high})")
