"""Fixtures for the peers' tests."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture(scope="session")
def closed_port() -> int:
    """A loopback port that was free a moment ago and that nothing listens on (bound to port
    0, then closed): connections to it are refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
