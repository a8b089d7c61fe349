"""A counter server that cannot be reached: the outage's log line and ``check --deploy`` name
its address (never a password), and a plain ``check`` never connects."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import RequestFactory, override_settings

from ratelimit_app.backends import reset_backends
from ratelimit_app.core import get_usage

MEMCACHED = "django.core.cache.backends.memcached.PyMemcacheCache"
REDIS = "django_redis.cache.RedisCache"
LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
W007 = "ratelimit_app.W007"


@pytest.fixture
def closed_port() -> int:
    """A loopback port that was free a moment ago and that nothing listens on: connections
    to it are refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def counting_on(cache: dict[str, Any]) -> Any:
    return override_settings(CACHES={"default": LOCMEM, "rl": cache}, RATELIMIT_USE_CACHE="rl")


@pytest.fixture(autouse=True)
def fresh_backends() -> Iterator[None]:
    reset_backends()
    yield
    reset_backends()


def deploy_messages(*ids: str) -> list[Any]:
    return [m for m in run_checks(include_deployment_checks=True) if m.id in ids]


@pytest.mark.parametrize(
    ("cache", "address", "secret"),
    [
        ({"BACKEND": MEMCACHED, "LOCATION": "127.0.0.1:{port}"}, "127.0.0.1:{port}", None),
        (
            {"BACKEND": REDIS, "LOCATION": "redis://:s3cret@127.0.0.1:{port}/0"},
            "127.0.0.1:{port}",
            "s3cret",
        ),
    ],
)
def test_the_outage_log_line_names_the_server(
    cache: dict[str, str],
    address: str,
    secret: str | None,
    closed_port: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = {**cache, "LOCATION": cache["LOCATION"].format(port=closed_port)}
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.1")
    with counting_on(cache), caplog.at_level(logging.WARNING, logger="ratelimit_app"):
        get_usage(request, group="g", key="ip", rate="3/m", increment=True)
    lines = [r.getMessage() for r in caplog.records]
    outage = [line for line in lines if line.startswith("ratelimit: counter backend 'rl'")]
    assert len(outage) == 1, lines
    assert f"({address.format(port=closed_port)}) failed:" in outage[0]
    if secret is not None:
        assert secret not in caplog.text


def test_the_deploy_check_names_a_closed_memcached_port(closed_port: int) -> None:
    with counting_on({"BACKEND": MEMCACHED, "LOCATION": f"127.0.0.1:{closed_port}"}):
        [warning] = deploy_messages(W007)
        assert f"Server 127.0.0.1:{closed_port} of cache 'rl': [Errno 111]" in warning.msg
        assert "memcached -d" in warning.hint and "LocMemCache" in warning.hint
        out = StringIO()
        # fail_level: the test settings' own deploy errors (a local-memory mailer) aside.
        call_command("check", deploy=True, fail_level="CRITICAL", stdout=out, stderr=out)
        assert f"{W007}) A counter server cannot be reached" in out.getvalue()
        # A plain check reads the settings and never connects.
        assert not [m for m in run_checks() if m.id == W007]
        out = StringIO()
        call_command("check", stdout=out, stderr=out)
        assert W007 not in out.getvalue()


def test_the_deploy_check_names_only_the_dead_server_of_several(
    memcached_server: str, closed_port: int
) -> None:
    dead = f"127.0.0.1:{closed_port}"
    with counting_on({"BACKEND": MEMCACHED, "LOCATION": [memcached_server, dead]}):
        [warning] = deploy_messages(W007)
    assert f"Server {dead} of cache 'rl' did not answer." in warning.msg
    assert memcached_server not in warning.msg


def test_the_deploy_check_hides_a_redis_password(closed_port: int) -> None:
    url = f"redis://:s3cret@127.0.0.1:{closed_port}/0"
    with counting_on({"BACKEND": REDIS, "LOCATION": url}):
        [warning] = deploy_messages(W007)
    assert f"127.0.0.1:{closed_port}" in warning.msg
    assert "s3cret" not in warning.msg + warning.hint


@pytest.mark.parametrize("kind", ["memcached", "redis", "locmem"])
def test_the_deploy_check_says_nothing_when_counting_works(
    kind: str, memcached_server: str, redis_server: str
) -> None:
    cache = {
        "memcached": {"BACKEND": MEMCACHED, "LOCATION": memcached_server},
        "redis": {"BACKEND": REDIS, "LOCATION": redis_server},
        "locmem": LOCMEM,
    }[kind]
    with counting_on(cache):
        assert deploy_messages(W007) == []


def test_the_deploy_check_reports_an_address_that_cannot_be_used() -> None:
    with counting_on({"BACKEND": REDIS, "LOCATION": "nonsense://x"}):
        [warning] = deploy_messages(W007)
    assert "Cache 'rl' has a server address that cannot be used: " in warning.msg
