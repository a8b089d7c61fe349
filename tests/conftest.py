"""Suite-wide fixtures: real throwaway servers and the ``--db`` switch.

Kept generic on purpose: fixtures for one app live in ``tests/<app>/conftest.py``.

A missing server binary skips the tests that need it on a developer machine, and fails them
when ``CI`` is set (``CI=true``), so CI can never go green by skipping the real-server tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from tests.servers import (
    MissingServerBinary,
    ServerStartError,
    start_memcached,
    start_postgres,
    start_redis,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--db",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="database for the Django test database: sqlite (default, in memory) or "
        "postgres (a throwaway cluster; `make test` runs `-m db_matrix --db=postgres`)",
    )


#: What a starter returns: a :class:`Server`, or a server of its own kind (a Redis cluster, a
#: restartable process of tests/reliability).
S = TypeVar("S")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def start_or_skip(starter: Callable[[], S]) -> S:
    """Start a server; skip (or, under CI, fail) when its binary is not installed."""
    try:
        return starter()
    except MissingServerBinary as exc:
        if in_ci():
            pytest.fail(f"CI=true and {exc}", pytrace=False)
        pytest.skip(str(exc))
    except ServerStartError as exc:
        # The binary is there but the server would not come up: always a real failure.
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def memcached_server() -> Iterator[str]:
    """A private memcached for the session, as ``"127.0.0.1:PORT"``."""
    server = start_or_skip(start_memcached)
    yield server.address
    server.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """A private Redis for the session, as ``"redis://127.0.0.1:PORT/0"``."""
    server = start_or_skip(start_redis)
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[dict[str, Any]]:
    """A private PostgreSQL cluster for the session, as a ``DATABASES`` entry.

    Use it as ``DATABASES["default"]`` or under any other alias; the database named by
    ``NAME`` exists, and Django creates ``TEST["NAME"]`` for its test database.
    """
    server = start_or_skip(start_postgres)
    dbname = server.extra["dbname"]
    yield {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": dbname,
        "USER": server.extra["user"],
        "PASSWORD": "",
        "HOST": server.host,
        "PORT": str(server.port),
        "TEST": {"NAME": f"test_{dbname}"},
    }
    server.stop()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(request: pytest.FixtureRequest) -> None:
    """With ``--db=postgres``, point the default database at ``postgres_server``.

    pytest-django calls this session fixture just before it creates the test databases
    (``django_db_setup``), so it is the documented place to change ``DATABASES``.
    """
    if request.config.getoption("--db") == "postgres":
        from django.conf import settings
        from django.db import connections

        settings.DATABASES["default"] = request.getfixturevalue("postgres_server")
        # Django caches the configured DATABASES and any connection already made to the
        # old (SQLite) default; drop both so the next access sees PostgreSQL.
        connections.__dict__.pop("settings", None)
        for conn in connections.all(initialized_only=True):
            conn.close()
            del connections[conn.alias]
    # What pytest-django's own fixture does (per-worker names under xdist and tox), done
    # after the swap so it applies to the PostgreSQL test database too.
    request.getfixturevalue("django_db_modify_db_settings_parallel_suffix")


@pytest.fixture(scope="session", autouse=True)
def _remember_refusals() -> Iterator[None]:
    """The refusal memory keeps only a flood's refusals (so that a project's few refusals
    and its ``cache.clear()`` reset its limits); this suite tests what the memory does, so it
    keeps every refusal, and its fixtures forget the refusals where they clear the counters.
    The peer's suite run by ``manage.py test`` (tests/peers/test_manage_py.py) runs
    without it."""
    from ratelimit_app.testing import remember_refusals

    with remember_refusals():
        yield


@pytest.fixture(scope="session", autouse=True)
def _forget_buffered_metrics() -> Iterator[None]:
    """Rules count their blocks as metrics in this process's buffer; most tests have no
    database to flush them to, and the process's final flush would say it lost them. No
    flusher thread or SIGTERM handler meanwhile: tests flush by hand."""
    from metrics_app import buffer
    from metrics_app.testing import manual_flush

    with manual_flush():
        yield
    buffer.reset()
