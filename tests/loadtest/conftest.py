"""Fixtures shared by the loadtest tests; the servers themselves live in `servers.py`."""

import pytest

from .servers import threaded_fake_server


@pytest.fixture
def fake_server_thread():
    """Factory fixture: `with fake_server_thread(FakeServerConfig(...)) as srv:`."""
    return threaded_fake_server
