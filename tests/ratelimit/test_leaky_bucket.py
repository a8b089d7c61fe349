"""The leaky bucket (``algorithm="leaky_bucket"``) on local memory, real memcached and Redis.

Every decision is compared with the reference meter (``ReferenceMeter`` in this directory's
conftest: exact fractions, the same clock) on random and bursty traces; then the decorator,
rules through the middleware (docs/rules' worked examples: a bucket per user id, per IP, per
device type), the 429 and its headers, lookups, resets and the command, and concurrency:
4 processes x 8 threads against one subject never get more than the capacity admitted.
"""

from __future__ import annotations

import io
import itertools
import json
import multiprocessing
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit_app import checks, core
from ratelimit_app.algorithms import gcra, windows
from ratelimit_app.algorithms.rates import parse
from ratelimit_app.backends import get_backend, reset_backends
from ratelimit_app.backends.base import MeterOp, Op
from ratelimit_app.config.rules import RuleError, parse_rule
from ratelimit_app.core import get_usage, is_ratelimited
from ratelimit_app.decorators import ratelimit, registry
from ratelimit_app.exceptions import BackendError
from ratelimit_app.identity.keys import namespace
from ratelimit_app.testing import frozen_clock
from tests.ratelimit.checking import check
from tests.ratelimit.conftest import MIDDLEWARE, ReferenceMeter, rules, several_memcached

T0 = 1_800_000_000.0
T0_US = int(T0) * gcra.MICROS
#: A fresh group for each hypothesis example (the fixture's is one per test).
EXAMPLES = itertools.count()
LEAKY = gcra.LEAKY_BUCKET


# -- views and URLs of this module ---------------------------------------------------------


@ratelimit(key="ip", rate="6/m", algorithm=LEAKY, burst=3)
def metered(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(key="ip", rate="6/m", algorithm=LEAKY, burst=3)
async def metered_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def status(request: HttpRequest, code: int) -> HttpResponse:
    return HttpResponse(f"status {code}", status=code)


async def async_plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("metered/", metered),
    path("metered-async/", metered_async),
    path("api/", plain),
    path("async/", async_plain),
    path("status/<int:code>/", status),
]


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    with override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=MIDDLEWARE):
        yield


def bucket(name: str, **fields: Any) -> dict[str, Any]:
    """A leaky-bucket rule on /api/: 6 a minute (one every 10 s), a burst of 3."""
    return {
        "name": name,
        "path": "/api/",
        "key": "ip",
        "rate": "6/m",
        "algorithm": LEAKY,
        "burst": 3,
        **fields,
    }


def meter(group: str, subject: str, rate: str, burst: int | None, count: bool = True) -> Any:
    return check(group, ("ip", subject), parse(rate), count, LEAKY, burst)


def at(clock: Any, now_us: int) -> None:
    """Set the frozen clock to ``now_us`` microseconds (read back exactly by the meter)."""
    clock.set(now_us / gcra.MICROS)
    assert gcra.micros(clock()) == now_us


# -- every decision equals the reference meter's, on every backend ----------------------------


def random_trace(rng: random.Random, interval_us: float, n: int) -> list[tuple[int, bool]]:
    """Poisson-like arrivals around the leak rate, a few looks among them."""
    now, trace = T0_US, []
    for _ in range(n):
        now += int(rng.expovariate(1.5 / interval_us))
        trace.append((now, rng.random() > 0.1))
    return trace


def bursty_trace(rng: random.Random, interval_us: float, n: int) -> list[tuple[int, bool]]:
    """Bursts at one instant, pauses of exactly whole intervals (every boundary case), and
    now and then a clock a little behind (another server)."""
    now, trace = T0_US, []
    while len(trace) < n:
        for _ in range(rng.randint(1, 8)):
            trace.append((now, True))
        pause = rng.choice(["whole", "whole", "random", "behind"])
        if pause == "whole":
            now += int(-(-rng.randint(1, 4) * interval_us // 1))
        elif pause == "random":
            now += rng.randint(0, int(5 * interval_us))
        else:
            trace.append((now - rng.randint(1, int(interval_us)), True))
    return trace[:n]


def compare(group: str, rate: str, burst: int | None, trace: list[tuple[int, bool]]) -> int:
    """Run ``trace`` through the backend and the reference; return how many were admitted."""
    (r,) = parse(rate)
    capacity = r.count if burst is None else burst
    ref = ReferenceMeter(r.count, r.seconds, capacity)
    admitted = 0
    with frozen_clock(T0) as clock:
        for step, (now_us, count) in enumerate(trace):
            at(clock, now_us)
            result = meter(group, "192.0.2.1", rate, burst, count)
            t = Fraction(now_us, gcra.MICROS)
            expected = ref.request(t, count)
            assert result.limited == (not expected), (step, now_us, count)
            level, remaining, wait, empty = ref.figures(t)
            state = result.meter
            assert (state.level, state.remaining) == (float(level), remaining), step
            assert (state.retry_after, state.empty_in) == (float(wait), float(empty)), step
            admitted += state.admitted
    return admitted


@pytest.mark.parametrize(
    ("rate", "burst"), [("10/s", 5), ("3/s", None), ("7/m", 2), ("100/h", 1), ("1/s", 30)]
)
@pytest.mark.parametrize("shape", ["random", "bursty"])
def test_decisions_equal_the_reference_meter(
    backend: Any, group: str, rate: str, burst: int | None, shape: str
) -> None:
    rng = random.Random(f"{rate}-{burst}-{shape}")
    (r,) = parse(rate)
    interval_us = r.seconds * gcra.MICROS / r.count
    make = random_trace if shape == "random" else bursty_trace
    trace = make(rng, interval_us, 150)
    admitted = compare(group, rate, burst, trace)
    assert 0 < admitted < sum(count for _, count in trace)  # the trace reaches the limit


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    count=st.integers(1, 10**9),
    period=st.sampled_from([1, 7, 60, 86400]),
    burst=st.integers(1, 1000),
    gaps=st.lists(st.integers(-(10**6), 10**7), min_size=1, max_size=12),
)
def test_any_rate_and_burst_equal_the_reference_meter(
    backend: Any, group: str, count: int, period: int, burst: int, gaps: list[int]
) -> None:
    """Counts up to a billion, bursts up to a thousand: the Redis script's arithmetic on
    (microseconds, ticks) pairs and the other backends' integers stay exact."""
    burst = min(burst, count * 366 * 86400 // period)  # drains within the longest period
    trace, now = [], T0_US
    for gap in gaps:
        now += gap
        trace += [(now, True)] * 3
    compare(f"{group}-{next(EXAMPLES)}", f"{count}/{period}s", burst, trace)


# -- the bucket on every backend -------------------------------------------------------------


def test_refused_requests_do_not_fill_the_bucket(backend: Any, group: str) -> None:
    with frozen_clock(T0) as clock:
        assert [meter(group, "192.0.2.2", "1/s", 2).limited for _ in range(3)] == [
            False,
            False,
            True,
        ]
        for _ in range(50):  # hammering a full bucket
            clock.advance(0.01)
            refused = meter(group, "192.0.2.2", "1/s", 2)
            assert refused.limited
        assert refused.meter.level == pytest.approx(1.5)
        clock.advance(0.5)  # exactly one interval after the bucket was full
        assert not meter(group, "192.0.2.2", "1/s", 2).limited
        assert meter(group, "192.0.2.2", "1/s", 2).limited


def test_a_look_counts_nothing(backend: Any, group: str) -> None:
    with frozen_clock(T0):
        for _ in range(5):
            assert not meter(group, "192.0.2.3", "2/m", None, count=False).limited
        meter(group, "192.0.2.3", "2/m", None)
        meter(group, "192.0.2.3", "2/m", None)
        look = meter(group, "192.0.2.3", "2/m", None, count=False)
    assert look.limited
    assert look.meter.level == 2
    assert look.meter.retry_after == 30


def test_usage_dict(backend: Any, group: str) -> None:
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.4")
    kwargs: dict[str, Any] = {"key": "ip", "rate": "6/m", "algorithm": LEAKY, "burst": 3}
    with frozen_clock(T0) as clock:
        first = get_usage(request, group, increment=True, **kwargs)
        assert first == {
            "count": 1,
            "limit": 3,
            "should_limit": False,
            "time_left": 10,
            "remaining": 2,
            "reset": 10,
            "retry_after": 0,
            "rate": "6/m",
            "rates": [
                {
                    "rate": "6/m",
                    "window": 60,
                    "count": 1,
                    "limit": 3,
                    "remaining": 2,
                    "reset": 10,
                    "should_limit": False,
                }
            ],
            "algorithm": LEAKY,
            "level": 1.0,
            "capacity": 3,
        }
        get_usage(request, group, increment=True, **kwargs)
        get_usage(request, group, increment=True, **kwargs)
        clock.advance(2.5)
        over = get_usage(request, group, increment=True, **kwargs)
    assert over is not None
    assert over["should_limit"]
    assert (over["level"], over["count"], over["remaining"]) == (2.75, 3, 0)
    assert over["retry_after"] == 8  # 7.5 s until the level is down to 2: rounded up
    assert over["reset"] == over["time_left"] == 28  # 27.5 s until empty


def test_the_docs_example(backend: Any, group: str) -> None:
    """docs/ratelimit.rst's leaky-bucket dict: two requests at once, a third 2 s later."""
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.14")
    kwargs: dict[str, Any] = {"key": "ip", "rate": "6/m", "algorithm": LEAKY, "burst": 3}
    with frozen_clock(T0) as clock:
        get_usage(request, group, increment=True, **kwargs)
        get_usage(request, group, increment=True, **kwargs)
        clock.advance(2)
        usage = get_usage(request, group, increment=True, **kwargs)
        assert is_ratelimited(request, group, **kwargs)  # a look: no room for one more
    assert usage == {
        "count": 3,
        "limit": 3,
        "should_limit": False,
        "time_left": 28,
        "remaining": 0,
        "reset": 28,
        "retry_after": 0,
        "rate": "6/m",
        "rates": [
            {
                "rate": "6/m",
                "window": 60,
                "count": 3,
                "limit": 3,
                "remaining": 0,
                "reset": 28,
                "should_limit": False,
            }
        ],
        "algorithm": LEAKY,
        "level": 2.8,
        "capacity": 3,
    }


def test_a_count_of_zero_refuses_everything(backend: Any, group: str) -> None:
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.5")
    usage = get_usage(request, group, key="ip", rate="0/m", algorithm=LEAKY, increment=True)
    assert usage is not None
    assert usage["should_limit"]
    assert usage["retry_after"] == 60
    assert usage["capacity"] == 0


def test_sliding_window_and_leaky_bucket_keys_never_collide(backend: Any, group: str) -> None:
    rate = parse("2/m")
    with frozen_clock(T0):
        for _ in range(2):
            assert not check(group, ("ip", "192.0.2.6"), rate, True).limited
        assert check(group, ("ip", "192.0.2.6"), rate, True).limited
        # Same group, key, subject and rate: the bucket is its own.
        assert [meter(group, "192.0.2.6", "2/m", None).limited for _ in range(3)] == [
            False,
            False,
            True,
        ]
        assert check(group, ("ip", "192.0.2.6"), rate, False).usages[0].count == 2


def test_a_corrupt_tat_is_an_error_not_an_empty_bucket(backend_kind: str, group: str) -> None:
    backend: Any = get_backend()
    ns = namespace(group, "ip", "192.0.2.7")
    key = backend.rl_prefix + ns + gcra.SUFFIX
    if backend_kind == "redis":
        backend.client.set(backend.cache_prefix + key, b"not-a-time")
    else:
        caches["rl"].set(key, "not-a-time", 60)
    with pytest.raises(BackendError, match="not a leaky-bucket TAT"):
        meter(group, "192.0.2.7", "5/m", None)
    reset_backends()  # the circuit breaker marked the server down


def test_the_tat_expires_when_the_bucket_is_empty(backend_kind: str, group: str) -> None:
    backend: Any = get_backend()
    with frozen_clock(T0):
        for _ in range(3):
            meter(group, "192.0.2.8", "6/m", 3)  # empty 30 s from now
    key = backend.cache_prefix + backend.rl_prefix + namespace(group, "ip", "192.0.2.8")
    key += gcra.SUFFIX
    if backend_kind == "redis":
        ttl = backend.client.pttl(key) / 1000
    elif backend_kind == "memcached":
        reply = backend.nodes[0].client.raw_command(b"mg " + key.encode() + b" t", b"\r\n")
        ttl = int(reply.split(b" t")[-1])
    else:
        ttl = caches["rl"]._expire_info[key] - time.time()  # type: ignore[attr-defined]
    assert 30 <= ttl <= 30 + gcra.TTL_MARGIN + 0.01


def test_take_back_only_the_request_that_is_still_last(backend: Any, group: str) -> None:
    """A request refused by another rule is taken back only if no other request moved the
    TAT since: the second one's admission depends on the first's (never lenient)."""
    m = gcra.meter(parse("1/m"), 10)
    ns = namespace(group, "ip", "192.0.2.9")
    first, second = backend.meter_many([MeterOp(ns, m, True), MeterOp(ns, m, True)], T0_US)
    assert first.written is not None and second.written == gcra.advance(m, first.written, T0_US)
    backend.meter_many([MeterOp(ns, m, take_back=first)], T0_US)  # not the last: stays
    (look,) = backend.meter_many([MeterOp(ns, m)], T0_US)
    assert look.read == second.written
    backend.meter_many([MeterOp(ns, m, take_back=second)], T0_US)  # the last: taken back
    (look,) = backend.meter_many([MeterOp(ns, m)], T0_US)
    assert look.read == first.written
    backend.meter_many([MeterOp(ns, m, take_back=second)], T0_US)  # twice: no effect
    (look,) = backend.meter_many([MeterOp(ns, m)], T0_US)
    assert look.read == first.written


def test_a_cost_is_that_many_emissions(backend: Any, group: str) -> None:
    """A bucket of capacity 5 at 1 a minute: a request of cost 3 fits an empty bucket, a
    second one does not (3 + 3 > 5), one of cost 2 does (5); taking that one back leaves
    the first. A cost over the capacity never fits and stores nothing, even in an empty
    bucket; a look of cost 3 is limited where one of cost 2 would fit."""
    m = gcra.meter(parse("1/m"), 5)
    ns, empty = namespace(group, "ip", "192.0.2.11"), namespace(group, "ip", "192.0.2.12")
    three, again, two = backend.meter_many(
        [MeterOp(ns, m, True, cost=3), MeterOp(ns, m, True, cost=3), MeterOp(ns, m, True, cost=2)],
        T0_US,
    )
    assert three.written == gcra.advance(m, None, T0_US, 3)
    assert again.written is None and again.read == three.written
    assert two.written == gcra.advance(m, three.written, T0_US, 2)
    assert gcra.state(m, two.written, T0_US, True, False).level == 5
    backend.meter_many([MeterOp(ns, m, take_back=two, cost=2)], T0_US)
    (look,) = backend.meter_many([MeterOp(ns, m, cost=3)], T0_US)
    assert look.read == three.written and look.written is None
    assert gcra.outcome(m, look.read, None, T0_US, False, 3).limited
    assert not gcra.outcome(m, look.read, None, T0_US, False, 2).limited
    (over,) = backend.meter_many([MeterOp(empty, m, True, cost=6)], T0_US)
    assert over == (None, None, None)
    (look,) = backend.meter_many([MeterOp(empty, m)], T0_US)
    assert look.read is None


def test_the_largest_cost_is_exact(backend: Any, group: str) -> None:
    """A cost of 10**9 (the largest) in a bucket of that capacity: 10**9 emissions, the
    TAT a day ahead, computed exactly (Redis's script in doubles, below 2**53)."""
    m = gcra.meter(parse("1000000000/d"))
    ns = namespace(group, "ip", "192.0.2.14")
    big = m.capacity
    (first,) = backend.meter_many([MeterOp(ns, m, True, cost=big)], T0_US)
    assert first.written == gcra.advance(m, None, T0_US, big) == m.ticks(T0_US) + big * m.interval
    (second,) = backend.meter_many([MeterOp(ns, m, True, cost=1)], T0_US + 1)
    assert second.written is None and second.read == first.written
    (over,) = backend.meter_many([MeterOp(ns, m, True, cost=big + 1)], T0_US + 86_400_000_000)
    assert over.written is None


def test_a_forced_charge_passes_the_capacity(backend: Any, group: str) -> None:
    """A charge after the view (``force``) adds its cost whether it fits or not: the level
    goes past the capacity, and the next request waits until it has drained."""
    m = gcra.meter(parse("1/m"), 5)
    ns = namespace(group, "ip", "192.0.2.13")
    (first,) = backend.meter_many([MeterOp(ns, m, True, cost=4)], T0_US)
    (charged,) = backend.meter_many([MeterOp(ns, m, True, None, 9, True)], T0_US)
    assert charged.read == first.written
    assert charged.written == gcra.advance(m, first.written, T0_US, 9)
    assert gcra.state(m, charged.written, T0_US, False, True).level == 13
    (refused,) = backend.meter_many([MeterOp(ns, m, True)], T0_US)
    assert refused.written is None and refused.read == charged.written


def test_threads_never_admit_more_than_the_capacity(backend: Any, group: str) -> None:
    start = threading.Barrier(8)

    def worker(_: int) -> int:
        start.wait()
        return sum(not meter(group, "192.0.2.10", "20/h", 20).limited for _ in range(10))

    with ThreadPoolExecutor(8) as pool:
        admitted = sum(pool.map(worker, range(8)))
    assert admitted == 20  # 80 tries, a capacity of 20, one leaking out every 3 minutes


def _process_worker(args: tuple[str, str]) -> int:
    group, ip = args
    reset_backends()  # never share a parent's sockets after fork
    start = threading.Barrier(8)

    def worker(_: int) -> int:
        start.wait()
        return sum(not meter(group, ip, "20/h", 20).limited for _ in range(10))

    with ThreadPoolExecutor(8) as pool:
        return sum(pool.map(worker, range(8)))


@pytest.mark.parametrize("kind", ["memcached", "redis"])
def test_processes_and_threads_never_admit_more_than_the_capacity(
    kind: str, request: Any, group: str
) -> None:
    from tests.ratelimit.conftest import cache_config

    config = cache_config(kind, request)
    with override_settings(CACHES={"default": config, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        context = multiprocessing.get_context("fork")
        with context.Pool(4) as pool:
            admitted = pool.map(_process_worker, [(group, "192.0.2.11")] * 4)
    reset_backends()
    # 4 processes x 8 threads x 10 tries against a capacity of 20: exactly the capacity.
    assert sum(admitted) == 20


def test_memcached_refuses_a_check_that_keeps_losing_the_race(
    memcached_server: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another client changes the item before every store: after CAS_ATTEMPTS rounds the
    check is refused (the safe side), although the bucket is empty."""
    from ratelimit_app.backends import memcached

    config = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": memcached_server,
    }
    with override_settings(CACHES={"default": config, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        backend: Any = get_backend()
        m = gcra.meter(parse("5/m"))
        ns = namespace(group, "ip", "192.0.2.15")
        key = (backend.cache_prefix + backend.rl_prefix + ns + gcra.SUFFIX).encode()
        empty = gcra.encode(m, m.ticks(T0_US - gcra.MICROS))  # a second ago: empty
        stores = []
        original = backend._meta

        def meta(node: Any, command: bytes, count: int) -> Any:
            if command.startswith(b"ms "):  # the competitor writes first
                stores.append(command)
                node.client.set(key, empty, expire=60, noreply=False)
            return original(node, command, count)

        monkeypatch.setattr(backend, "_meta", meta)
        (reply,) = backend.meter_many([MeterOp(ns, m, True)], T0_US)
        assert len(stores) == memcached.CAS_ATTEMPTS
        assert reply.written is None  # refused
        assert reply.read == gcra.decode(m, empty)
        state = gcra.outcome(m, reply.read, reply.written, T0_US, True)
        assert state.limited and state.remaining == 5
        assert backend.nodes[0].client.get(key) == empty  # nothing of ours was stored
        monkeypatch.setattr(backend, "_meta", original)
        (reply,) = backend.meter_many([MeterOp(ns, m, True)], T0_US)  # no competitor
        assert reply.written == gcra.advance(m, reply.read, T0_US)
    reset_backends()


def test_buckets_move_when_a_memcached_node_fails(two_memcached: list[Any], group: str) -> None:
    first, second = two_memcached
    with several_memcached(first, second.address):
        reset_backends()
        backend: Any = get_backend()
        ips = [f"192.0.2.{n}" for n in range(100, 140)]
        homes = {ip: backend._node(namespace(group, "ip", ip)) for ip in ips}
        assert set(homes.values()) == set(backend.nodes)  # spread over both
        with frozen_clock(T0):
            assert not any(meter(group, ip, "1/m", 1).limited for ip in ips)
            assert all(meter(group, ip, "1/m", 1).limited for ip in ips)
            second.stop()
            # The second node's subjects move to the first and start from an empty bucket
            # (availability over accuracy, as for the windows); nobody sees an error.
            moved = [meter(group, ip, "1/m", 1) for ip in ips]
    reset_backends()
    lost = [ip for ip in ips if homes[ip].name == second.address]
    assert lost
    assert [not r.limited for r in moved] == [ip in lost for ip in ips]


def test_redis_sends_both_algorithms_in_one_round_trip(
    redis_server: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server}
    with override_settings(CACHES={"default": config, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        backend: Any = get_backend()
        round_trips: list[int] = []
        original = backend._call_many

        def call_many(packed: bytes, count: int) -> Any:
            round_trips.append(count)
            return original(packed, count)

        monkeypatch.setattr(backend, "_call_many", call_many)
        backend.client.script_flush()  # the first call finds the meter's script missing
        ns = namespace(group, "ip", "192.0.2.12")
        m = gcra.meter(parse("10/s"))
        rates = parse("5/m;100/d")
        ops = [Op(ns, windows.plan(rates, T0), True)]
        for n in range(2):  # the second time, the scripts are loaded
            values, replies = backend.exchange(ops, [MeterOp(ns, m, True)], T0_US)
            assert replies[0].written == gcra.advance(m, replies[0].read, T0_US)
            # The meter's script ran again after NOSCRIPT; each hit was counted once.
            usages = windows.evaluate(ops[0].plan, values[0], T0, counted=True)
            assert [u.count for u in usages] == [n + 1, n + 1]
        assert replies[0].read == gcra.advance(m, None, T0_US)
        # Both algorithms in one write each time; the script the server lacked ran again
        # alone, loaded by EVAL at once (its NOSCRIPT said EVALSHA would fail again).
        assert round_trips == [13, 1, 13]
    reset_backends()


# -- the decorator ---------------------------------------------------------------------------


def test_the_decorator_with_the_middleware(backend_kind: str, client: Client) -> None:
    with frozen_clock(T0) as clock:
        assert [client.get("/metered/").status_code for _ in range(4)] == [200, 200, 200, 429]
        refused = client.get("/metered/")
        assert refused["Retry-After"] == "10"
        assert refused["RateLimit"] == '"6/m";r=0;t=10'
        assert refused["RateLimit-Policy"] == '"6/m";q=3;w=60'
        clock.advance(10)
        assert client.get("/metered/").status_code == 200


async def test_the_decorator_on_an_async_view(backend_kind: str, async_client: Any) -> None:
    with frozen_clock(T0):
        codes = [(await async_client.get("/metered-async/")).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"algorithm": "leaky"}, "Unknown algorithm 'leaky'"),
        ({"algorithm": LEAKY, "burst": 0}, "Burst 0"),
        ({"algorithm": LEAKY, "burst": "5"}, "Burst '5'"),
        ({"burst": 5}, "a burst is the capacity of a leaky bucket"),
        ({"algorithm": LEAKY, "rate": "5/m;10/d"}, "one leak rate"),
        ({"algorithm": LEAKY, "rate": "1/d", "burst": 1000}, "longer than 366 days"),
    ],
)
def test_a_bad_algorithm_or_burst_is_e010_and_raises(kwargs: dict[str, Any], problem: str) -> None:
    before = dict(registry)
    try:
        kwargs = {"key": "ip", "rate": "5/m", **kwargs}

        @ratelimit(**kwargs)
        def bad(request: HttpRequest) -> HttpResponse:
            return HttpResponse("ok")

        errors = [m for m in checks.check_decorators() if m.id == "ratelimit_app.E010"]
        assert [e for e in errors if "bad" in e.msg and problem in e.msg]
        with pytest.raises(ImproperlyConfigured, match=problem):
            bad(RequestFactory().get("/"))
    finally:
        registry.clear()
        registry.update(before)


def test_a_callable_rate_is_validated_when_called(backend: Any, group: str) -> None:
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.13")
    with pytest.raises(ImproperlyConfigured, match="one leak rate"):
        get_usage(request, group, key="ip", rate=lambda g, r: "5/m;10/d", algorithm=LEAKY)
    usage = get_usage(request, group, key="ip", rate=lambda g, r: (5, 60), algorithm=LEAKY)
    assert usage is not None
    assert usage["capacity"] == 5


# -- rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "problem"),
    [
        ({"algorithm": "leaky"}, "algorithm", "'sliding_window' (default) or 'leaky_bucket'"),
        ({"burst": 0}, "burst", "an integer from 1"),
        ({"burst": True}, "burst", "an integer from 1"),
        ({"algorithm": "sliding_window"}, "burst", "a burst is the capacity of a leaky"),
        ({"rate": "5/m;10/d", "burst": None}, "rate", "one leak rate"),
        ({"rate": "1/d", "burst": 400}, "burst", "longer than 366 days"),
    ],
)
def test_rule_errors_name_the_rule_and_the_field(
    fields: dict[str, Any], field: str, problem: str
) -> None:
    raw = {k: v for k, v in {**bucket("api-bucket"), **fields}.items() if v is not None}
    with pytest.raises(RuleError) as caught:
        parse_rule(raw)
    assert (caught.value.rule, caught.value.field) == ("api-bucket", field)
    assert problem in str(caught.value)


def test_a_rule_parses_and_describes_itself() -> None:
    rule = parse_rule(bucket("api-bucket"))
    assert (rule.algorithm, rule.burst) == (LEAKY, 3)
    described = rule.describe()
    assert (described["algorithm"], described["burst"]) == (LEAKY, 3)
    default = parse_rule({k: v for k, v in bucket("b").items() if k != "burst"})
    assert default.burst is None
    plain_rule = parse_rule({"name": "p", "path": "/", "key": "ip", "rate": "5/m"})
    assert plain_rule.algorithm == gcra.SLIDING_WINDOW
    assert "algorithm" not in plain_rule.describe()


def test_a_rule_answers_429_with_the_headers(backend_kind: str, client: Client) -> None:
    with rules(bucket("api")), frozen_clock(T0) as clock:
        first = client.get("/api/")
        assert first.status_code == 200
        assert first["RateLimit-Policy"] == '"api:6/m";q=3;w=60'
        assert first["RateLimit"] == '"api:6/m";r=2;t=10'  # empty in 10 s
        client.get("/api/")
        third = client.get("/api/")
        assert third["RateLimit"] == '"api:6/m";r=0;t=30'
        clock.advance(4)
        refused = client.get("/api/")
        assert refused.status_code == 429
        assert refused["Retry-After"] == "6"  # one request fits again in 6 s
        assert refused["RateLimit"] == '"api:6/m";r=0;t=6'
        clock.advance(5.999)
        assert client.get("/api/").status_code == 429
        clock.advance(0.001)
        assert client.get("/api/").status_code == 200


def test_a_request_refused_by_another_rule_does_not_fill_the_bucket(
    backend_kind: str, client: Client
) -> None:
    window = {"name": "window", "path": "/api/", "key": "ip", "rate": "1/m"}
    with rules(bucket("api"), window), frozen_clock(T0):
        assert [client.get("/api/").status_code for _ in range(3)] == [200, 429, 429]
        usage = core.lookup("api", "127.0.0.1")
    assert usage is not None
    assert usage["level"] == 1  # the two refused requests were taken back from the bucket


def test_rules_of_both_algorithms_in_one_exchange(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = {"name": "window", "path": "/api/", "key": "ip", "rate": "10/m;100/d"}
    with rules(bucket("api"), bucket("api-2", key="device"), window), frozen_clock(T0):
        backend: Any = get_backend()  # settings changed: built again
        calls: list[tuple[int, int]] = []
        original = backend.execute

        def execute(ops: Any, now_us: int) -> Any:
            meters = sum(isinstance(op, MeterOp) for op in ops)
            calls.append((len(ops) - meters, meters))
            return original(ops, now_us)

        monkeypatch.setattr(backend, "execute", execute)
        assert client.get("/api/").status_code == 200
    assert calls == [(1, 2)]


def test_failure_only_bucket(backend_kind: str, client: Client) -> None:
    rule = bucket("fail", path="/status/", rate="1/m", burst=2, count="failures")
    with rules(rule), frozen_clock(T0):
        assert [client.get("/status/200/").status_code for _ in range(5)] == [200] * 5
        assert [client.get("/status/401/").status_code for _ in range(3)] == [401, 401, 429]
        assert client.get("/status/200/").status_code == 429


async def test_an_async_request(backend_kind: str, async_client: Any) -> None:
    with rules(bucket("async", path="/async/")), frozen_clock(T0):
        codes = [(await async_client.get("/async/")).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]


# -- docs/rules' worked examples: a bucket per user id, per IP, per device type --------------


@pytest.mark.django_db
def test_seed_per_user_id(backend_kind: str) -> None:
    """One message a second per user, bursts of 3: users do not share a bucket."""
    alice, bob = Client(), Client()
    alice.force_login(User.objects.create_user("alice"))
    bob.force_login(User.objects.create_user("bob"))
    with rules(bucket("messages", key="user", rate="1/s")), frozen_clock(T0) as clock:
        assert [alice.get("/api/").status_code for _ in range(4)] == [200, 200, 200, 429]
        assert [bob.get("/api/").status_code for _ in range(3)] == [200, 200, 200]
        clock.advance(1)
        assert [alice.get("/api/").status_code for _ in range(2)] == [200, 429]


def test_seed_per_ip(backend_kind: str, client: Client) -> None:
    with rules(bucket("per-ip", rate="1/s")), frozen_clock(T0):
        first = [client.get("/api/", REMOTE_ADDR="203.0.113.1").status_code for _ in range(4)]
        other = [client.get("/api/", REMOTE_ADDR="203.0.113.2").status_code for _ in range(3)]
    assert first == [200, 200, 200, 429]
    assert other == [200, 200, 200]


def test_seed_per_device_type(backend_kind: str, client: Client) -> None:
    """Bots get a small bucket of their own; phones and desktops are not held back by them."""
    agents = {
        "bot": "curl/8.5.0",
        "mobile": "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) Mobile/15E148",
        "desktop": "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    }
    with rules(bucket("per-device", key="device", rate="1/s", burst=2)), frozen_clock(T0):
        codes = {
            device: [
                client.get(
                    "/api/", HTTP_USER_AGENT=agent, REMOTE_ADDR=f"198.51.100.{n}"
                ).status_code
                for n in range(3)  # three clients of each type share their type's bucket
            ]
            for device, agent in agents.items()
        }
    assert codes == {device: [200, 200, 429] for device in agents}


# -- lookup, reset and the commands ----------------------------------------------------------


def test_lookup_and_reset_a_rule(backend_kind: str, client: Client) -> None:
    with rules(bucket("api")), frozen_clock(T0) as clock:
        for _ in range(3):
            client.get("/api/")
        clock.advance(5)
        usage = core.lookup("api", "127.0.0.1")
        assert usage is not None
        assert (usage["level"], usage["capacity"], usage["reset"]) == (2.5, 3, 25)
        assert usage["algorithm"] == LEAKY
        assert (usage["should_limit"], usage["retry_after"]) == (True, 5)
        clock.advance(7)
        usage = core.lookup("api", "127.0.0.1")
        assert usage is not None
        assert (usage["level"], usage["remaining"], usage["reset"]) == (1.8, 1, 18)
        assert not usage["should_limit"]
        assert core.reset("api", "127.0.0.1")
        usage = core.lookup("api", "127.0.0.1")
        assert usage is not None
        assert (usage["level"], usage["remaining"]) == (0, 3)


def test_lookup_and_reset_a_decorator_group(backend_kind: str, client: Client) -> None:
    group = f"{__name__}.metered"
    args: dict[str, Any] = {"key": "ip", "rate": "6/m", "algorithm": LEAKY, "burst": 3}
    with frozen_clock(T0):
        for _ in range(3):
            client.get("/metered/")
        usage = core.lookup(group, "127.0.0.1", **args)
        assert usage is not None
        assert (usage["level"], usage["should_limit"]) == (3, True)
        assert core.reset(group, "127.0.0.1", **args)
        assert client.get("/metered/").status_code == 200


def test_ratelimit_usage_command(backend_kind: str, client: Client) -> None:
    with rules(bucket("api")), frozen_clock(T0) as clock:
        for _ in range(4):
            client.get("/api/")
        clock.advance(2)
        out = io.StringIO()
        call_command("ratelimit_usage", "api", "127.0.0.1", stdout=out)
        lines = out.getvalue().splitlines()
        assert lines[1].split() == [
            "rate",
            "level",
            "capacity",
            "remaining",
            "empty",
            "in",
            "(s)",
            "state",
        ]
        assert lines[2].split() == ["6/m", "2.80", "3", "0", "28", "limited"]
        assert "the next request is admitted in 8 s" in lines[3]
        out = io.StringIO()
        call_command("ratelimit_usage", "api", "127.0.0.1", "--json", stdout=out)
        assert json.loads(out.getvalue())["level"] == 2.8


def test_ratelimit_usage_and_reset_commands_for_a_group(backend_kind: str, client: Client) -> None:
    group = f"{__name__}.metered"
    options = ["--key", "ip", "--rate", "6/m", "--algorithm", LEAKY, "--burst", "3"]
    with frozen_clock(T0):
        client.get("/metered/")
        out = io.StringIO()
        call_command("ratelimit_usage", group, "127.0.0.1", *options, stdout=out)
        assert out.getvalue().splitlines()[2].split() == ["6/m", "1.00", "3", "2", "10", "ok"]
        call_command("ratelimit_reset", group, "127.0.0.1", *options, stdout=io.StringIO())
        out = io.StringIO()
        call_command("ratelimit_usage", group, "127.0.0.1", *options, "--json", stdout=out)
        assert json.loads(out.getvalue())["level"] == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--algorithm", LEAKY], "--algorithm and --burst are for a @ratelimit group"),
        (["--key", "ip", "--rate", "5/m", "--burst", "3"], "--burst is for --algorithm"),
        (["--key", "ip", "--rate", "5/m;1/d", "--algorithm", LEAKY], "one leak rate"),
    ],
)
def test_command_errors(options: list[str], message: str) -> None:
    from django.core.management.base import CommandError

    with rules(bucket("api")), pytest.raises(CommandError, match=message):
        call_command("ratelimit_usage", "api", "127.0.0.1", *options, stdout=io.StringIO())


def test_execute_answers_ops_of_both_kinds_in_their_order(backend: Any, group: str) -> None:
    """``Backend.execute``, the engine's one call per round trip: windows and meters mixed
    in any order, each answered in its place (values for a window, a ``MeterReply`` for a
    meter); anything else is refused before a command is sent."""
    m, rates = gcra.meter(parse("10/s")), parse("5/m")
    a, b = namespace(group, "ip", "192.0.2.30"), namespace(group, "ip", "192.0.2.31")
    plan = windows.plan(rates, T0)
    ops: list[Any] = [MeterOp(a, m, True), Op(a, plan, True), MeterOp(b, m, True), Op(b, plan)]
    first = backend.execute(ops, T0_US)
    assert [type(r).__name__ for r in first] == ["MeterReply", "list", "MeterReply", "list"]
    assert windows.evaluate(plan, first[1], T0, counted=True)[0].count == 1  # a counted
    assert first[3] == [0] * len(plan.reads)  # b only looked
    assert first[0].read is None and first[0].written == gcra.advance(m, None, T0_US)
    with pytest.raises(TypeError, match="not an operation"):
        backend.execute([Op(a, plan), ("not", "an", "op")], T0_US)
