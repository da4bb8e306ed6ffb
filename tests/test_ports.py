"""tests/ports.py: the one free-port helper never hands a port out twice."""

from __future__ import annotations

import socket

from tests.ports import free_port


def test_free_port_never_repeats_and_is_bindable():
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # nothing listens there
