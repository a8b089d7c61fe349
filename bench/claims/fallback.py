"""A check counted in memory during an outage beside the same check's round trip.

docs/operators (*Counting in memory during an outage*) says a limit with ``fallback="memory"``
costs less while its server is down than a check that reaches the server. One process, one
rate (``1000000/m``, never limited), ``get_usage(..., increment=True, fallback="memory")``
from a pool of client addresses, in interleaved rounds:

* **server up**: the check's round trip to a throwaway memcached or Redis;
* **server down**: the same check with its cache pointed at a loopback port nothing listens
  on. The first check of a round finds the server gone and marks it down; the others are
  counted in the process's memory at once (the server is skipped for ``DEAD_RETRY``
  seconds, as during a real outage), and a try every ``DEAD_RETRY`` is part of the timing.

Run: ``python -m bench.claims.fallback [--rounds 20 --calls 300 --ips 100]``.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from bench.claims.ratelimit_latency import patient_sockets, requests
from bench.common import (
    Servers,
    configure_django,
    quantile,
    table,
    throwaway_servers,
    timing_parser,
)

RATE = "1000000/m"
#: The checks of each round before timing (the connections made, the memory filled).
WARMUP = 50


@dataclass
class Side:
    name: str
    samples: list[float] = field(default_factory=list)  # microseconds per check
    failures: int = 0  # checks that neither counted on the server nor in memory


@dataclass
class Row:
    backend: str
    up_median: float
    up_p90: float
    down_median: float
    down_p90: float
    samples: int
    failed: int

    @property
    def ratio(self) -> float:
        """A check in memory over the same check's round trip (target: under 1)."""
        return self.down_median / self.up_median


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def caches(servers: Servers) -> dict[str, dict[str, Any]]:
    """An alias per server that answers, and one per kind whose server is gone."""
    dead = f"127.0.0.1:{_closed_port()}"
    memcached = "django.core.cache.backends.memcached.PyMemcacheCache"
    redis = "django_redis.cache.RedisCache"
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "memcached-up": {"BACKEND": memcached, "LOCATION": servers.memcached},
        "memcached-down": {"BACKEND": memcached, "LOCATION": dead},
        "redis-up": {"BACKEND": redis, "LOCATION": servers.redis},
        "redis-down": {"BACKEND": redis, "LOCATION": f"redis://{dead}/0"},
    }


def _round(alias: str, side: Side, calls: int, pool: list[Any], offset: int) -> None:
    from django.test import override_settings

    from ratelimit_app.core import get_usage

    def check(request: Any) -> bool:
        usage = get_usage(
            request, "bench-fallback", key="ip", rate=RATE, increment=True, fallback="memory"
        )
        return usage is not None and usage["limit"] > 0 and usage["count"] > 0

    with override_settings(RATELIMIT_USE_CACHE=alias):
        for i in range(WARMUP):
            check(pool[i % len(pool)])
        clock = time.perf_counter_ns
        for i in range(calls):
            request = pool[(offset + i) % len(pool)]
            start = clock()
            ok = check(request)
            side.samples.append((clock() - start) / 1000)
            side.failures += not ok


def run(
    rounds: int = 20, calls: int = 300, ips: int = 100, servers: Servers | None = None
) -> list[Row]:
    """Time both sides on memcached and Redis; start throwaway servers unless given."""
    configure_django()
    if servers is None:
        with throwaway_servers() as started:
            return run(rounds, calls, ips, started)
    from django.test import override_settings

    pool = requests(ips)
    rows = []
    logger = logging.getLogger("ratelimit_app")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # (the outage's warnings: one per switch and try)
    try:
        with patient_sockets(), override_settings(CACHES=caches(servers)):
            for backend in ("memcached", "redis"):
                up, down = Side("up"), Side("down")
                for r in range(rounds):
                    for side in (up, down) if r % 2 == 0 else (down, up):
                        _round(f"{backend}-{side.name}", side, calls, pool, r * calls)
                rows.append(
                    Row(
                        backend,
                        quantile(up.samples, 0.5),
                        quantile(up.samples, 0.9),
                        quantile(down.samples, 0.5),
                        quantile(down.samples, 0.9),
                        len(down.samples),
                        up.failures + down.failures,
                    )
                )
    finally:
        logger.setLevel(level)
    return rows


def render(rows: list[Row], rounds: int, calls: int) -> str:
    headers = ["backend", "up med us", "up p90 us", "down med us", "down p90 us", "down / up"]
    body = [
        [r.backend, r.up_median, r.up_p90, r.down_median, r.down_p90, f"{r.ratio:.2f}"]
        for r in rows
    ]
    text = table(
        f"A check with fallback='memory', server up vs down ({rounds} rounds x {calls} checks)",
        headers,
        body,
    )
    failed = sum(r.failed for r in rows)
    return text + (f"\n{failed} checks failed" if failed else "")


def main() -> None:
    args = timing_parser(__doc__ or "").parse_args()
    print(render(run(args.rounds, args.calls, args.ips), args.rounds, args.calls))


if __name__ == "__main__":
    main()
