"""One contract, every backend: local memory, real memcached, real Redis."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from django.core.cache import caches
from django.test import override_settings

from ratelimit_app.algorithms import gcra, windows
from ratelimit_app.algorithms.rates import MAX_COUNT, parse
from ratelimit_app.backends import base, get_backend, reset_backends
from ratelimit_app.backends.base import Op
from ratelimit_app.exceptions import BackendError
from ratelimit_app.identity.keys import namespace
from ratelimit_app.testing import frozen_clock
from tests.ratelimit.checking import check
from tests.ratelimit.conftest import several_memcached

T0 = 1_800_000_000.5
#: ``RATELIMIT_CACHE_PREFIX`` in this module (not the default), and the cache's own prefix
#: (``KEY_PREFIX`` "" and ``VERSION`` 1, as Django's key function writes them). Expected keys
#: are built from these literals, never from the backend's idea of its prefix, so a prefix
#: the backend ignored fails here.
PREFIX = "rl-contract:"
CACHE_PREFIX = ":1:"


@pytest.fixture(autouse=True)
def custom_prefix(module_prefix: None) -> None:
    """This module's counters under :data:`PREFIX`."""


def remaining_ttl(kind: str, key: str) -> float:
    cache: Any = caches["rl"]
    if kind == "redis":
        return float(cache.client.get_client().ttl(key))
    if kind == "memcached":
        server = get_backend().nodes[0].client  # type: ignore[attr-defined]
        reply = server.raw_command(f"mg {key} t".encode()).decode()
        return float(reply.split()[1][1:])
    return cache._expire_info[key] - time.time()


def physical_key(kind: str, ns: str, suffix: str) -> str:
    """The server key of a bucket. Redis keeps a uniform window's buckets in one hash,
    ``...:W/G`` (``:60/60:123`` and ``:60/60x10:12`` are fields of ``:60/60``)."""
    if kind == "redis" and not suffix.startswith(":h") and suffix != gcra.SUFFIX:
        suffix = suffix.rsplit(":", 1)[0].split("x")[0]
    return CACHE_PREFIX + PREFIX + ns + suffix


class TestContract:
    def test_increment_then_read_sees_the_hit(self, backend: Any, group: str) -> None:
        plan = windows.plan(parse("5/m"), T0)
        ns = namespace(group, "ip", "192.0.2.1")
        (written,) = [plan.reads.index(s) for s, _ttl in plan.writes if s in plan.reads]
        for expected in (1, 2, 3):
            values = backend.run(ns, plan, True)
            assert sum(values) == expected
            assert values[written] == expected  # the current coarse bucket is read whole
        assert sum(backend.run(ns, plan, False)) == 3  # a peek writes nothing

    def test_subjects_and_groups_are_separate(self, backend: Any, group: str) -> None:
        plan = windows.plan(parse("5/m"), T0)
        backend.run(namespace(group, "ip", "192.0.2.1"), plan, True)
        assert sum(backend.run(namespace(group, "ip", "192.0.2.2"), plan, False)) == 0
        assert sum(backend.run(namespace(group + "x", "ip", "192.0.2.1"), plan, False)) == 0

    def test_one_call_for_several_subjects_reads_each_its_own(
        self, backend: Any, group: str
    ) -> None:
        """run_many: each op gets its own buckets, hits and misses mixed, even when one
        namespace is a prefix of another's."""
        ns = namespace(group, "ip", "192.0.2.7")
        other = namespace(group, "email", "a@example.com")
        plans = {
            ns: windows.plan(parse("5/m"), T0),
            ns + "x": windows.plan(parse("5/m;100/d"), T0),
            other: windows.plan(parse("10/h"), T0),
        }
        earlier = windows.plan(parse("5/m;100/d"), T0 - 20)  # a hit 20 s ago: a hit to read
        backend.run(ns + "x", earlier, True)
        backend.run(other, plans[other], True)
        ops = [
            Op(ns, plans[ns], True),
            Op(ns + "x", plans[ns + "x"], True),
            Op(other, plans[other], False),
        ]
        together = backend.run_many(ops)
        alone = [backend.run(op.namespace, op.plan, False) for op in ops]
        assert together == alone
        assert [sum(v) for v in together] == [1, 4, 1]  # 1; 2 per rate for ns+"x"; 1

    def test_undo_and_delete(self, backend: Any, group: str) -> None:
        plan = windows.plan(parse("5/m;100/d"), T0)
        ns = namespace(group, "ip", "192.0.2.3")
        backend.run(ns, plan, True)
        backend.run(ns, plan, True)
        backend.run(ns, plan, False, undo=plan)
        assert sum(backend.run(ns, plan, False)) == 2  # one per rate
        backend.delete(ns, plan.reads)
        assert sum(backend.run(ns, plan, False)) == 0

    def test_take_back_and_read_in_one_call(self, backend: Any, group: str) -> None:
        plan = windows.plan(parse("5/m;100/d"), T0)
        detail = windows.plan(parse("5/m;100/d"), T0, fine_only=True)
        ns = namespace(group, "ip", "192.0.2.5")
        backend.run(ns, plan, True)
        backend.run(ns, plan, True)
        values = backend.run(ns, detail, False, undo=plan)
        assert [u.count for u in windows.evaluate(detail, values, T0)] == [1, 1]
        assert [u.count for u in windows.evaluate(plan, backend.run(ns, plan, False), T0)] == [
            1,
            1,
        ]

    def test_several_subjects_in_one_call(self, backend: Any, group: str) -> None:
        """The rules of one request: counting, looking and taking back, all in one call."""
        plan = windows.plan(parse("5/m;100/d"), T0)
        other = windows.plan(parse("3/h"), T0)
        a, b, c = (namespace(group, "ip", f"192.0.2.{n}") for n in (10, 11, 12))
        backend.run(c, plan, True)
        values = backend.run_many(
            [Op(a, plan, True), Op(b, other, False), Op(c, plan, False, undo=plan), Op(a, plan)]
        )
        counts = [
            [u.count for u in windows.evaluate(p, v, T0)]
            for p, v in zip((plan, other, plan, plan), values, strict=True)
        ]
        assert counts == [[1, 1], [0], [0, 0], [1, 1]]
        assert backend.run_many([]) == []

    def test_a_vanished_undo_beside_counting_subjects(self, backend: Any, group: str) -> None:
        """A take-back that finds nothing (memcached answers its quiet decrements with NF,
        ahead of the increments' values) does not shift the other subjects' replies."""
        plan = windows.plan(parse("5/m;100/d"), T0)
        gone, a, b = (namespace(group, "ip", f"192.0.2.{n}") for n in (20, 21, 22))
        backend.run(b, plan, True)
        values = backend.run_many(
            [Op(gone, plan, False, undo=plan), Op(a, plan, True), Op(b, plan, True)]
        )
        counts = [[u.count for u in windows.evaluate(plan, v, T0)] for v in values]
        assert counts == [[0, 0], [1, 1], [2, 2]]
        assert backend.run(gone, plan, False) == [0] * len(plan.reads)

    def test_undo_of_a_vanished_bucket_leaves_nothing(self, backend: Any, group: str) -> None:
        plan = windows.plan(parse("5/m"), T0)
        ns = namespace(group, "ip", "192.0.2.4")
        backend.run(ns, plan, True)
        backend.delete(ns, plan.reads)  # evicted, or reset, between the hit and its undo
        backend.run(ns, plan, False, undo=plan)
        assert backend.run(ns, plan, False) == [0] * len(plan.reads)
        assert sum(backend.run(ns, plan, True)) == 1

    @pytest.mark.parametrize("hierarchical", [False, True])
    def test_a_cost_adds_and_takes_back_that_many_hits(
        self, backend: Any, group: str, hierarchical: bool
    ) -> None:
        """An op's ``amount`` (a request's cost) in one command a bucket: created at it,
        raised by it, taken back by it across a digit (memcached pads ``12 - 5`` as ``7 ``)
        and never below 0 (a take-back larger than the count, after a reset)."""
        plan = windows.plan(parse("20/m;100/d"), T0, hierarchical=hierarchical)
        ns = namespace(group, "ip", "192.0.2.6")

        def counts(op: Op) -> list[int]:
            return [u.count for u in windows.evaluate(plan, backend.run_many([op])[0], T0)]

        assert counts(Op(ns, plan, True, amount=6)) == [6, 6]
        assert counts(Op(ns, plan, True, amount=6)) == [12, 12]
        assert counts(Op(ns, plan, False, undo=plan, amount=5)) == [7, 7]
        assert counts(Op(ns, plan, True, amount=4)) == [11, 11]
        assert counts(Op(ns, plan, True)) == [12, 12]  # a cost of 1 beside them
        backend.delete(ns, plan.reads)  # a reset between a hit and its take-back
        assert counts(Op(ns, plan, True, amount=2)) == [2, 2]
        assert counts(Op(ns, plan, False, undo=plan, amount=9)) == [0, 0]
        assert counts(Op(ns, plan, True, amount=3)) == [3, 3]  # from 0, not from -7

    def test_the_largest_cost_twice_counts_exactly(self, backend: Any, group: str) -> None:
        """A cost is at most ``rates.MAX_COUNT`` (10**9): twice that is past 2**31 and still
        exact, and taken back whole."""
        plan = windows.plan(parse("5/m"), T0)
        ns = namespace(group, "ip", "192.0.2.7")
        big = MAX_COUNT
        for n in (1, 2):
            values = backend.run_many([Op(ns, plan, True, amount=big)])[0]
            (usage,) = windows.evaluate(plan, values, T0, counted=True, cost=big)
            assert (usage.count, usage.limited) == (n * big, True)
        values = backend.run_many([Op(ns, plan, False, undo=plan, amount=big)])[0]
        assert windows.evaluate(plan, values, T0)[0].count == big

    def test_costs_of_several_subjects_in_one_call(self, backend: Any, group: str) -> None:
        """Each op of a round trip adds its own amount; the same plan at two amounts in
        one call (two requests' commands are kept apart)."""
        plan = windows.plan(parse("50/m"), T0)
        a, b, c = (namespace(group, "ip", f"192.0.2.{n}") for n in (13, 14, 15))
        backend.run_many([Op(c, plan, True, amount=10)])
        for _ in range(2):
            values = backend.run_many(
                [Op(a, plan, True, amount=7), Op(b, plan, True), Op(c, plan, False, plan, 4)]
            )
        counts = [windows.evaluate(plan, v, T0)[0].count for v in values]
        assert counts == [14, 2, 2]

    @pytest.mark.parametrize("hierarchical", [False, True])
    def test_keys_hashed_short_and_with_ttls(
        self, backend_kind: str, group: str, hierarchical: bool
    ) -> None:
        backend = get_backend()
        plan = windows.plan(parse("5/m;10/h;100/d"), time.time(), hierarchical=hierarchical)
        ns = namespace(group, "email", "alice@example.com")
        backend.run(ns, plan, True)
        longest: dict[str, int] = {}  # Redis: the buckets of a window share one hash
        for suffix, ttl in plan.writes:
            key = physical_key(backend_kind, ns, suffix)
            longest[key] = max(ttl, longest.get(key, 0))
        for suffix, ttl in plan.writes:
            key = physical_key(backend_kind, ns, suffix)
            assert "alice" not in key and "example" not in key
            assert len(key.encode()) < 250 and not any(c.isspace() or ord(c) < 33 for c in key)
            # The counter is on the server under exactly that key, with the TTL planned
            # (a shared hash: the longest of its buckets').
            assert ttl - 2 <= remaining_ttl(backend_kind, key) <= longest[key] + 1

    def test_a_corrupt_counter_is_an_error_not_a_zero(self, backend_kind: str, group: str) -> None:
        backend = get_backend()
        plan = windows.plan(parse("5/m"), time.time())
        ns = namespace(group, "ip", "192.0.2.9")
        suffix = plan.writes[0][0]
        if backend_kind == "redis":
            key, field = backend.physical_key(ns, suffix)
            assert key == physical_key(backend_kind, ns, suffix)
            caches["rl"].client.get_client().hset(key, field, "x")
        elif backend_kind == "memcached":
            node = backend.nodes[0].client  # type: ignore[attr-defined]
            node.set(physical_key(backend_kind, ns, suffix), b"not-a-number")
        else:
            caches["rl"].set(PREFIX + ns + suffix, "not-a-number")  # the cache adds ":1:"
        with pytest.raises(BackendError):
            backend.run(ns, plan, True)

    @pytest.mark.parametrize("all_there", [True, False], ids=["every-bucket", "some-missing"])
    def test_a_corrupt_counter_only_read_is_an_error_not_a_zero(
        self, backend_kind: str, group: str, all_there: bool
    ) -> None:
        # A bucket the check reads but does not write (an older part of the window): the
        # read must not take garbage for zero, whether the other buckets are there or not.
        backend = get_backend()
        plan = windows.plan(parse("5/m"), time.time())
        ns = namespace(group, "ip", "192.0.2.10")
        written = {suffix for suffix, _ in plan.writes}
        only_read = [s for s in plan.reads if s not in written]
        if all_there:
            backend.run(ns, plan, True)
            for suffix in only_read:
                self._store(backend_kind, backend, ns, suffix, "1")
        self._store(backend_kind, backend, ns, only_read[0], "not-a-number")
        with pytest.raises(BackendError):
            backend.run(ns, plan, True)

    @staticmethod
    def _store(backend_kind: str, backend: Any, ns: str, suffix: str, value: str) -> None:
        if backend_kind == "redis":
            key, field = backend.physical_key(ns, suffix)
            assert key == physical_key(backend_kind, ns, suffix)
            caches["rl"].client.get_client().hset(key, field, value)
        elif backend_kind == "memcached":
            full_key = physical_key(backend_kind, ns, suffix)
            backend.nodes[0].client.set(full_key, value.encode(), expire=300)
        else:
            caches["rl"].set(PREFIX + ns + suffix, value, 300)  # the cache adds ":1:"

    def test_threads_never_admit_more_than_the_limit(self, backend: Any, group: str) -> None:
        admitted = []
        barrier = threading.Barrier(8)

        def worker() -> None:
            barrier.wait()
            for _ in range(25):
                result = check(group, ("ip", "192.0.2.50"), parse("20/m"), True)
                if not result.limited:
                    admitted.append(1)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        topped_up = top_up(group, ("ip", "192.0.2.50"), "20/m")
        # docs/concepts.rst, "Never lenient": no window of length W ever admits more than N
        # requests, under any amount of concurrency.
        assert len(admitted) <= 20
        # docs/concepts.rst, "Refused hits are taken back" and "Tight": a refused request
        # does not use up the quota, so once the concurrent requests are answered the window
        # holds the admitted ones alone and one request at a time is admitted until it holds
        # N. (Concurrent requests may be refused where they would have fit: the strict side.)
        assert len(admitted) + topped_up == 20

    def test_concurrent_hits_never_pass_the_limit(self, backend: Any, group: str) -> None:
        """Many hits at once on one subject: never more than the limit admitted (a hit may
        be refused where it would have fit, when a read sees hits that came after it), and
        the refused ones taken back."""

        def worker(subject: tuple[str, str], barrier: Any, admitted: list[int]) -> None:
            barrier.wait()
            if not check(group, subject, parse("5/m;50/h"), True).limited:
                admitted.append(1)

        for round_ in range(8):
            admitted: list[int] = []
            barrier = threading.Barrier(24)
            subject = ("ip", f"192.0.2.{60 + round_}")
            threads = [
                threading.Thread(target=worker, args=(subject, barrier, admitted))
                for _ in range(24)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            topped_up = top_up(group, subject, "5/m;50/h")
            # docs/concepts.rst, "Never lenient": no window of length W ever admits more
            # than N requests, under any amount of concurrency.
            assert len(admitted) <= 5, f"round {round_}"
            # docs/concepts.rst, "Refused hits are taken back" and "Tight": a refused request
            # does not use up the quota, so once the concurrent requests are answered the
            # window holds the admitted ones alone and one request at a time is admitted
            # until it holds N. (Concurrent requests may be refused where they would have
            # fit: the strict side.)
            assert len(admitted) + topped_up == 5, f"round {round_}"

    def test_a_busy_subject_reads_every_bucket(self, backend: Any, group: str) -> None:
        """Every bucket a check reads holds a value: a reply of many kilobytes, read whole."""
        rates = parse("100000/m;100000/h;100000/d")
        ns = namespace(group, "ip", "192.0.2.40")
        end = T0 + 86400 + 29 * 60 + 29.5  # half past: the most buckets at each edge
        final = windows.plan(rates, end, hierarchical=True)
        # One hit inside each bucket the final check reads (and never after it).
        times = sorted(
            {min(end, int(s.split(":")[2]) * int(s.split(":")[1][1:]) + 0.5) for s in final.reads}
        )
        for t in times:
            backend.run(ns, windows.plan(rates, t, hierarchical=True), True)
        values = backend.run(ns, final, False)
        assert len(values) > 150
        assert sum(1 for v in values if v) > 100
        counts = [u.count for u in windows.evaluate(final, values, end)]
        exact = [sum(1 for t in times if int(end) - r.seconds <= int(t)) for r in rates]
        assert counts == exact  # whole seconds [T - W, T]: exact

    @pytest.mark.parametrize("hierarchical", [False, True])
    def test_steady_traffic_counts_match_brute_force(
        self, backend: Any, group: str, hierarchical: bool
    ) -> None:
        """A hit a second for three minutes: every count is the window's true count (to one
        fine bucket), across coarse bucket edges, with the backend's own bucket clean-up."""
        rates = parse("100000/m")
        ns = namespace(group, "ip", "192.0.2.41")
        times: list[float] = []
        for n in range(180):
            t = T0 + n * 1.0
            times.append(t)
            plan = windows.plan(rates, t, hierarchical=hierarchical)
            count = windows.evaluate(plan, backend.run(ns, plan, True), t, counted=True)[0].count
            exact = sum(1 for e in times if t - 60 < e <= t)
            assert exact <= count <= exact + 1, (n, count, exact)

    def test_time_travel_through_a_day(self, backend: Any, group: str) -> None:
        rate = parse("10/d")
        with frozen_clock(T0) as clock:
            outcomes = []
            for _ in range(24):  # one hit an hour, two days... limit 10 a day
                outcomes.append(check(group, ("ip", "192.0.2.60"), rate, True).limited)
                clock.advance(3600)
            # The first 10 pass, the next 14 in that day are refused.
            assert outcomes == [False] * 10 + [True] * 14
            clock.advance(86400)
            assert not check(group, ("ip", "192.0.2.60"), rate, True).limited


def top_up(group: str, subject: tuple[str, str], rate: str) -> int:
    """Counted hits of ``subject`` one at a time until one is refused: how many the window
    still admits (stops at 1000, far over any limit here)."""
    for admitted in range(1000):
        if check(group, subject, parse(rate), True).limited:
            return admitted
    raise AssertionError(f"{rate} never refused {subject}")


def _process_worker(args: tuple[str, str, int]) -> int:
    group, ip, hits = args
    reset_backends()  # never share a parent's sockets after fork
    return sum(not check(group, ("ip", ip), parse("30/m"), True).limited for _ in range(hits))


@pytest.mark.parametrize("kind", ["memcached", "redis"])
def test_processes_never_admit_more_than_the_limit(kind: str, request: Any, group: str) -> None:
    from tests.ratelimit.conftest import cache_config

    config = cache_config(kind, request)
    with override_settings(CACHES={"default": config, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        context = multiprocessing.get_context("fork")
        with context.Pool(4) as pool:
            admitted = sum(pool.map(_process_worker, [(group, "192.0.2.70", 40)] * 4))
        topped_up = top_up(group, ("ip", "192.0.2.70"), "30/m")
    # docs/concepts.rst, "Never lenient": no window of length W ever admits more than N
    # requests, under any amount of concurrency.
    assert admitted <= 30
    # docs/concepts.rst, "Refused hits are taken back" and "Tight": a refused request does
    # not use up the quota, so once the concurrent requests are answered the window holds
    # the admitted ones alone and one request at a time is admitted until it holds N.
    # (Concurrent requests may be refused where they would have fit: the strict side.)
    assert admitted + topped_up == 30


@pytest.fixture
def blackhole() -> Any:
    """A TCP server that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def _refused_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("kind", ["memcached", "redis"])
@pytest.mark.parametrize("server", ["refused", "blackhole"])
def test_dead_servers_fail_fast(kind: str, server: str, blackhole: str, group: str) -> None:
    address = blackhole if server == "blackhole" else f"127.0.0.1:{_refused_port()}"
    if kind == "memcached":
        config = {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": address,
        }
    else:
        config = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{address}/0",  # no timeouts set: ours apply
        }
    settings = {"CACHES": {"default": config, "rl": config}, "RATELIMIT_USE_CACHE": "rl"}
    with override_settings(**settings), mock.patch.object(base, "DEAD_RETRY", 60):
        reset_backends()
        started = time.perf_counter()
        with pytest.raises(BackendError):
            check(group, ("ip", "192.0.2.80"), parse("5/m"), True)
        first = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(100):
            # The dead server is skipped, not asked again on every request.
            with pytest.raises(BackendError, match="marked down"):
                check(group, ("ip", "192.0.2.80"), parse("5/m"), True)
        later = (time.perf_counter() - started) / 100
    reset_backends()
    assert first < 0.5
    assert later < 0.01  # loose: this machine is shared; the match above is the real check


def test_several_memcached_nodes(two_memcached: list[Any], group: str) -> None:
    first, second = two_memcached
    with several_memcached(first, second.address):
        reset_backends()
        backend: Any = get_backend()
        plan = windows.plan(parse("5/m;10/h;100/d"), time.time())
        # One call for subjects on both nodes: each node gets its own subjects' ops.
        spread = [Op(namespace(group, "ip", f"198.51.100.{n}"), plan, True) for n in range(20)]
        now = time.time()
        counted = [windows.evaluate(plan, v, now) for v in backend.run_many(spread)]
        assert [[u.count for u in usages] for usages in counted] == [[1, 1, 1]] * 20
        homes = []
        for n in range(40):
            ns = namespace(group, "ip", f"192.0.2.{n}")
            backend.run(ns, plan, True)
            keys = [physical_key("memcached", ns, s).encode() for s, _ in plan.writes]
            holders = [
                sum(node.client.raw_command(b"mg " + k + b" v").startswith(b"VA") for k in keys)
                for node in backend.nodes
            ]
            # Every bucket of one subject is on one node: a check is one round trip.
            assert sorted(holders) == [0, len(keys)]
            homes.append(holders.index(len(keys)))
        assert set(homes) == {0, 1}  # subjects spread over both nodes

        second.stop()
        started = time.perf_counter()
        for n in range(40):  # the subjects of the lost node move; nobody sees an error
            check(group, ("ip", f"192.0.2.{n}"), parse("5/m"), True)
        assert time.perf_counter() - started < 1.0
    reset_backends()


def test_ratelimited_signal_carries_no_raw_subject(backend: Any, group: str) -> None:
    from django.test import RequestFactory

    from ratelimit_app.core import get_usage
    from ratelimit_app.signals import ratelimited

    seen: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append(kwargs)

    ratelimited.connect(receiver)
    try:
        request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.150")
        for _ in range(3):
            get_usage(request, group=group, key="ip", rate="2/m", increment=True)
    finally:
        ratelimited.disconnect(receiver)
    assert len(seen) == 1
    assert seen[0]["group"] == group
    assert seen[0]["request"] is request
    assert "192.0.2.150" not in seen[0]["subject"]
    assert seen[0]["usage"]["should_limit"]


@override_settings(
    CACHES={"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}},
    RATELIMIT_USE_CACHE="default",
)
def test_a_dummy_cache_sees_only_the_requests_own_cost(group: str) -> None:
    """Nothing is stored: each check sees its own cost alone, so a cost within the limit is
    admitted every time and one above it refused every time, as on a real cache."""
    reset_backends()
    try:
        plan = windows.plan(parse("5/m"), T0)
        ns = namespace(group, "ip", "192.0.2.90")
        for cost, limited in ((5, False), (5, False), (6, True)):
            values = get_backend().run_many([Op(ns, plan, True, amount=cost)])[0]
            (usage,) = windows.evaluate(plan, values, T0, counted=True, cost=cost)
            assert (usage.count, usage.limited) == (cost, limited)
    finally:
        reset_backends()


@pytest.mark.parametrize("kind", ["memcached", "redis"])
def test_key_prefix_with_braces_still_counts(kind: str, request: Any, group: str) -> None:
    from tests.ratelimit.conftest import cache_config

    config = {**cache_config(kind, request), "KEY_PREFIX": "site}:{x}"}
    with override_settings(CACHES={"default": config, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        rates = parse("5/m;10/h")
        counts = [
            check(group, ("ip", "192.0.2.90"), rates, True).usages[0].count for _ in range(3)
        ]
    reset_backends()
    assert counts == [1, 2, 3]


@contextlib.contextmanager
def memcached_backend(server: str, **options: Any) -> Iterator[Any]:
    """The limiter's backend on the memcached ``server`` (alias "rl", ``OPTIONS``)."""
    config = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": server,
        "OPTIONS": options,
    }
    locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    with override_settings(CACHES={"default": locmem, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        try:
            yield get_backend()
        finally:
            reset_backends()


def test_memcached_keeps_at_most_max_pool_size_idle_connections(
    memcached_server: str, group: str
) -> None:
    """More threads checking at once than ``max_pool_size``: every check is served (a
    thread that finds no idle connection opens one), at most ``max_pool_size`` stay idle,
    and a connection that failed is closed, never handed to the next check."""
    with memcached_backend(memcached_server, max_pool_size=2) as backend:
        pool = backend.nodes[0].client.client_pool
        start = threading.Barrier(8)
        counts: list[int] = []

        def checks() -> None:
            start.wait()
            for _ in range(20):
                counts.append(
                    check(group, ("ip", "192.0.2.1"), parse("1000/m"), True).usages[0].count
                )

        threads = [threading.Thread(target=checks) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(counts) == 160  # every check served
        look = check(group, ("ip", "192.0.2.1"), parse("1000/m"), False)
        assert look.usages[0].count == 160  # and counted once
        assert 1 <= len(pool.idle) <= 2
        idle = list(pool.idle)
        for client in idle:
            client.sock.close()  # broken under the pool's feet
        with pytest.raises(BackendError):
            check(group, ("ip", "192.0.2.2"), parse("1000/m"), True)
        assert all(client not in pool.idle for client in idle[-1:])  # the failed one is gone
        assert idle[-1].sock is None  # and closed


def test_a_forked_child_does_not_share_its_parents_memcached_connections(
    memcached_server: str, group: str
) -> None:
    """A check in the parent leaves a connection idle; a child forked after it (gunicorn
    ``--preload``) starts with none, so it never reads the parent's replies as its own, and
    both go on counting the same subject correctly."""
    subject = ("ip", "192.0.2.9")
    with memcached_backend(memcached_server) as backend:
        pool = backend.nodes[0].client.client_pool
        assert check(group, subject, parse("100/m"), True).usages[0].count == 1
        assert len(pool.idle) == 1
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running the parent's atexit
            try:
                inherited = len(pool.idle)
                count = check(group, subject, parse("100/m"), True).usages[0].count
                os.write(write, f"{inherited} {count}".encode())
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as answer:
            reported = answer.read().split()
        assert reported == ["0", "2"]  # nothing inherited; the child's hit counted second
        assert check(group, subject, parse("100/m"), True).usages[0].count == 3
