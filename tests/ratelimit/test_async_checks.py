"""The async path: an async check awaits its round trips on the event loop.

Async views, the middleware's ``__acall__`` and :func:`~ratelimit_app.core.aget_usage` run
the engine's checks through :func:`~ratelimit_app.engine.trips.arun`: each round trip is
awaited on the pooled connections of the sync path (:mod:`ratelimit_app.backends.aio`).
The counters here answer through :mod:`tests.reliability.delay_proxy`, late by
:data:`DELAY`, as a server across a network does: checks awaited together then wait for
the server together (a blocking check would hold the loop for each round trip in turn,
and the proxy would never hold two answers at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import Client, RequestFactory, override_settings

from ratelimit_app.backends import base, get_backend, reset_backends
from ratelimit_app.core import aget_usage, ais_ratelimited, get_usage, is_ratelimited
from ratelimit_app.testing import frozen_clock
from tests.reliability.delay_proxy import DelayProxy, delayed

#: Seconds each answer of the counter server comes late.
DELAY = 0.05
T0 = 1_700_000_000.0
LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}

rf = RequestFactory()


@pytest.fixture(params=["memcached", "redis"])
def slow_counters(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[DelayProxy]:
    """The counters on a real memcached or Redis whose answers come :data:`DELAY` late
    (and a socket timeout of 2 s: a busy machine's stall is no outage here)."""
    monkeypatch.setattr(base, "SOCKET_TIMEOUT", 2.0)
    if request.param == "memcached":
        host, port = request.getfixturevalue("memcached_server").rsplit(":", 1)
    else:
        url = urlsplit(request.getfixturevalue("redis_server"))
        host, port = str(url.hostname), str(url.port)
    with delayed(host, int(port), DELAY) as proxy:
        there = "{}:{}".format(*proxy.address)
        if request.param == "memcached":
            config = {
                "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
                "LOCATION": there,
            }
        else:
            config = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"redis://{there}/0"}
        with override_settings(CACHES={"default": LOCMEM, "rl": config}, RATELIMIT_USE_CACHE="rl"):
            reset_backends()
            try:
                yield proxy
            finally:
                reset_backends()  # (its connections closed before the proxy stops)


def idle_connections() -> int:
    """The connections the backend in force keeps idle (memcached: its one node's)."""
    backend: Any = get_backend()
    if hasattr(backend, "nodes"):
        return len(backend.nodes[0].client.client_pool.idle)
    return len(backend._idle.idle)


async def counted(ip: str, group: str) -> dict[str, Any] | None:
    request = rf.get("/", REMOTE_ADDR=ip)
    return await aget_usage(request, group=group, key="ip", rate="5/m", increment=True)


async def test_checks_awaited_together_wait_for_the_server_together(
    slow_counters: DelayProxy, group: str
) -> None:
    usages = await asyncio.gather(*(counted(f"192.0.2.{i}", group) for i in range(8)))
    assert [u["count"] for u in usages if u] == [1] * 8
    # Their round trips overlapped: the server's late answers were held back together.
    assert slow_counters.most_held >= 4
    assert idle_connections() == 8  # (each took a connection of the pool, and gave it back)


async def test_a_cancelled_check_gives_no_connection_back(
    slow_counters: DelayProxy, group: str
) -> None:
    for _ in range(3):
        await counted("192.0.2.1", group)
    idle = idle_connections()
    waiting = asyncio.ensure_future(counted("192.0.2.1", group))
    await asyncio.sleep(DELAY / 3)  # sent; its answer is held back
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert idle_connections() == idle - 1  # closed, not kept
    await asyncio.sleep(DELAY * 2)  # the late answer (a count of 4) reaches a closed socket
    usage = await counted("192.0.2.2", group)  # a subject never counted
    assert usage is not None and usage["count"] == 1


@pytest.mark.usefixtures("backend_kind")
@pytest.mark.urls("tests.ratelimit.urls")
def test_async_views_under_wsgi_share_the_pooled_connections(client: Client) -> None:
    """Under WSGI, Django runs an async view on an event loop of its own per request: the
    check's connection comes from the process's pool and goes back to it (no connection
    per request, nothing left open by a loop that ended)."""
    with override_settings(MIDDLEWARE=[]):  # (a setting changed: a new backend, no connection)
        codes = [client.get("/async/").status_code for _ in range(4)]
        assert codes == [200, 200, 403, 403]
        if not get_backend().inline_ok:  # (local memory: no connection)
            assert idle_connections() == 1


@pytest.mark.usefixtures("backend_kind")
async def test_aget_usage_answers_as_get_usage(group: str) -> None:
    """The same counts, dict and refusal on both paths (each its own subject), for a key
    read on the loop and for a callable one, which runs in a thread."""
    for key in ("ip", lambda group, request: request.META["REMOTE_ADDR"]):
        with frozen_clock(T0):
            for n in range(4):
                args = {"group": group, "key": key, "rate": "3/m", "increment": True}
                sync = get_usage(rf.get("/", REMOTE_ADDR=f"192.0.2.{n + 10}"), **args)
                got = await aget_usage(rf.get("/", REMOTE_ADDR=f"192.0.2.{n + 20}"), **args)
                assert got == sync
            limited = {"group": group, "key": key, "rate": "0/m"}
            assert is_ratelimited(rf.get("/", REMOTE_ADDR="192.0.2.99"), **limited)
            assert await ais_ratelimited(rf.get("/", REMOTE_ADDR="192.0.2.98"), **limited)
    assert await aget_usage(rf.get("/"), group=group, key="ip") is None  # no rate


def test_lists_that_name_users_keep_the_rules_check_off_the_loop() -> None:
    """The rules' lists are screened first: one that names a user reads ``request.user``
    (the database), so the check runs in a thread; the middleware passes the snapshot it
    matched the rules in, and nothing is looked up again."""
    import dataclasses

    from ratelimit_app import store
    from ratelimit_app.config.access import AccessList
    from ratelimit_app.config.rules import parse_rule
    from ratelimit_app.engine.matched import on_the_loop

    limits = [parse_rule({"name": "r", "path": "/", "key": "ip", "rate": "5/m"}).limit]
    with override_settings(RATELIMIT_RULES=[]):
        current = store.current()
        assert on_the_loop(limits, screened=current)
        named = AccessList(users=frozenset({"7"}))
        for lists in ({"allow": named}, {"deny": named}):
            assert not on_the_loop(limits, screened=dataclasses.replace(current, **lists))
        # Unscreened (a decorator's limit): the lists are not its concern.
        assert on_the_loop(limits)
    user_keyed = parse_rule({"name": "u", "path": "/", "key": "user", "rate": "5/m"}).limit
    assert not on_the_loop([user_keyed])
