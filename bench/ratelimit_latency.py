"""Per-check latency: ratelimit_app vs django-ratelimit 4.1 on the same memcached and Redis.

Both contenders run in one process against the same throwaway servers. The machine is
expected to be noisy, so contenders are interleaved: every round times ``calls`` checks of
each contender in turn (the order alternates between rounds), and the statistics pool the
per-call timings of all rounds. Cases:

* one rate ``1000000/m`` (never limited, so every check does its full work);
* three rates on one key, ``1000000/m;1000000/h;1000000/d``, against django-ratelimit called
  three times (what three stacked decorators do);
* the same three rates with ``RATELIMIT_HIERARCHICAL = True``;
* one rate ``1/h`` that every timed check exceeds (what a flood of refused requests costs:
  ours takes a refused hit back, django-ratelimit just counts it). No target.

Before timing, every bucket our checks read is filled (by checks at earlier times, through
the real API with the clock moved back), as for a subject that has been busy for a day: the
cost of a check depends on how many of its buckets hold a value. A check that fails (the
backend raised; ``limit`` 0 in the usage) is counted in the ``failed`` column.

Run: ``python -m bench.ratelimit_latency [--rounds 20 --calls 300]``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.common import (
    Servers,
    configure_django,
    quantile,
    table,
    throwaway_servers,
    timing_parser,
)

ONE_RATE = "1000000/m"
OVER_RATE = "1/h"
THREE_RATES = ("1000000/m", "1000000/h", "1000000/d")
#: Targets: our median check / django-ratelimit's median check.
TARGETS: dict[str, float | None] = {
    "1 rate": 0.8,
    "3 rates": 0.5,
    "3 rates, hierarchical": 0.5,
    "1 rate, over the limit": None,
}
WARMUP = 5

Check = Callable[[Any], Any]


@dataclass
class Contender:
    name: str
    check: Check
    hierarchical: bool = False
    limited: bool = False  # every timed check is over the limit
    windows: tuple[int, ...] = ()  # fill every bucket of these windows before timing
    samples: list[float] = field(default_factory=list)  # microseconds per check
    failures: int = 0


@dataclass
class Row:
    backend: str
    case: str
    ours_median: float
    ours_p90: float
    peer_median: float
    peer_p90: float
    samples: int
    ours_failed: int = 0
    peer_failed: int = 0

    @property
    def ratio(self) -> float:
        return self.ours_median / self.peer_median

    @property
    def target(self) -> float | None:
        return TARGETS[self.case]

    @property
    def met(self) -> bool | None:
        """None without a target; a run with failed checks of ours never meets it."""
        if self.target is None:
            return None
        return self.ratio <= self.target and not self.ours_failed


def caches_for(servers: Servers) -> dict[str, dict[str, Any]]:
    """One cache alias per server, configured as a project would."""
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "memcached": {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": servers.memcached,
        },
        "redis": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": servers.redis},
    }


def requests(n: int) -> list[Any]:
    """``n`` GET requests from distinct client IPs."""
    from django.test import RequestFactory

    factory = RequestFactory()
    return [
        factory.get("/bench/", REMOTE_ADDR=f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}")
        for i in range(1, n + 1)
    ]


def contenders(backend: str) -> list[Contender]:
    from django_ratelimit.core import get_usage as peer_usage

    from ratelimit_app.core import get_usage as our_usage

    three = ";".join(THREE_RATES)
    g = f"bench-{backend}"

    def ours_one(request: Any) -> Any:
        return [our_usage(request, group=g + "-o1", key="ip", rate=ONE_RATE, increment=True)]

    def peer_one(request: Any) -> Any:
        return [peer_usage(request, group=g + "-p1", key="ip", rate=ONE_RATE, increment=True)]

    def ours_three(request: Any) -> Any:
        return [our_usage(request, group=g + "-o3", key="ip", rate=three, increment=True)]

    def ours_hier(request: Any) -> Any:
        return [our_usage(request, group=g + "-oh", key="ip", rate=three, increment=True)]

    def ours_over(request: Any) -> Any:
        return [our_usage(request, group=g + "-ox", key="ip", rate=OVER_RATE, increment=True)]

    def peer_over(request: Any) -> Any:
        return [peer_usage(request, group=g + "-px", key="ip", rate=OVER_RATE, increment=True)]

    def peer_three(request: Any) -> Any:
        return [
            peer_usage(request, group=g + "-p3", key="ip", rate=rate, increment=True)
            for rate in THREE_RATES
        ]

    return [
        Contender("ours 1", ours_one, windows=(60,)),
        Contender("peer 1", peer_one),
        Contender("ours 3", ours_three, windows=(60, 3600, 86400)),
        Contender("peer 3", peer_three),
        Contender("ours 3h", ours_hier, hierarchical=True, windows=(60, 3600, 86400)),
        Contender("ours over", ours_over, limited=True),
        Contender("peer over", peer_over, limited=True),
    ]


@contextmanager
def _mode(hierarchical: bool) -> Iterator[None]:
    if not hierarchical:
        yield
        return
    from django.test import override_settings

    with override_settings(RATELIMIT_HIERARCHICAL=True):
        yield


def _failed(results: Any) -> bool:
    return any(not u or u["limit"] < 1 for u in results)


def _fill(c: Contender, pool: list[Any]) -> None:
    """Check every subject at times that put a hit in every bucket its windows read."""
    from unittest import mock

    from ratelimit_app import clock

    now = time.time()
    times = {now - j for j in range(1, 62)} | {now - 60 * j for j in range(1, 62)}
    for w in c.windows:
        times |= {now - (j + 0.5) * w / 60 for j in range(61)}
        times |= {now - 3600 * j for j in range(1, w // 3600 + 1)}
    for t in sorted(times):
        with mock.patch.object(clock, "now", return_value=t):
            for request in pool:
                c.check(request)


def _validate(c: Contender, results: Any) -> None:
    """A warm-up call must be a real check with the expected outcome, not a silent failure
    (a failing backend reports ``count`` 0 and ``limit`` 0)."""
    for usage in results:
        if usage and usage["limit"] >= 1 and bool(usage["should_limit"]) != c.limited:
            raise RuntimeError(f"{c.name}: unexpected usage {usage!r}")


def time_backend(
    backend: str,
    rounds: int,
    calls: int,
    pool: list[Any],
    runners: list[Contender] | None = None,
) -> list[Contender]:
    """Interleaved rounds of every contender (default: this module's) on one cache alias;
    returns them with their samples."""
    runners = contenders(backend) if runners is None else runners
    clock = time.perf_counter_ns
    # Failed checks are counted in the table; a log line for each would drown it.
    log = logging.getLogger("ratelimit_app")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        _rounds(backend, runners, rounds, calls, pool, clock)
    finally:
        log.setLevel(level)
    return runners


def _rounds(
    backend: str,
    runners: list[Contender],
    rounds: int,
    calls: int,
    pool: list[Any],
    clock: Callable[[], int],
) -> None:
    from django.test import override_settings

    with override_settings(RATELIMIT_USE_CACHE=backend):
        for r in range(rounds):
            order = runners if r % 2 == 0 else runners[::-1]
            for c in order:
                with _mode(c.hierarchical):
                    # Settings changes rebuild our backend: connect before timing.
                    if r == 0 and c.windows:
                        _fill(c, pool)
                    if c.limited:  # put every subject over the limit (again, should
                        # django-ratelimit's fixed window have rolled over meanwhile)
                        for request in pool:
                            c.check(request)
                            c.check(request)
                    for i in range(WARMUP):
                        _validate(c, c.check(pool[i % len(pool)]))
                    check, samples = c.check, c.samples
                    offset = r * calls
                    failures = 0
                    for i in range(calls):
                        request = pool[(offset + i) % len(pool)]
                        start = clock()
                        results = check(request)
                        samples.append((clock() - start) / 1000)
                        failures += _failed(results)
                    c.failures += failures


def time_backends(
    rounds: int,
    calls: int,
    ips: int,
    servers: Servers | None,
    make: Callable[[str], list[Contender]],
) -> dict[str, dict[str, Contender]]:
    """Interleaved rounds of the contenders ``make(backend)`` returns, on memcached and then
    Redis (throwaway servers unless given); the contenders by backend and name."""
    configure_django()
    if servers is None:
        with throwaway_servers() as started:
            return time_backends(rounds, calls, ips, started, make)
    from django.test import override_settings

    pool = requests(ips)
    with override_settings(CACHES=caches_for(servers)):
        return {
            backend: {c.name: c for c in time_backend(backend, rounds, calls, pool, make(backend))}
            for backend in ("memcached", "redis")
        }


def run(
    rounds: int = 20, calls: int = 300, ips: int = 100, servers: Servers | None = None
) -> list[Row]:
    """Time every case on memcached and Redis; start throwaway servers unless given."""
    rows = []
    for backend, by_name in time_backends(rounds, calls, ips, servers, contenders).items():
        for case, ours, peer in (
            ("1 rate", "ours 1", "peer 1"),
            ("3 rates", "ours 3", "peer 3"),
            ("3 rates, hierarchical", "ours 3h", "peer 3"),
            ("1 rate, over the limit", "ours over", "peer over"),
        ):
            o, p = by_name[ours].samples, by_name[peer].samples
            rows.append(
                Row(
                    backend=backend,
                    case=case,
                    ours_median=quantile(o, 0.5),
                    ours_p90=quantile(o, 0.9),
                    peer_median=quantile(p, 0.5),
                    peer_p90=quantile(p, 0.9),
                    samples=len(o),
                    ours_failed=by_name[ours].failures,
                    peer_failed=by_name[peer].failures,
                )
            )
    return rows


def render(rows: list[Row], rounds: int, calls: int) -> str:
    headers = [
        "backend",
        "case",
        "ours med us",
        "ours p90 us",
        "django-rl med us",
        "django-rl p90 us",
        "ours/peer",
        "target",
        "met",
        "failed",
    ]
    body = [
        [
            r.backend,
            r.case,
            r.ours_median,
            r.ours_p90,
            r.peer_median,
            r.peer_p90,
            f"{r.ratio:.2f}x",
            "-" if r.target is None else f"<= {r.target}x",
            {None: "-", True: "yes", False: "NO"}[r.met],
            f"{r.ours_failed}/{r.samples} ours, {r.peer_failed} peer"
            if r.ours_failed or r.peer_failed
            else "0",
        ]
        for r in rows
    ]
    title = (
        f"Per-check latency vs django-ratelimit 4.1 ({rounds} interleaved rounds x {calls} "
        "checks; 3 rates = 3 stacked django-ratelimit checks)"
    )
    return table(title, headers, body)


def main(argv: list[str] | None = None) -> list[Row]:
    args = timing_parser(__doc__).parse_args(argv)
    rows = run(args.rounds, args.calls, args.ips)
    print(render(rows, args.rounds, args.calls))
    return rows


if __name__ == "__main__":
    main()
