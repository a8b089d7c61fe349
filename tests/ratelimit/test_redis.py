"""The Redis backend on a real server: what the shared contract (test_backends) cannot see.

How it is built (``cls(alias, cache)``), what a check asks of the server (only the fields it
reads; hashes that stay small), and the connections it keeps (a bounded pool per process,
shared by its threads).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import threading
import time
import warnings
from collections.abc import Iterator
from importlib import resources
from typing import Any
from unittest import mock

import pytest
from django.core.cache import caches
from django.test import override_settings

from ratelimit_app.algorithms import gcra, windows
from ratelimit_app.algorithms.rates import parse
from ratelimit_app.backends import base, build, get_backend, reset_backends
from ratelimit_app.backends.base import Op
from ratelimit_app.backends.redis import RedisBackend, RedisClusterBackend
from ratelimit_app.exceptions import BackendError
from ratelimit_app.identity.keys import namespace

T0 = 1_800_000_000.5
#: ``RATELIMIT_CACHE_PREFIX`` in this module (not the default), and django-redis's own
#: prefix (``KEY_PREFIX`` "" and ``VERSION`` 1): keys looked up on the server are built from
#: these literals, so a prefix the backend ignored fails here.
PREFIX = "rl-redis:"
CACHE_PREFIX = ":1:"


@pytest.fixture(autouse=True)
def custom_prefix(module_prefix: None) -> None:
    """This module's counters under :data:`PREFIX`."""


@pytest.fixture
def redis_cache(redis_server: str) -> Iterator[str]:
    """Alias "rl" on the session's Redis, with a socket timeout of its own."""
    config = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": redis_server,
        "OPTIONS": {"SOCKET_TIMEOUT": 0.7},
    }
    with override_settings(
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "rl": config,
        },
        RATELIMIT_USE_CACHE="rl",
    ):
        reset_backends()
        yield redis_server
        reset_backends()


def server(backend: Any) -> Any:
    """A redis-py client of the backend's server, for looking at what a check left."""
    return caches["rl"].client.get_client()  # type: ignore[attr-defined]


def test_built_from_alias_and_cache(redis_cache: str, group: str) -> None:
    # The contract of every backend: cls(alias, cache); LOCATION and OPTIONS are read from
    # CACHES (the Redis backends took location and options as arguments before).
    for cls in (RedisBackend, RedisClusterBackend):
        assert list(inspect.signature(cls).parameters) == ["alias", "cache"]
    backend = build(RedisBackend, "rl")
    assert backend.url == redis_cache
    assert backend.options["SOCKET_TIMEOUT"] == 0.7
    plan = windows.plan(parse("5/m"), T0)
    assert sum(backend.run(namespace(group, "ip", "192.0.2.1"), plan, True)) >= 1
    assert isinstance(backend, RedisBackend)
    backend.close()
    cluster = RedisClusterBackend("rl", caches["rl"])  # its parent's constructor; no I/O yet
    assert (cluster.url, cluster.connected) == (redis_cache, False)
    assert cluster.timeouts["socket_timeout"] == 0.7


def test_no_server_in_location(redis_server: str) -> None:
    config = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": []}
    with (
        override_settings(CACHES={"default": config, "rl": config}),
        pytest.raises(BackendError, match="no Redis server"),
    ):
        RedisBackend("rl", caches["rl"])


def test_a_check_reads_only_the_fields_it_needs(redis_cache: str, group: str) -> None:
    backend = get_backend()
    rates = parse("1000/m;1000/h;1000/d")
    ns = namespace(group, "ip", "192.0.2.2")
    for t in range(0, 86400, 600):  # busy all day: every hash holds many fields
        backend.run(ns, windows.plan(rates, T0 - 86400 + t), True)
    plan = windows.plan(rates, T0)
    backend.run(ns, plan, True)  # creates the current buckets (and may trim)
    client = server(backend)
    client.config_resetstat()
    values = backend.run(ns, plan, True)
    stats = client.info("commandstats")
    # HMGET of the fields read, never the whole hash (HGETALL read up to ~190 fields a
    # window to use at most 13).
    assert "cmdstat_hgetall" not in stats and "cmdstat_hkeys" not in stats
    # One HMGET a window: its fine and coarse buckets are the fields of one hash.
    assert stats["cmdstat_hmget"]["calls"] == len({r.seconds for r in rates}) == 3
    assert sum(values) > 0


def test_hashes_stay_small_for_a_busy_subject(redis_cache: str, group: str) -> None:
    # Stale fields are dropped when a coarse bucket is created: a subject checked every
    # second for ten minutes keeps at most about three windows of fine buckets.
    backend = get_backend()
    rates = parse("1000/m")
    ns = namespace(group, "ip", "192.0.2.3")
    for t in range(600):
        backend.run(ns, windows.plan(rates, T0 + t), True)
    fine, _ = backend.physical_key(ns, windows.plan(rates, T0).writes[0][0])
    coarse, _ = backend.physical_key(ns, windows.plan(rates, T0).writes[1][0])
    # One hash a window, ``...:W/G``: x-fields are its coarse buckets.
    assert fine == coarse == f"{CACHE_PREFIX}{PREFIX}{ns}:60/60"
    fields = [f.decode() for f in server(backend).hkeys(fine)]
    coarse_fields = [f for f in fields if f.startswith("x")]
    assert 3 * 60 <= len(fields) - len(coarse_fields) <= 3 * 60 + 2 * 10
    assert 3 * 6 <= len(coarse_fields) <= 3 * 6 + 2
    # ...and a check still counts the whole window (one hit a second: 60, never fewer).
    values = backend.run(ns, windows.plan(rates, T0 + 600), False)
    usage = windows.evaluate(windows.plan(rates, T0 + 600), values, T0 + 600, counted=False)
    assert usage[0].count >= 60


def test_hashes_stay_small_for_a_busy_subject_of_any_cost(redis_cache: str, group: str) -> None:
    """The trim is called for when an increment created its bucket: with a cost of 3 that
    increment answers 3, not 1. A subject whose every request costs 3 keeps its hash as
    small as one whose requests cost 1, and its counts are 3 a request."""
    backend: Any = get_backend()
    rates = parse("1000/m")
    ns = namespace(group, "ip", "192.0.2.4")
    for t in range(600):
        backend.run_many([Op(ns, windows.plan(rates, T0 + t), True, amount=3)])
    fine, _ = backend.physical_key(ns, windows.plan(rates, T0).writes[0][0])
    fields = [f.decode() for f in server(backend).hkeys(fine)]
    assert 3 * 60 + 3 * 6 <= len(fields) <= 3 * 60 + 2 * 10 + 3 * 6 + 2
    plan = windows.plan(rates, T0 + 600)
    values = backend.run(ns, plan, False)
    assert windows.evaluate(plan, values, T0 + 600)[0].count == 3 * 60


def test_the_commands_of_each_cost_are_made_once_and_bounded(redis_cache: str) -> None:
    """A cost of 1 sends the commands made with the plan; another cost commands of its
    own (as many), kept per amount and started over when a callable's costs fill them."""
    from ratelimit_app.backends import redis as redis_backend

    enc = redis_backend.RedisEncoded(windows.plan(parse("5/m;100/h"), T0))
    assert enc.commands_for(1) is enc.commands
    seven = enc.commands_for(7)
    assert enc.commands_for(7) is seven
    assert [len(c) for c in seven] == [len(c) for c in enc.commands]
    increments = [c for c in seven[1] if c[0] in (b"HINCRBY", b"INCRBY")]
    assert increments and all(c[-1] == b"7" for c in increments)
    assert seven[2][0][-1] == b"7"  # lua/take_back.lua's amount
    assert enc.template(1, 10, 7) != enc.template(1, 10)
    for amount in range(2, 3 * redis_backend.AMOUNT_MEMO):
        enc.template(1, 10, amount)
    assert len(enc._amounts) <= redis_backend.AMOUNT_MEMO
    assert enc.commands_for(1) is enc.commands


def _client_id(backend: Any) -> int:
    return int(backend._call([b"CLIENT", b"ID"]))


def test_threads_in_turn_share_one_connection(redis_cache: str) -> None:
    """A server that runs each request's sync code on a thread of its own (Django's
    runserver, its ASGI handler) reuses the process's idle connection: one connection set-up
    per process and server, not one per request."""
    backend = get_backend()
    mine = _client_id(backend)
    assert _client_id(backend) == mine  # the same connection, command after command
    ids: list[int] = []
    for _ in range(20):  # a thread per request, one after the other
        thread = threading.Thread(target=lambda: ids.append(_client_id(backend)))
        thread.start()
        thread.join()
    assert set(ids) == {mine}
    backend.close()  # every connection: the next command connects again
    assert _client_id(backend) != mine


def test_threads_at_once_open_no_more_than_they_use_and_keep_a_bounded_few(
    redis_cache: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads checking at once each take a connection (none waits for another), never
    more than there are threads; given back, at most ``IDLE_CONNECTIONS`` stay open and the
    rest are closed, never left to the garbage collector."""
    from ratelimit_app.backends import redis as redis_backend

    assert redis_backend.IDLE_CONNECTIONS == 64
    backend = get_backend()
    pool = backend._idle
    monkeypatch.setattr(pool, "max_idle", 3)
    made: list[Any] = []
    closed: list[Any] = []
    most_open = [0]
    create, close = pool.create, redis_backend._Link.close

    def counted() -> Any:
        link = create()
        made.append(link)
        # A thread opens one only when none is idle: all those open are in use then.
        most_open[0] = max(most_open[0], len(made) - len(closed))
        return link

    def closing(link: Any) -> None:
        closed.append(link)
        close(link)

    monkeypatch.setattr(pool, "create", counted)
    monkeypatch.setattr(redis_backend._Link, "close", closing)
    go = threading.Barrier(8)

    def checks() -> None:
        go.wait()
        for _ in range(100):
            _client_id(backend)

    threads = [threading.Thread(target=checks) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Never more open at once than threads (one closed when given back past the bound may
    # be opened again later, by a thread that then finds none idle).
    assert made and most_open[0] <= 8
    assert len(pool.idle) <= 3
    still_open = [link for link in made if link.conn._sock is not None]
    assert len(still_open) == len(pool.idle)  # the others were closed when given back


def test_a_killed_connection_fails_one_check_then_reconnects(redis_cache: str, group: str) -> None:
    with mock.patch.object(base, "DEAD_RETRY", 0):  # the failure marks nothing down
        backend = get_backend()
        plan = windows.plan(parse("5/m"), T0)
        ns = namespace(group, "ip", "192.0.2.4")
        backend.run(ns, plan, True)
        server(backend).client_kill_filter(_id=_client_id(backend))
        time.sleep(0.05)  # the server closes the socket
        with pytest.raises(BackendError, match="closed"):
            backend.run(ns, plan, True)
        # The next check connects again; the failed one counted at most once.
        assert sum(backend.run(ns, plan, False)) in (1, 2)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_opens_its_own_connection(redis_cache: str) -> None:
    backend = get_backend()
    parent = _client_id(backend)
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: report its connection's id, never touch the parent's socket
        try:
            os.write(write, b"%d" % _client_id(backend))
        finally:
            os._exit(0)
    os.close(write)
    child = int(os.read(read, 64))
    os.close(read)
    os.waitpid(pid, 0)
    assert child != parent
    assert _client_id(backend) == parent  # the parent's connection still works


def test_a_check_is_one_transaction_of_plain_commands(redis_cache: str, group: str) -> None:
    """MULTI ... EXEC, no script: the server's time is its commands'."""
    backend = get_backend()
    rates = parse("5/m;100/h")
    ns = namespace(group, "ip", "192.0.2.40")
    client = server(backend)
    client.config_resetstat()
    for k in range(3):
        values = backend.run(ns, windows.plan(rates, T0 + k), True)
        assert sum(values) == 2 * (k + 1)  # both windows count every hit
    stats = client.info("commandstats")
    assert stats["cmdstat_exec"]["calls"] == 3 and stats["cmdstat_multi"]["calls"] == 3
    assert "cmdstat_evalsha" not in stats and "cmdstat_eval" not in stats


def test_without_hiredis_redis_py_reads_the_transaction(
    redis_cache: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hiredis is in the redis extra; without it redis-py parses, one reply at a time."""
    from ratelimit_app.backends import redis as redis_backend

    monkeypatch.setattr(redis_backend, "hiredis", None)
    backend = get_backend()
    backend.close()  # no connection with a hiredis reader is left in the pool
    ns = namespace(group, "ip", "192.0.2.41")
    plan = windows.plan(parse("5/m"), T0)
    assert [sum(backend.run(ns, plan, True)) for _ in range(3)] == [1, 2, 3]
    assert [link.reader for link in backend._idle.idle] == [None]  # the fallback was used


def test_the_cluster_backend_keeps_its_parents_constructor(redis_cache: str) -> None:
    """RedisClusterBackend is built by RedisBackend's constructor and replaces one step, how
    the client is opened (on first use: the cluster client reads the slot map when it is
    built). The settings read, the server's marked-down state and the pool of
    connections are its parent's, so closing it before first use closes nothing and
    fails nowhere."""
    plain = build(RedisBackend, "rl")
    cluster = build(RedisClusterBackend, "rl")
    for backend in (plain, cluster):
        assert (backend.url, backend.options["SOCKET_TIMEOUT"]) == (redis_cache, 0.7)
        assert backend.server.name in redis_cache  # its address, as messages name it
        assert backend.server.alive(time.monotonic())
        assert not backend._connections
    assert hasattr(plain, "client") and not hasattr(cluster, "client")
    assert not cluster.connected
    cluster.close()
    plain.close()


def test_the_scripts_are_the_lua_files_of_the_package(redis_cache: str) -> None:
    """Each script is read from ``ratelimit_app/backends/lua/`` at import, and Redis
    compiles each: a mistake in a file fails here, not only in the checks that happen to run
    it."""
    from ratelimit_app.backends import redis as redis_backend

    lua = resources.files("ratelimit_app.backends") / "lua"
    text = {p.name: p.read_text(encoding="utf-8") for p in lua.iterdir()}
    assert sorted(text) == ["meter.lua", "take_back.lua", "trim.lua"]
    take_back, meter, trim = (
        redis_backend.TAKE_BACK_SCRIPT,
        redis_backend.METER_SCRIPT,
        redis_backend.TRIM_SCRIPT,
    )
    assert (take_back, trim) == (text["take_back.lua"], text["trim.lua"])
    assert "MARGIN_MS" in text["meter.lua"] and "MOST_US" in text["meter.lua"]
    margin = f"local margin = {gcra.TTL_MARGIN * 1000 + 1}\n"
    most = f"local most = {redis_backend.FORCED_MOST}\n"
    assert meter == text["meter.lua"].replace("local margin = MARGIN_MS\n", margin).replace(
        "local most = MOST_US\n", most
    )
    client = caches["rl"].client.get_client()  # type: ignore[attr-defined]
    for script in (take_back, meter, trim):
        assert client.script_load(script) == hashlib.sha1(script.encode()).hexdigest()
