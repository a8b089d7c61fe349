"""Every Redis check is a transaction of plain commands: counted, looked at, or taking a
refused hit back, on one server or one per slot of a cluster.

Lua runs only what must decide inside the round trip (lua/take_back.lua, inside the
transaction; lua/trim.lua after it). Counters keep the layout the earlier releases wrote,
so an upgrade reads the counts already stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings
from redis.crc import key_slot

from ratelimit_app.algorithms import windows
from ratelimit_app.algorithms.rates import parse
from ratelimit_app.backends import get_backend, reset_backends
from ratelimit_app.backends.base import Op
from ratelimit_app.identity.keys import namespace
from tests.reliability import test_cluster_slots
from tests.servers import HOST
from tests.servers.redis_cluster import Cluster

T0 = 1_800_000_000.5
#: ``RATELIMIT_CACHE_PREFIX`` here, and django-redis's prefix (``KEY_PREFIX`` "", ``VERSION``
#: 1): the keys below are literals, as counters already on a server are.
PREFIX = "rl-tx:"
CACHE_PREFIX = ":1:"
LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}


@pytest.fixture(autouse=True)
def custom_prefix(module_prefix: None) -> None:
    """This module's counters under :data:`PREFIX`."""


@pytest.fixture
def on_redis(redis_server: str) -> Iterator[Any]:
    """The backend on the session's Redis, and a redis-py client of that server."""
    config = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server}
    with override_settings(CACHES={"default": LOCMEM, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        yield caches["rl"].client.get_client()  # type: ignore[attr-defined]
        reset_backends()


def test_a_take_back_is_part_of_the_checks_transaction(on_redis: Any, group: str) -> None:
    backend = get_backend()
    ns = namespace(group, "ip", "192.0.2.70")
    plan = windows.plan(parse("5/m"), T0)
    backend.run(ns, plan, True)
    backend.run(ns, plan, True)
    on_redis.config_resetstat()
    fine = windows.plan(parse("5/m"), T0, fine_only=True)
    values = backend.run(ns, fine, False, undo=plan)  # as a refused request's second trip
    stats = on_redis.info("commandstats")
    assert stats["cmdstat_multi"]["calls"] == stats["cmdstat_exec"]["calls"] == 1
    assert stats["cmdstat_eval"]["calls"] == 1 and "cmdstat_evalsha" not in stats
    # The take-back ran before the reads of the same transaction: one hit left.
    assert sum(values) == 1
    assert sum(backend.run(ns, plan, False)) == 1


def test_a_take_back_needs_no_script_loaded_first(on_redis: Any, group: str) -> None:
    """The take-back is sent with its script (EVAL): after a restart or SCRIPT FLUSH it
    still runs inside its transaction, never half of it."""
    backend = get_backend()
    ns = namespace(group, "ip", "192.0.2.71")
    plan = windows.plan(parse("5/m;100/h"), T0)
    backend.run(ns, plan, True)
    on_redis.script_flush()
    backend.run(ns, plan, False, undo=plan)
    assert backend.run(ns, plan, False) == [0] * len(plan.reads)


@pytest.mark.parametrize("hierarchical", [False, True])
def test_counters_in_the_stored_layout_are_read(
    on_redis: Any, group: str, hierarchical: bool
) -> None:
    """A uniform window's buckets are fields of one hash, ``<base>:W/G``: a fine bucket's
    field is its index, a coarse bucket's ``x`` and its index; a hierarchical bucket is a
    key, ``<base>:hL:index``. Counts stored that way (by an earlier release) are read."""
    backend = get_backend()
    ns = namespace(group, "ip", "192.0.2.72")
    base = CACHE_PREFIX + PREFIX + ns
    plan = windows.plan(parse("5/m;100/h"), T0, hierarchical=hierarchical)
    expected = []
    for n, suffix in enumerate(plan.reads):
        level, _, index = suffix.rpartition(":")
        if hierarchical:
            on_redis.set(base + suffix, n + 1)
        else:
            window, x, _coarse = level.partition("x")
            on_redis.hset(base + window, x + index, n + 1)
        expected.append(n + 1)
    assert backend.run(ns, plan, False) == expected


# -- a real cluster -------------------------------------------------------------------------------

#: test_cluster_slots' fixtures: a 3-node cluster on loopback, and the backend counting on it.
cluster = test_cluster_slots.cluster
on_cluster = test_cluster_slots.on_cluster


@pytest.fixture
def cluster_client(on_cluster: Cluster) -> Iterator[Any]:
    """A redis-py client of the cluster the backend counts on (RedisClusterBackend)."""
    import redis

    client = redis.RedisCluster(host=HOST, port=on_cluster.ports[0])
    yield client
    client.close()


def test_a_cluster_counts_and_takes_back_in_one_transaction_a_slot(
    on_cluster: Cluster, cluster_client: Any
) -> None:
    backend = get_backend()
    plan = windows.plan(parse("5/m;100/h"), T0)
    ops = [Op(namespace("tx", "ip", f"10.8.0.{i}"), plan, True) for i in range(1, 7)]
    cluster_client.config_resetstat(target_nodes="all")
    assert [sum(v) for v in backend.run_many(ops)] == [2] * 6
    undo = [Op(op.namespace, plan, False, plan) for op in ops]
    assert [sum(v) for v in backend.run_many(undo)] == [0] * 6
    stats = cluster_client.info("commandstats", target_nodes="all")
    calls = {
        name: sum(s.get(f"cmdstat_{name}", {}).get("calls", 0) for s in stats.values())
        for name in ("exec", "eval", "evalsha")
    }
    slots = len({key_slot(op.namespace.encode()) for op in ops})
    assert calls == {"exec": 2 * slots, "eval": 6, "evalsha": 0}
    # Taken back to nothing: every bucket dropped, not left at zero.
    assert not [k for keys in on_cluster.keys_by_node() for k in keys if b"{" in k]


def test_a_busy_subjects_hashes_are_trimmed_on_a_cluster(cluster_client: Any) -> None:
    """The trim (lua/trim.lua) runs on the node of the subject's slot."""
    backend: Any = get_backend()
    rates = parse("1000/m")
    ns = namespace("trim", "ip", "10.9.0.1")
    for t in range(400):
        backend.run(ns, windows.plan(rates, T0 + t), True)
    fine, _ = backend.physical_key(ns, windows.plan(rates, T0).writes[0][0])
    fields = cluster_client.hkeys(fine)
    assert 3 * 60 <= len(fields) <= 3 * 60 + 2 * 10 + 3 * 6 + 2
