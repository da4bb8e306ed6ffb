"""tests/ports.py: the one free-port helper never hands a port out twice, within a process or across processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ports
from tests.ports import free_port

REPO = Path(__file__).resolve().parent.parent

_CHILD = """
import sys, time
from tests.ports import free_port
ports = [free_port() for _ in range(int(sys.argv[1]))]
print(" ".join(map(str, ports)), flush=True)
if len(sys.argv) > 2:
    sys.stdin.readline()  # hold the ports (stay alive) until the parent says so
"""


def _child(env: dict, count: int, hold: bool = False) -> subprocess.Popen:
    argv = [sys.executable, "-c", _CHILD, str(count)] + (["hold"] if hold else [])
    return subprocess.Popen(argv, cwd=REPO, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _ports_of(child: subprocess.Popen) -> list[int]:
    """The ports a `_child` printed on its first line."""
    assert child.stdout is not None  # _child pipes its stdout
    return list(map(int, child.stdout.readline().split()))


@pytest.fixture
def registry_env(tmp_path, monkeypatch):
    """A private registry, so this test neither sees nor disturbs the ports the rest of the suite holds."""
    monkeypatch.setenv("DEEPSPEC_TEST_PORTS_DIR", str(tmp_path))
    return {**os.environ, "DEEPSPEC_TEST_PORTS_DIR": str(tmp_path)}


def test_free_port_never_repeats_and_is_bindable():
    ports_ = [free_port() for _ in range(200)]
    assert len(set(ports_)) == len(ports_)
    low, high = ports.port_range()
    assert all(low <= p < high for p in ports_)  # below the ephemeral range: no outgoing connection gets one
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports_[-1]))  # nothing listens there


def test_processes_never_share_a_port(registry_env):
    # four concurrent processes, two of them posing as the *same* xdist worker (same slice of the range): only the
    # shared registry keeps them apart
    children = [
        _child({**registry_env, "PYTEST_XDIST_WORKER": worker}, 150, hold=True)
        for worker in ("gw0", "gw1", "gw0", "gw1")
    ]
    try:
        handed = [_ports_of(c) for c in children]
    finally:
        for c in children:
            c.communicate("\n", timeout=30)
    flat = [p for h in handed for p in h]
    assert all(len(h) == 150 for h in handed)
    assert len(set(flat)) == len(flat)


def test_a_live_holder_blocks_its_ports_and_a_dead_one_frees_them(registry_env, monkeypatch):
    holder = _child(registry_env, 5, hold=True)
    held = set(_ports_of(holder))
    registry = Path(registry_env["DEEPSPEC_TEST_PORTS_DIR"]) / "ports.json"
    assert {int(p) for p in json.loads(registry.read_text())} == held
    # force this process to scan exactly where the holder's ports are: it must skip every one of them
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports.random, "randrange", lambda n: 0)
    low = min(held)
    monkeypatch.setattr(ports, "port_range", lambda: (low, low + 4096))
    monkeypatch.setattr(ports, "_worker_index", lambda: 0)
    mine = {free_port() for _ in range(20)}
    assert not mine & held
    holder.communicate("\n", timeout=30)  # the holder exits: its ports go back to the pool
    monkeypatch.setattr(ports, "_handed_out", set())
    with ports._registry() as live:
        assert not set(live) & held
        assert set(live) == mine  # this (live) process's ports stay held
