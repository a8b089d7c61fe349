"""Fixtures of the reliability tests: servers of their own, which tests kill and restart."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import start_or_skip
from tests.reliability import procs


@pytest.fixture
def own_memcached() -> Iterator[procs.Restartable]:
    server = start_or_skip(procs.memcached)  # type: ignore[arg-type]
    yield server
    server.stop()


@pytest.fixture
def own_redis() -> Iterator[procs.Restartable]:
    server = start_or_skip(procs.redis)  # type: ignore[arg-type]
    yield server
    server.stop()


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[procs.Postgres]:
    server = start_or_skip(procs.Postgres)  # type: ignore[arg-type]
    yield server
    server.stop()
