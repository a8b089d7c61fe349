"""Redis Cluster, as far as one machine allows: hash tags and slots.

A Lua script on Redis Cluster may only touch keys of one hash slot, and the slot of a key is
that of its hash tag (the text between its first ``{`` and the next ``}``). Every key the
Redis backend writes for one subject carries the subject's namespace, ``{<32 hex>}``, as
that tag.

On the session's Redis (the real backend, through django-redis), every key a check writes
is read back with ``SCAN`` and its slot computed with redis-py's ``key_slot``:

* a check of one subject with several rates (sliding windows, uniform and hierarchical
  layouts, hits spread over a day, refused hits taken back) and a leaky bucket: all of the
  subject's keys, and nothing else, hash to the slot of its tag;
* two subjects almost never share a slot (200 subjects: at least 196 slots, spread over the
  thirds of the slot space that a 3-node cluster gives each node);
* the metrics Redis buffer's keys (the live hash, the hash being flushed, the pending set)
  share one slot.

On a real 3-node cluster started on loopback (slots assigned and nodes joined through
redis-py, about 2 s), checks run through the shipped
:class:`~ratelimit_app.backends.redis.RedisClusterBackend` (redis-py's ``RedisCluster``;
django-redis has no cluster client): one subject's checks on every node, the rules of one
request whose subjects hash to different slots (one script call per slot), both algorithms
in one request, a request through ``RatelimitMiddleware`` with an ``ip`` and an ``email``
rule, and a reset.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import redis
from django.test import RequestFactory, override_settings
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ratelimit_app import ALL
from ratelimit_app.algorithms import windows
from ratelimit_app.algorithms.gcra import LEAKY_BUCKET, SLIDING_WINDOW
from ratelimit_app.algorithms.rates import parse
from ratelimit_app.backends import base, get_backend, reset_backends
from ratelimit_app.core import aget_usage, get_usage, lookup, scope
from ratelimit_app.engine import Check, check_many
from ratelimit_app.exceptions import BackendError
from ratelimit_app.identity.keys import namespace
from ratelimit_app.testing import frozen_clock
from tests.conftest import start_or_skip
from tests.servers import HOST, free_port
from tests.servers.redis_cluster import Cluster

T0 = 1_700_000_000.0
RATE = "5/m;100/h;1000/d"
#: When the subjects of :func:`hit_over_a_day` are hit: buckets of every level of the three
#: windows, then a burst of 10 in the last 10 s: 5 admitted, 5 refused (and taken back).
OFFSETS = (-86_000, -40_000, -3_601, -3_599, -121, -70, *range(-9, 1))
CASES = {
    "sliding": {"rate": RATE, "algorithm": SLIDING_WINDOW, "hierarchical": False},
    "hierarchical": {"rate": RATE, "algorithm": SLIDING_WINDOW, "hierarchical": True},
    "leaky bucket": {"rate": "5/m", "algorithm": LEAKY_BUCKET, "hierarchical": False},
}
LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}


def tag(key: bytes) -> bytes:
    """The hash tag of ``key`` as Redis Cluster reads it (``b""``: none)."""
    start = key.find(b"{")
    end = key.find(b"}", start + 1)
    if start < 0 or end <= start + 1:
        return b""
    return key[start + 1 : end]


def by_subject(keys: list[bytes]) -> dict[bytes, list[bytes]]:
    grouped: dict[bytes, list[bytes]] = defaultdict(list)
    for key in keys:
        grouped[tag(key)].append(key)
    return dict(grouped)


def request_from(ip: str) -> Any:
    return RequestFactory().get("/", REMOTE_ADDR=ip)


def hit_over_a_day(ip: str, case: dict[str, Any], offsets: tuple[int, ...] = OFFSETS) -> list[Any]:
    """Hits of one subject at ``T0 + offsets``, through the public ``get_usage``; the usages."""
    usages = []
    with frozen_clock(T0) as clock:
        for offset in offsets:
            clock.set(T0 + offset)
            usage = get_usage(
                request_from(ip),
                group="cluster-slots",
                key="ip",
                rate=case["rate"],
                increment=True,
                fail_open=False,
                algorithm=case["algorithm"],
            )
            assert usage is not None and usage["limit"] > 0, usage  # limit 0: it failed
            usages.append(usage)
    return usages


def assert_limited_in_the_last_minute(usages: list[Any]) -> None:
    """The checks worked: the burst of the last 10 s got 5 in (the limit), then was refused."""
    burst = [u["should_limit"] for u in usages[-10:]]
    assert burst == [False] * 5 + [True] * 5, usages


# -- the keys the backend writes, on the session's Redis ----------------------------------------


@pytest.fixture
def written(redis_server: str) -> Iterator[tuple[redis.Redis, str]]:
    """The backend on the session's Redis with a key prefix of its own; its keys are
    ``SCAN``-ned by that prefix, and deleted at the end."""
    prefix = f"slots-{uuid.uuid4().hex[:8]}"
    config = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": redis_server,
        "KEY_PREFIX": prefix,
    }
    client = redis.Redis.from_url(redis_server)
    with override_settings(CACHES={"default": LOCMEM, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        try:
            yield client, prefix
        finally:
            for key in client.scan_iter(match=f"{prefix}:*"):
                client.delete(key)
            reset_backends()
            client.close()


def keys_of(written: tuple[redis.Redis, str]) -> list[bytes]:
    client, prefix = written
    return sorted(client.scan_iter(match=f"{prefix}:*", count=1000))


@pytest.mark.parametrize("name", list(CASES))
def test_every_key_of_one_subject_is_in_the_slot_of_its_tag(
    written: tuple[redis.Redis, str], name: str
) -> None:
    case = CASES[name]
    ips = ["10.1.0.1", "10.1.0.2", "10.1.0.3"]
    with mock.patch.object(windows, "HIERARCHICAL", case["hierarchical"]):
        for ip in ips:
            assert_limited_in_the_last_minute(hit_over_a_day(ip, case))
    keys = keys_of(written)
    subjects = by_subject(keys)
    assert b"" not in subjects, [k for k in keys if not tag(k)]  # every key has a tag
    assert len(subjects) == len(ips)  # one tag per subject, no key shared between them
    for subject, own in subjects.items():
        assert len(subject) == 32 and int(subject, 16) >= 0  # the hashed namespace
        assert {key_slot(k) for k in own} == {key_slot(subject)}
        if name == "leaky bucket":
            assert len(own) == 1  # the subject's TAT
        else:
            # Several keys, so the test proves something: the hashes of three windows (one
            # a window, fine and coarse fields), or the hierarchical layout's key per bucket.
            assert len(own) >= (10 if case["hierarchical"] else 3), own


def test_two_subjects_almost_never_share_a_slot(written: tuple[redis.Redis, str]) -> None:
    n = 200
    case = CASES["sliding"]
    for i in range(n):
        hit_over_a_day(f"10.2.{i // 256}.{i % 256}", case, offsets=(0,))
    subjects = by_subject(keys_of(written))
    assert len(subjects) == n
    slots = [key_slot(subject) for subject in subjects]
    # Random slots would collide about n^2 / (2 * 16384) = 1.2 times.
    assert len(set(slots)) >= n - 4
    thirds = [0, 0, 0]  # the slot ranges of the three nodes of a 3-node cluster
    for slot in slots:
        thirds[slot * 3 // REDIS_CLUSTER_HASH_SLOTS] += 1
    assert all(n // 5 <= count <= n // 2 for count in thirds), thirds


@pytest.mark.django_db
def test_the_metrics_redis_buffer_keys_share_one_slot(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import metrics_app
    from metrics_app import storage
    from metrics_app.buffer import shared as redis_buffer

    name = f"slots-buffer-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_server)
    seen: list[bytes] = []

    def write_counts(counts: Any, flush_id: str) -> bool:
        # In the middle of a flush: the live hash renamed, listed in the pending set.
        seen.extend(client.scan_iter(match=f"{{{name}}}*"))
        return True

    monkeypatch.setattr(storage, "write_counts", write_counts)
    redis_cache = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server}
    monkeypatch.setattr(redis_buffer, "REDIS_KEY", name)
    with override_settings(CACHES={"default": redis_cache}, METRICS_BUFFER="redis"):
        try:
            metrics_app.record("slots:a", 2)
            metrics_app.record("slots:b", 3)
            live = sorted(client.scan_iter(match=f"{{{name}}}*"))
            assert redis_buffer.flush() == 2
        finally:
            for key in client.scan_iter(match=f"{{{name}}}*"):
                client.delete(key)
            client.close()
    names = {k.decode().replace(name, "NAME").split(":flushing:")[0] for k in live + seen}
    assert names == {"{NAME}", "{NAME}:pending"}
    assert len({key_slot(k) for k in live + seen}) == 1


# -- a real cluster -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started = start_or_skip(Cluster)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def on_cluster(cluster: Cluster) -> Iterator[Cluster]:
    """The limiter's counters on the cluster, through the shipped ``RedisClusterBackend``."""
    config = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{HOST}:{cluster.ports[0]}/0",
    }
    with override_settings(
        CACHES={"default": LOCMEM, "rl": config},
        RATELIMIT_USE_CACHE="rl",
        RATELIMIT_BACKEND="ratelimit_app.backends.redis.RedisClusterBackend",
    ):
        reset_backends()
        try:
            yield cluster
        finally:
            reset_backends()
            cluster.flush()


@pytest.mark.parametrize("name", list(CASES))
def test_checks_of_one_subject_run_on_a_real_cluster(on_cluster: Cluster, name: str) -> None:
    case = CASES[name]
    ips = [f"10.3.0.{i}" for i in range(1, 31)]
    with mock.patch.object(windows, "HIERARCHICAL", case["hierarchical"]):
        for ip in ips:
            usages = hit_over_a_day(ip, case)
            assert_limited_in_the_last_minute(usages)
    nodes = on_cluster.keys_by_node()
    home: dict[bytes, int] = {}
    for n, keys in enumerate(nodes):
        for subject in by_subject(keys):
            assert subject not in home, "a subject's keys on two nodes"
            home[subject] = n
    assert len(home) == len(ips)
    # Subjects spread over the whole cluster: every node holds some.
    assert all(keys for keys in nodes), [len(k) for k in nodes]


@pytest.mark.parametrize("algorithm", [SLIDING_WINDOW, LEAKY_BUCKET])
def test_the_rules_of_one_request_run_on_a_real_cluster(
    on_cluster: Cluster, algorithm: str
) -> None:
    """Two subjects in two slots, one check_many: one script call per slot, both counted."""
    rates = parse("5/m")
    subjects = [("ip", "10.4.0.1"), ("email", "a@example.com")]
    checks = [
        Check(scope(f"rule-{n}", ALL, rates), subject, rates, True, algorithm)
        for n, subject in enumerate(subjects)
    ]
    namespaces = [namespace(c.scope, *c.subject) for c in checks]
    assert len({key_slot(ns.encode()) for ns in namespaces}) == 2  # the case that matters
    with frozen_clock(T0):
        outcomes = [[r.limited for r in check_many(checks)] for _ in range(6)]
    assert outcomes == [[False, False]] * 5 + [[True, True]]
    # Each subject's counters are on one node: the node of its slot.
    nodes = on_cluster.keys_by_node()
    for ns in namespaces:
        held = [n for n, keys in enumerate(nodes) if ns[1:-1].encode() in by_subject(keys)]
        assert len(held) == 1, (ns, held)


def test_both_algorithms_in_one_request_on_a_real_cluster(on_cluster: Cluster) -> None:
    rates = parse("3/m")
    checks = [
        Check(scope("window", ALL, rates), ("ip", "10.5.0.1"), rates, True, SLIDING_WINDOW),
        Check(scope("bucket", ALL, rates), ("ip", "10.5.0.2"), rates, True, LEAKY_BUCKET),
        Check(scope("window", ALL, rates), ("email", "b@example.com"), rates, True),
    ]
    with frozen_clock(T0):
        outcomes = [[r.limited for r in check_many(checks)] for _ in range(4)]
    assert outcomes == [[False, False, False]] * 3 + [[True, True, True]]


def test_the_middleware_and_a_reset_on_a_real_cluster(on_cluster: Cluster) -> None:
    """A log-in's rules, per address and per account (two slots), through the middleware;
    then the account's counters reset."""
    from django.http import HttpResponse

    from ratelimit_app.core import reset
    from ratelimit_app.middleware import RatelimitMiddleware

    rules = [
        {"name": "login-ip", "path": "/login/", "key": "ip", "rate": "10/m"},
        {"name": "login-email", "path": "/login/", "key": "email", "rate": "3/m"},
    ]
    middleware = RatelimitMiddleware(lambda request: HttpResponse("ok"))

    def post() -> int:
        request = RequestFactory().post(
            "/login/", {"email": "c@example.com"}, REMOTE_ADDR="10.6.0.1"
        )
        return middleware(request).status_code

    with override_settings(RATELIMIT_RULES=rules), frozen_clock(T0):
        assert [post() for _ in range(4)] == [200, 200, 200, 429]
        assert reset("login-email", "c@example.com")
        assert [post() for _ in range(4)] == [200, 200, 200, 429]
        # The address's rule counted the admitted requests only: 6 of 10 (refused ones count
        # nowhere), so one more address-only request is still admitted by it.
        usage = lookup("login-ip", "10.6.0.1")
        assert usage is not None and usage["count"] == 6


def test_an_unreachable_cluster_fails_the_check_then_fails_fast() -> None:
    """The cluster client connects on first use: a node that is not there fails that check
    (fail open: no limit), and the next ones fail at once while the backend is marked down."""
    config = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{HOST}:{free_port()}/0",  # nothing listens
    }
    with (
        override_settings(
            CACHES={"default": LOCMEM, "rl": config},
            RATELIMIT_USE_CACHE="rl",
            RATELIMIT_BACKEND="ratelimit_app.backends.redis.RedisClusterBackend",
        ),
        mock.patch.object(base, "DEAD_RETRY", 60),
    ):
        reset_backends()
        try:
            started = time.monotonic()
            usage = get_usage(
                request_from("10.7.0.1"),
                group="down",
                key="ip",
                rate="5/m",
                increment=True,
                fail_open=True,
            )
            first = time.monotonic() - started
            assert usage is None  # failed open
            started = time.monotonic()
            for _ in range(20):
                with pytest.raises(BackendError, match="marked down"):
                    check_many([Check("down", ("ip", "10.7.0.1"), parse("5/m"), True)])
            assert time.monotonic() - started < 0.5, "a marked-down backend must fail at once"
            assert first < 10, first
        finally:
            reset_backends()


async def test_an_async_check_the_cluster_redirects_counts_once(
    on_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The async path sends a slot's transaction to the node the slot map names; a node
    that answers ``MOVED`` (the map is stale: a resharding) ran nothing, and redis-py's
    client, in a thread, follows the redirection: the hit counts once."""
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.7")
    args = {"group": "redirected", "key": "ip", "rate": "5/m", "increment": True}
    first = await aget_usage(request, **args)
    manager = get_backend().client.nodes_manager  # type: ignore[attr-defined]
    real = manager.get_node_from_slot
    misrouted = []

    def stale(slot: int, *args: Any, **kwargs: Any) -> Any:
        node = real(slot, *args, **kwargs)
        if misrouted:  # once: then the map as it is
            return node
        misrouted.append(node.name)
        return next(n for n in manager.nodes_cache.values() if n.name != node.name)

    monkeypatch.setattr(manager, "get_node_from_slot", stale)
    second = await aget_usage(request, **args)
    monkeypatch.undo()
    third = await aget_usage(request, **args)
    assert misrouted
    assert [u["count"] for u in (first, second, third) if u] == [1, 2, 3]
