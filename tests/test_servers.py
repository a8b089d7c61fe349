"""The server fixtures start real servers that answer, and missing binaries are loud in CI."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from django.db import connection
from django.db.utils import ConnectionHandler

from tests import servers
from tests.conftest import start_or_skip
from tests.servers import debian


def _ask(address: str, request: bytes, until: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(request)
        reply = b""
        while until not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply


def test_memcached_server_answers_version(memcached_server: str) -> None:
    assert memcached_server.startswith("127.0.0.1:")
    reply = _ask(memcached_server, b"version\r\n", b"\r\n")
    assert reply.startswith(b"VERSION ")


def test_redis_server_answers_ping(redis_server: str) -> None:
    assert redis_server.startswith("redis://127.0.0.1:")
    assert redis_server.endswith("/0")
    address = redis_server.removeprefix("redis://").removesuffix("/0")
    assert _ask(address, b"PING\r\n", b"\r\n") == b"+PONG\r\n"


def test_postgres_server_takes_a_django_connection(
    postgres_server: dict[str, Any], django_db_blocker: Any
) -> None:
    # A connection of its own, apart from the test database, so this runs in the SQLite pass.
    handler = ConnectionHandler({"default": dict(postgres_server)})
    with django_db_blocker.unblock():
        conn = handler["default"]
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT current_database(), 6 * 7")
                assert cursor.fetchone() == (postgres_server["NAME"], 42)
        finally:
            conn.close()


@pytest.mark.db_matrix
@pytest.mark.django_db
def test_default_database_follows_db_option(request: pytest.FixtureRequest) -> None:
    from django.contrib.auth.models import User

    expected = {"sqlite": "sqlite", "postgres": "postgresql"}[request.config.getoption("--db")]
    assert connection.vendor == expected
    User.objects.create_user("matrix", password="x")
    assert User.objects.filter(username="matrix").count() == 1


@pytest.mark.parametrize("fixture", ["memcached_server", "redis_server", "postgres_server"])
def test_servers_listen_on_127_0_0_1_only(fixture: str, request: pytest.FixtureRequest) -> None:
    """A throwaway server has no password (PostgreSQL trusts every login), so no other host may
    reach it: it listens on 127.0.0.1 alone. 127.0.0.2 is loopback too, on every Linux
    machine, and stands in for any other address of this one: a server bound to all
    interfaces would accept there."""
    server = request.getfixturevalue(fixture)
    if isinstance(server, dict):  # postgres_server is a DATABASES entry
        port = int(server["PORT"])
    else:
        port = int(server.removeprefix("redis://").removesuffix("/0").rsplit(":", 1)[1])
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=5).close()


def test_server_stop_is_idempotent_and_frees_the_port() -> None:
    server = start_or_skip(servers.start_redis)
    server.stop()
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((server.host, server.port), timeout=1).close()


@pytest.mark.parametrize(
    ("starter", "package"),
    [
        (servers.start_memcached, "memcached"),
        (servers.start_redis, "redis-server"),
        (servers.start_postgres, "postgresql"),
    ],
)
def test_missing_binary_names_the_debian_package(
    monkeypatch: pytest.MonkeyPatch, starter: Any, package: str
) -> None:
    monkeypatch.setattr(debian, "find_binary", lambda name: None)
    with pytest.raises(servers.MissingServerBinary, match=f"'{package}'"):
        starter()


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", None)])
def test_missing_binary_fails_under_ci_and_skips_otherwise(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException] | None
) -> None:
    monkeypatch.setattr(debian, "find_binary", lambda name: None)
    monkeypatch.setenv("CI", ci)
    expected = outcome or pytest.skip.Exception
    with pytest.raises(expected, match="memcached"):
        start_or_skip(servers.start_memcached)


def test_missing_packages_are_listed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(debian, "find_binary", lambda name: None)
    assert servers.missing_packages() == [
        "memcached",
        "redis-server",
        "postgresql",
        "chromium",
        "wrk",
        "valgrind",
        "prometheus",
    ]
