"""An async check against the same check made inline: what an async view's limit costs.

Before the async path, an async view's check ran on the event loop as a blocking call (the
sync check, *inline*): no slower for the one request, but every other request on the loop
waited for its round trip (``tests/reliability/test_async_loop.py`` measures that). Now it
is *awaited* (:func:`ratelimit_app.core.aget_usage`, the engine's
:func:`~ratelimit_app.engine.trips.arun`). Target: with the server on loopback (no added
delay), the awaited check's median at most 1.0x the inline check's, on memcached and Redis.

Both run on one long-lived event loop in one process against the same throwaway servers,
interleaved (every round times ``calls`` checks of each, the order alternating between
rounds), one rate ``1000000/m`` (never limited: every check does its full work), on a
**busy** subject (the same client every check) and a **quiet** one (every check a new
client's first).

Run: ``python -m bench.claims.async_check [--rounds 20 --calls 300]``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bench.common import (
    Servers,
    configure_django,
    machine,
    quantile,
    table,
    throwaway_servers,
    timing_parser,
)

RATE = "1000000/m"
#: Target: the awaited check's median / the inline check's median.
TARGET = 1.0
WARMUP = 20


@dataclass
class Timed:
    """One contender's samples (microseconds per check)."""

    name: str
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return quantile(self.samples, 0.5)


@dataclass
class Row:
    backend: str
    subject: str
    inline: Timed
    awaited: Timed

    @property
    def ratio(self) -> float:
        return self.awaited.median / self.inline.median


def _settings(backend: str, servers: Servers) -> dict[str, Any]:
    if backend == "memcached":
        config = {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": servers.memcached,
        }
    else:
        config = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": servers.redis}
    return {"CACHES": {"default": config, "rl": config}, "RATELIMIT_USE_CACHE": "rl"}


def _requests(quiet: bool) -> Callable[[], Any]:
    """A request per check: the same client's (busy), or a new client's each time."""
    from django.test import RequestFactory

    rf = RequestFactory()
    if not quiet:
        request = rf.get("/", REMOTE_ADDR="192.0.2.1")
        return lambda: request
    n = itertools.count(1)
    return lambda: rf.get("/", REMOTE_ADDR="10.{}.{}.{}".format(*divmod_3(next(n))))


def divmod_3(n: int) -> tuple[int, int, int]:
    return (n >> 16) & 255, (n >> 8) & 255, n & 255


async def _time(
    check: Callable[[Any], Awaitable[Any]], make: Callable[[], Any], calls: int, into: list[float]
) -> None:
    for _ in range(calls):
        request = make()
        start = time.perf_counter()
        usage = await check(request)
        into.append((time.perf_counter() - start) * 1e6)
        if not usage or usage["limit"] == 0:
            raise RuntimeError(f"the check failed: {usage!r}")


async def _case(backend: str, quiet: bool, rounds: int, calls: int) -> Row:
    from ratelimit_app.core import aget_usage, get_usage

    group = f"bench-async-{backend}-{'quiet' if quiet else 'busy'}"
    args = {"group": group, "key": "ip", "rate": RATE, "increment": True}

    async def inline(request: Any) -> Any:  # the sync check, blocking the loop
        return get_usage(request, **args)

    async def awaited(request: Any) -> Any:
        return await aget_usage(request, **args)

    contenders = [(Timed("inline"), inline), (Timed("awaited"), awaited)]
    make = _requests(quiet)
    for _, check in contenders:
        await _time(check, make, WARMUP, [])
    for r in range(rounds):
        for timed, check in contenders if r % 2 == 0 else contenders[::-1]:
            await _time(check, make, calls, timed.samples)
    return Row(backend, "quiet" if quiet else "busy", contenders[0][0], contenders[1][0])


def run(rounds: int = 20, calls: int = 300, servers: Servers | None = None) -> list[Row]:
    """Time both on memcached and Redis; start throwaway servers unless given."""
    configure_django()
    if servers is None:
        with throwaway_servers() as started:
            return run(rounds, calls, started)
    from django.test import override_settings

    from ratelimit_app.backends import reset_backends

    rows = []
    for backend in ("memcached", "redis"):
        with override_settings(**_settings(backend, servers)):
            reset_backends()
            loop = asyncio.new_event_loop()
            try:
                for quiet in (False, True):
                    rows.append(loop.run_until_complete(_case(backend, quiet, rounds, calls)))
            finally:
                loop.close()
                reset_backends()
    return rows


def render(rows: list[Row]) -> str:
    return table(
        "An awaited check against the same check inline (one rate, loopback, medians in µs)",
        ["backend", "subject", "inline med us", "awaited med us", "awaited p90 us", "ratio",
         "target", "met"],
        [
            [
                r.backend,
                r.subject,
                round(r.inline.median, 1),
                round(r.awaited.median, 1),
                round(quantile(r.awaited.samples, 0.9), 1),
                round(r.ratio, 2),
                TARGET,
                "yes" if r.ratio <= TARGET else "no",
            ]
            for r in rows
        ],
    )  # fmt: skip


def main(argv: list[str] | None = None) -> list[Row]:
    args = timing_parser(__doc__).parse_args(argv)
    info = machine()
    print(f"machine: {info['cores']} cores, {info['cpu']}; Python {info['python']}\n")
    rows = run(args.rounds, args.calls)
    print(render(rows))
    return rows


if __name__ == "__main__":
    main()
