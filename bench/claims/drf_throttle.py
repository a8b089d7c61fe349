"""Django REST framework throttles: ours (``ratelimit_app.throttling``) against DRF's own.

Two measurements, in one run, on the same throwaway servers:

**Cost per request** on memcached: what ``APIView.check_throttles`` costs for a request
(DRF's entry to throttling: it makes the view's throttles and asks each), our
``UserRateThrottle`` against DRF's, interleaved as in :mod:`bench.claims.ratelimit_latency` (whose
interleaving this follows: each round times ``calls`` requests of each contender in turn, the
order alternating). Anonymous requests from distinct client addresses; every timed request
is admitted, on a **busy** subject (one that no timed request takes over its limit):

* ``10/m``: each subject holds 5 requests of the last minute;
* ``1000/d``: each holds 500 requests spread over the last day, and again with 900 (DRF's
  history: a list of as many timestamps, read, unpickled, pickled and written back whole on
  every request; its cost grows with the count, ours does not);
* ``10/m + 1000/d``: two throttles on the view, 5 requests in the last minute (ours check
  both in one round trip; DRF reads and writes two lists). No target.

Targets: our median at most :data:`TARGETS` times DRF's (docs/drf.rst says why the ``1000/d``
one is out of reach of one round trip against two).

**Concurrency**: 4 processes x 8 threads, 40 requests each (1,280), through a DRF view
against one user limited to 200 a minute, on memcached and on Redis, with our throttle and
with DRF's. DRF's reads its list, appends and writes it back without a lock, so concurrent
requests lose each other's timestamps and it admits more than 200; ours counts atomically
and admits at most 200.

Run: ``python -m bench.claims.drf_throttle [--rounds 20 --calls 300]``.
"""

from __future__ import annotations

import multiprocessing
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

from bench.claims import ratelimit_latency as latency
from bench.claims.ratelimit_latency import Contender, caches_for, requests
from bench.common import (
    Servers,
    configure_django,
    machine,
    quantile,
    table,
    throwaway_servers,
    timing_parser,
)

#: Targets: our median cost / DRF's, per case (None: no target).
TARGETS: dict[str, float | None] = {
    "10/m": 0.8,
    "1000/d, 500 held": 0.3,
    "1000/d, 900 held": 0.3,
    "10/m + 1000/d": None,
}
#: Per case: the rates of the view's throttles, requests already in each subject's window
#: (spread over the last ``span`` seconds), and timed checks a subject may take at most.
CASES: dict[str, tuple[tuple[str, ...], int, int]] = {
    "10/m": (("10/m",), 5, 60),
    "1000/d, 500 held": (("1000/d",), 500, 86400),
    "1000/d, 900 held": (("1000/d",), 900, 86400),
    "10/m + 1000/d": (("10/m", "1000/d"), 5, 60),
}
#: Timed requests per subject of a case: it never reaches its limit.
HEADROOM = {"10/m": 4, "1000/d, 500 held": 90, "1000/d, 900 held": 90, "10/m + 1000/d": 4}
BACKEND = "memcached"
#: The concurrency measurement: 4 x 8 clients, 40 requests each, at 200 a minute.
PROCESSES, THREADS, TRIES, CONCURRENT_RATE = 4, 8, 40, 200


class Row(latency.Row):
    """One case: ours against DRF's (the ``peer`` columns) on :data:`BACKEND`."""

    @property
    def target(self) -> float | None:
        return TARGETS[self.case]


@dataclass
class Concurrency:
    """Requests admitted out of ``offered`` at a limit of ``limit``, per backend."""

    backend: str
    limit: int
    offered: int
    ours: int
    drf: int


# -- the views and their throttles -------------------------------------------------------------


def _rest_framework() -> dict[str, Any]:
    # No authentication (anonymous requests count by address) and no user model: the bench
    # runs under a minimal Django (bench.common.configure_django) as well as under pytest.
    return {
        "DEFAULT_AUTHENTICATION_CLASSES": [],
        "DEFAULT_PERMISSION_CLASSES": [],
        "UNAUTHENTICATED_USER": None,
    }


@contextmanager
def drf_settings() -> Any:
    from django.test import override_settings

    with override_settings(REST_FRAMEWORK=_rest_framework()):
        yield


def throttle_classes(side: str, case: str, rates: tuple[str, ...], alias: str) -> list[type]:
    """One ``UserRateThrottle`` subclass per rate: ours or DRF's (counting in cache
    ``alias``), each with a scope of its own."""
    from django.core.cache import caches
    from django.utils.connection import ConnectionProxy
    from rest_framework import throttling as drf

    from ratelimit_app import throttling as ours

    base = ours.UserRateThrottle if side == "ours" else drf.UserRateThrottle
    found = []
    for n, rate in enumerate(rates):
        scope = "bench-" + re.sub(r"\W+", "-", case) + f"-{n}"
        attrs: dict[str, Any] = {"rate": rate, "scope": scope}
        if side == "drf":
            # DRF counts in its class's ``cache`` (the default cache, unless set): per thread.
            attrs["cache"] = ConnectionProxy(caches, alias)
        else:
            attrs["fail_open"] = False  # a failed check is counted as failed, not admitted
        found.append(type(f"{side}-{case}-{n}", (base,), attrs))
    return found


def view_for(classes: list[type]) -> Any:
    """A DRF view with ``classes`` as its throttles, ready to check requests."""
    from rest_framework.views import APIView

    class View(APIView):
        throttle_classes = classes
        authentication_classes: list[type] = []
        permission_classes: list[type] = []

    return View()


def checker(view: Any) -> Callable[[Any], Any]:
    """``check(request)``: ``view.check_throttles`` for a Django request, as DRF's dispatch
    calls it; the outcome in the shape :mod:`bench.claims.ratelimit_latency` reads."""
    from rest_framework.exceptions import Throttled
    from rest_framework.request import Request

    from ratelimit_app.throttling import ThrottleUnavailable

    def check(request: Any) -> Any:
        wrapped = Request(request)
        view.headers = {}
        try:
            view.check_throttles(wrapped)
        except Throttled:
            return [{"limit": 1, "should_limit": True}]
        except ThrottleUnavailable:
            return [{"limit": 0, "should_limit": True}]
        return [{"limit": 1, "should_limit": False}]

    return check


# -- filling the windows -------------------------------------------------------------------


def _times(count: int, span: int, now: float) -> list[float]:
    """``count`` times spread over the last ``span`` seconds (newest a second ago)."""
    step = (span - 2) / count
    return [now - 1 - step * j for j in range(count)]


def fill(side: str, classes: list[type], pool: list[Any], count: int, span: int) -> None:
    """Put ``count`` requests of each subject of ``pool`` in the windows of ``classes``."""
    now = time.time()
    times = _times(count, span, now)
    if side == "drf":
        # DRF's own format: the list of timestamps, newest first, under its cache key.
        for cls in classes:
            throttle = cls()
            for request in pool:
                key = throttle.cache_format % {
                    "scope": throttle.scope,
                    "ident": request.META["REMOTE_ADDR"],
                }
                throttle.cache.set(key, times, throttle.duration)
        return
    from ratelimit_app import clock

    check = checker(view_for(classes))
    for t in sorted(times):
        with mock.patch.object(clock, "now", return_value=t):
            for request in pool:
                check(request)


# -- cost per request ------------------------------------------------------------------------


def run(
    rounds: int = 20, calls: int = 300, servers: Servers | None = None, cases: Any = None
) -> list[Row]:
    """Time each case on memcached (throwaway servers unless given)."""
    configure_django()
    if servers is None:
        with throwaway_servers() as started:
            return run(rounds, calls, started, cases)
    from django.test import override_settings

    rows = []
    with override_settings(CACHES=caches_for(servers)), drf_settings():
        for case in cases or CASES:
            rates, count, span = CASES[case]
            # Enough subjects that none fills up.
            pool = requests(-(-rounds * calls // HEADROOM[case]), net=12 + list(CASES).index(case))
            contenders = []
            for side in ("ours", "drf"):
                classes = throttle_classes(side, case, rates, BACKEND)
                with override_settings(RATELIMIT_USE_CACHE=BACKEND):
                    fill(side, classes, pool, count, span)
                contenders.append(Contender(side, checker(view_for(classes))))
            ours, drf = interleaved(contenders, pool, rounds, calls)
            rows.append(
                Row(
                    backend=BACKEND,
                    case=case,
                    ours_median=quantile(ours.samples, 0.5),
                    ours_p90=quantile(ours.samples, 0.9),
                    peer_median=quantile(drf.samples, 0.5),
                    peer_p90=quantile(drf.samples, 0.9),
                    samples=len(ours.samples),
                    ours_failed=ours.failures,
                    peer_failed=drf.failures,
                )
            )
    return rows


def interleaved(
    contenders: list[Contender], pool: list[Any], rounds: int, calls: int
) -> list[Contender]:
    """Time ``calls`` requests of each contender per round, in alternating order, going
    round the pool (sized so that no subject goes over its limit)."""
    from django.test import override_settings

    clock = time.perf_counter_ns
    # As bench/claims/ratelimit_latency: a stall of this shared machine is not a server outage.
    with latency.patient_sockets(), override_settings(RATELIMIT_USE_CACHE=BACKEND):
        for r in range(rounds):
            for c in contenders if r % 2 == 0 else contenders[::-1]:
                for i in range(r * calls, (r + 1) * calls):
                    request = pool[i % len(pool)]
                    start = clock()
                    [outcome] = c.check(request)
                    c.samples.append((clock() - start) / 1000)
                    c.failures += outcome["limit"] < 1 or outcome["should_limit"]
    return contenders


# -- concurrency -----------------------------------------------------------------------------


def _user(pk: int) -> Any:
    """A signed-in user as a throttle sees one: its primary key."""
    return type("BenchUser", (), {"pk": pk, "is_authenticated": True})()


def _admitted(args: tuple[str, int, int, int]) -> int:
    """One process: ``THREADS`` threads, ``tries`` requests each, started together; the
    number of requests the view admitted."""
    side, pk, threads, tries = args
    from rest_framework.test import APIRequestFactory, force_authenticate

    from ratelimit_app.backends import reset_backends

    reset_backends()  # never share a parent's sockets after fork
    [cls] = throttle_classes(side, "concurrency", (f"{CONCURRENT_RATE}/m",), "default")
    check = checker(view_for([cls]))
    factory = APIRequestFactory()
    start = threading.Barrier(threads)

    def worker(_: int) -> int:
        requests = []
        for _ in range(tries):
            request = factory.get("/bench/")
            force_authenticate(request, user=_user(pk))
            requests.append(request)
        start.wait()
        return sum(not check(r)[0]["should_limit"] for r in requests)

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(worker, range(threads)))


def concurrency(
    backend: str,
    location: str,
    processes: int = PROCESSES,
    threads: int = THREADS,
    tries: int = TRIES,
) -> Concurrency:
    """``processes`` x ``threads`` clients against one user at ``CONCURRENT_RATE`` a minute,
    with our throttle and with DRF's, on one server (``backend``: memcached or redis)."""
    configure_django()
    from django.test import override_settings

    config = caches_for(Servers(memcached=location, redis=location))[backend]
    found = {}
    pk = int(time.time() * 1000) % 10**9  # a user no earlier run counted
    with (
        override_settings(CACHES={"default": config}, RATELIMIT_USE_CACHE="default"),
        drf_settings(),
    ):
        from ratelimit_app.backends import reset_backends

        reset_backends()
        context = multiprocessing.get_context("fork")
        for side in ("ours", "drf"):
            with context.Pool(processes) as pool:
                found[side] = sum(pool.map(_admitted, [(side, pk, threads, tries)] * processes))
        reset_backends()
    return Concurrency(
        backend, CONCURRENT_RATE, processes * threads * tries, found["ours"], found["drf"]
    )


def run_concurrency(servers: Servers | None = None, **sizes: int) -> list[Concurrency]:
    """:func:`concurrency` on memcached and on Redis (throwaway servers unless given)."""
    if servers is None:
        with throwaway_servers() as started:
            return run_concurrency(started, **sizes)
    return [
        concurrency("memcached", servers.memcached, **sizes),
        concurrency("redis", servers.redis, **sizes),
    ]


# -- output --------------------------------------------------------------------------------


def render(rows: list[Row], found: list[Concurrency], rounds: int, calls: int) -> str:
    headers = [
        "case",
        "ours med us",
        "ours p90 us",
        "DRF med us",
        "DRF p90 us",
        "ours/DRF",
        "target",
        "met",
        "failed",
    ]
    body = [
        [
            r.case,
            r.ours_median,
            r.ours_p90,
            r.peer_median,
            r.peer_p90,
            *latency.verdict_cells(r),
            f"{r.ours_failed} ours, {r.peer_failed} DRF" if r.ours_failed or r.peer_failed else 0,
        ]
        for r in rows
    ]
    title = (
        f"DRF throttles: check_throttles per request on memcached, ours vs DRF's "
        f"UserRateThrottle ({rounds} interleaved rounds x {calls} requests; busy subjects)"
    )
    out = table(title, headers, body)
    if found:
        c_title = (
            f"DRF throttles under concurrency: {PROCESSES} processes x {THREADS} threads "
            f"against one user (requests admitted)"
        )
        c_headers = ["backend", "offered", "limit", "ours", "DRF's"]
        c_body = [[c.backend, c.offered, c.limit, c.ours, c.drf] for c in found]
        out += "\n\n" + table(c_title, c_headers, c_body)
    return out


def main(argv: list[str] | None = None) -> tuple[list[Row], list[Concurrency]]:
    args = timing_parser(__doc__).parse_args(argv)
    info = machine()
    print(
        f"machine: {info['cores']} cores, {info['cpu']}; Python {info['python']}; "
        f"{info['memcached']}; {info['redis']}\n"
    )
    with throwaway_servers() as servers:
        rows = run(args.rounds, args.calls, servers)
        found = run_concurrency(servers)
    print(render(rows, found, args.rounds, args.calls))
    return rows, found


if __name__ == "__main__":
    main()
