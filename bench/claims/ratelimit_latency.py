"""Per-check latency: ratelimit_app vs its Django peers on the same memcached and Redis.

Every contender runs in one process against the same throwaway servers. The machine is
expected to be noisy, so contenders are interleaved: every round times ``calls`` checks of
each contender in turn (the order alternates between rounds), and the statistics pool the
per-call timings of all rounds.

The peers, each called the fastest correct way its users can call it:

* **django-ratelimit 4.1**: ``django_ratelimit.core.get_usage`` (what its decorator calls);
  a fixed window per rate, ``add`` then ``incr`` on the Django cache (one round trip for
  a new subject, two after).
* **django-smart-ratelimit 4.12**: its backend's ``check_batch`` (what its
  ``ratelimit_batch`` decorator calls, keys made by its ``generate_key``), one pipelined
  round trip for all the rates; its ``@rate_limit`` decorator reads the key's TTL in a
  second round trip, slower. Its own backends, not Django's caches: on Redis a sliding log
  (a sorted set of every hit, refused ones included), on memcached a fixed window.
* **django-fast-ratelimit 9.1**: ``get_ratelimit(..., action=Action.INCREASE)`` (what its
  ``decorate`` calls; one call per rate, as stacked decorators) on the Django cache: a fixed
  window, three round trips for a busy subject (``get`` of the window's end, ``add``,
  ``incr``), four for a new one.

Cases, against django-ratelimit (the first table, with its targets), on a **busy** subject:

* one rate ``1000000/m`` (never limited, so every check does its full work);
* three rates on one key, ``1000000/m;1000000/h;1000000/d``, against django-ratelimit called
  three times (what three stacked decorators do);
* the same three rates in the hierarchical layout (``windows.HIERARCHICAL = True``);
* one rate ``1/h`` that every timed check exceeds (what a flood of refused requests costs:
  ours takes a refused hit back, django-ratelimit just counts it). No target.

Against the fastest peer (all three timed in the same run), one rate and three rates, each
on a busy and on a **quiet** subject (every timed check is the first of its subject: a new
client). Target on Redis: our median at most :data:`PEER_TARGETS` times the fastest peer's.

Busy: before timing, every bucket our checks read is filled (by checks at earlier times,
through the real API with the clock moved back), as for a subject that has been busy for a
day: the cost of a check depends on how many of its buckets hold a value; the peers' keys
are made to exist. A check that fails (the backend raised; ``limit`` 0 in the usage) is
counted in the ``failed`` column. The socket timeout (``backends.base.SOCKET_TIMEOUT``) is 2 s
while timing: a stall of a shared machine is not a server outage (the peers' clients wait 5 s
or for ever).

Run: ``python -m bench.claims.ratelimit_latency [--rounds 20 --calls 300]``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from bench.common import (
    Servers,
    configure_django,
    machine,
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
#: Targets: our median check / the fastest peer's, per backend. On memcached ours leads
#: (below 1.0x: the row shows a regression); on Redis the target is 0.8x.
PEER_TARGETS = {"memcached": 1.0, "redis": 0.8}
#: The peers of the fastest-peer rows, by the label their columns carry.
PEERS = ("django-ratelimit", "smart-ratelimit", "fast-ratelimit")
#: The fastest-peer rows: (case, contender key, subject).
PEER_CASES = (
    ("1 rate", "1", "busy"),
    ("1 rate", "1", "quiet"),
    ("3 rates", "3", "busy"),
    ("3 rates", "3", "quiet"),
)
WARMUP = 5
#: The hits each of our checks counts (``--cost``): costs in play leave the targets as they are.
COST = 1
#: ``backends.base.SOCKET_TIMEOUT`` while timing (see :func:`patient_sockets`).
SOCKET_TIMEOUT = 2.0

Check = Callable[[Any], Any]


@dataclass
class Contender:
    name: str
    check: Check
    hierarchical: bool = False
    limited: bool = False  # every timed check is over the limit
    windows: tuple[int, ...] = ()  # fill every bucket of these windows before timing
    quiet: bool = False  # every timed check is a new subject's first
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


@dataclass
class PeerRow:
    """One case against every peer: each contender's median (microseconds), by label."""

    backend: str
    case: str
    subject: str  # "busy" or "quiet"
    ours_median: float
    peer_medians: dict[str, float]
    samples: int
    ours_failed: int = 0
    peers_failed: int = 0

    @property
    def fastest(self) -> str:
        return min(self.peer_medians, key=self.peer_medians.__getitem__)

    @property
    def ratio(self) -> float:
        return self.ours_median / self.peer_medians[self.fastest]

    @property
    def target(self) -> float:
        return PEER_TARGETS[self.backend]

    @property
    def met(self) -> bool:
        """A run with failed checks of ours never meets it."""
        return self.ratio <= self.target and not self.ours_failed


@dataclass
class Report:
    """What :func:`run` measured: the rows against django-ratelimit and the fastest-peer
    rows."""

    rows: list[Row]
    peer_rows: list[PeerRow]


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


def requests(n: int, net: int = 10) -> list[Any]:
    """``n`` GET requests from distinct client IPs (``net.*.*.*``)."""
    from django.test import RequestFactory

    factory = RequestFactory()
    return [
        factory.get("/bench/", REMOTE_ADDR=f"{net}.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}")
        for i in range(1, n + 1)
    ]


def _usage(limit: int, count: int) -> dict[str, Any]:
    """A peer's outcome in django-ratelimit's shape (what :func:`_failed` and
    :func:`_validate` read): a failed check counts nothing."""
    return {"limit": limit if count > 0 else 0, "should_limit": count > limit, "count": count}


#: django-smart-ratelimit's backends built by :func:`smart_backend`, closed when
#: :func:`smart_settings` exits (they hold sockets of their own).
_smart_opened: list[Any] = []


def smart_backend(backend: str) -> Any:
    """django-smart-ratelimit's own backend for the server of cache ``backend``, as its
    settings would build it (``RATELIMIT_BACKEND`` "redis" or "memcached"). Call inside
    :func:`smart_settings`."""
    from django.conf import settings
    from django.test import override_settings

    location = settings.CACHES[backend]["LOCATION"]
    built: Any
    if backend == "redis":
        from django_smart_ratelimit.backends.redis_backend import RedisBackend

        built = RedisBackend()
    else:
        from django_smart_ratelimit.backends.memcached import MemcachedBackend

        host, _, port = location.rpartition(":")
        # Its memcached backend reads RATELIMIT_MEMCACHED from Django's settings when built.
        with override_settings(RATELIMIT_MEMCACHED={"HOST": host, "PORT": int(port)}):
            built = MemcachedBackend()
    _smart_opened.append(built)
    return built


@contextmanager
def smart_settings(servers: Servers) -> Iterator[None]:
    """django-smart-ratelimit's settings (its Redis URL), through its own test hook: its
    setting names overlap ours (``RATELIMIT_BACKEND``, ``RATELIMIT_FAIL_OPEN``...), so they
    are not written into Django's settings. Restored, and its backends closed, on exit."""
    from django_smart_ratelimit import config

    config.configure(config.RateLimitSettings(redis_config={"url": servers.redis}))
    try:
        yield
    finally:
        config.reset_settings()
        while _smart_opened:
            built = _smart_opened.pop()
            if hasattr(built, "_pool"):  # Redis: a connection pool (shared by its class)
                built._pool.disconnect()
            else:  # memcached: one pymemcache client
                built._client.close()


def contenders(backend: str) -> list[Contender]:
    from django_fast_ratelimit import Action, get_ratelimit
    from django_ratelimit.core import get_usage as peer_usage
    from django_smart_ratelimit.key_functions import generate_key

    from ratelimit_app.algorithms.rates import parse
    from ratelimit_app.core import get_usage as our_usage

    three = ";".join(THREE_RATES)
    g = f"bench-{backend}"
    smart = smart_backend(backend)
    limits = {r: (p.count, p.seconds) for r in THREE_RATES for p in parse(r)}

    cost = COST

    def ours(group: str, rate: str) -> Check:
        if cost != 1:

            def costly(request: Any) -> Any:
                return [our_usage(request, group, None, "ip", rate, increment=True, cost=cost)]

            return costly

        def check(request: Any) -> Any:
            return [our_usage(request, group=group, key="ip", rate=rate, increment=True)]

        return check

    def peer(group: str, rates: tuple[str, ...]) -> Check:
        def check(request: Any) -> Any:
            return [
                peer_usage(request, group=group, key="ip", rate=rate, increment=True)
                for rate in rates
            ]

        return check

    def smart_ratelimit(group: str, rates: tuple[str, ...]) -> Check:
        # ratelimit_batch's core: the key of each rate ("group:ip"), one check_batch.
        def check(request: Any) -> Any:
            subject = generate_key("ip", request)
            batch: list[dict[str, Any]] = [
                {"key": f"{group}-{n}:{subject}", "limit": limits[r][0], "period": limits[r][1]}
                for n, r in enumerate(rates)
            ]
            return [
                _usage(c["limit"], meta["count"])
                for c, (_, meta) in zip(batch, smart.check_batch(batch), strict=True)
            ]

        return check

    def fast_ratelimit(group: str, rates: tuple[str, ...]) -> Check:
        def check(request: Any) -> Any:
            found = [
                get_ratelimit(
                    group=f"{group}-{n}",
                    key="ip",
                    rate=rate,
                    request=request,
                    action=Action.INCREASE,
                    cache=backend,
                )
                for n, rate in enumerate(rates)
            ]
            return [_usage(r.limit, r.count) for r in found]

        return check

    one, all_three = (ONE_RATE,), THREE_RATES
    peers = []
    for subject in ("busy", "quiet"):
        quiet = subject == "quiet"
        s = "q" if quiet else ""
        peers += [
            Contender(f"ours 1 {subject}", ours(g + "-o1" + s, ONE_RATE), quiet=quiet),
            Contender(f"django-ratelimit 1 {subject}", peer(g + "-p1" + s, one), quiet=quiet),
            Contender(
                f"smart-ratelimit 1 {subject}", smart_ratelimit(g + "-s1" + s, one), quiet=quiet
            ),
            Contender(
                f"fast-ratelimit 1 {subject}", fast_ratelimit(g + "-f1" + s, one), quiet=quiet
            ),
            Contender(f"ours 3 {subject}", ours(g + "-o3" + s, three), quiet=quiet),
            Contender(
                f"django-ratelimit 3 {subject}", peer(g + "-p3" + s, all_three), quiet=quiet
            ),
            Contender(
                f"smart-ratelimit 3 {subject}",
                smart_ratelimit(g + "-s3" + s, all_three),
                quiet=quiet,
            ),
            Contender(
                f"fast-ratelimit 3 {subject}",
                fast_ratelimit(g + "-f3" + s, all_three),
                quiet=quiet,
            ),
        ]
    by_name = {c.name: c for c in peers}
    # The busy rows against django-ratelimit are the same contenders as the fastest-peer
    # rows (timed once); ours are filled first.
    by_name["ours 1 busy"].windows = (60,)
    by_name["ours 3 busy"].windows = (60, 3600, 86400)
    return [
        *peers,
        Contender("ours 3h", ours(g + "-oh", three), hierarchical=True, windows=(60, 3600, 86400)),
        Contender("ours over", ours(g + "-ox", OVER_RATE), limited=True),
        Contender("django-ratelimit over", peer(g + "-px", (OVER_RATE,)), limited=True),
    ]


@contextmanager
def _mode(hierarchical: bool) -> Iterator[None]:
    from ratelimit_app.algorithms import windows

    with mock.patch.object(windows, "HIERARCHICAL", hierarchical):
        yield


@contextmanager
def patient_sockets() -> Iterator[None]:
    """Our counters' connections wait :data:`SOCKET_TIMEOUT` seconds: a stall of this shared
    machine is not a server outage. Enter it before the settings change that rebuilds the
    backends."""
    from ratelimit_app.backends import base

    with mock.patch.object(base, "SOCKET_TIMEOUT", SOCKET_TIMEOUT):
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
    # Failed checks are counted in the table; a log line for each would drown it (and
    # django-smart-ratelimit logs every check).
    logs = [logging.getLogger(name) for name in ("ratelimit_app", "django_smart_ratelimit")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        _rounds(backend, runners, rounds, calls, pool, clock)
    finally:
        for log, level in zip(logs, levels, strict=True):
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

    # Quiet contenders: each timed check is a new subject's first (one new client a call;
    # contenders count in groups of their own, so they share these requests).
    new = requests(rounds * calls, net=11) if any(c.quiet for c in runners) else []
    # A stall of this shared machine longer than our default socket timeout (0.1 s) is a
    # failed check, and the dead-server retry then fails the rest of the round: as the peers'
    # clients wait (django-redis: no timeout; django-smart-ratelimit: 5 s), so do ours here.
    with patient_sockets(), override_settings(RATELIMIT_USE_CACHE=backend):
        for r in range(rounds):
            order = runners if r % 2 == 0 else runners[::-1]
            for c in order:
                with _mode(c.hierarchical):
                    # The first round connects and fills before timing.
                    if r == 0 and c.windows:
                        _fill(c, pool)
                    elif r == 0 and not c.quiet:  # the peers' keys exist
                        for request in pool:
                            c.check(request)
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
                        request = new[offset + i] if c.quiet else pool[(offset + i) % len(pool)]
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
    with override_settings(CACHES=caches_for(servers)), smart_settings(servers):
        return {
            backend: {c.name: c for c in time_backend(backend, rounds, calls, pool, make(backend))}
            for backend in ("memcached", "redis")
        }


def run(
    rounds: int = 20, calls: int = 300, ips: int = 100, servers: Servers | None = None
) -> Report:
    """Time every case on memcached and Redis; start throwaway servers unless given."""
    report = Report([], [])
    for backend, by_name in time_backends(rounds, calls, ips, servers, contenders).items():
        for case, ours, peer in (
            ("1 rate", "ours 1 busy", "django-ratelimit 1 busy"),
            ("3 rates", "ours 3 busy", "django-ratelimit 3 busy"),
            ("3 rates, hierarchical", "ours 3h", "django-ratelimit 3 busy"),
            ("1 rate, over the limit", "ours over", "django-ratelimit over"),
        ):
            o, p = by_name[ours].samples, by_name[peer].samples
            report.rows.append(
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
        for case, key, subject in PEER_CASES:
            ours_c = by_name[f"ours {key} {subject}"]
            peers = [by_name[f"{name} {key} {subject}"] for name in PEERS]
            report.peer_rows.append(
                PeerRow(
                    backend=backend,
                    case=case,
                    subject=subject,
                    ours_median=quantile(ours_c.samples, 0.5),
                    peer_medians={
                        name: quantile(c.samples, 0.5)
                        for name, c in zip(PEERS, peers, strict=True)
                    },
                    samples=len(ours_c.samples),
                    ours_failed=ours_c.failures,
                    peers_failed=sum(c.failures for c in peers),
                )
            )
    return report


def _failed_cell(ours: int, peers: int, samples: int) -> str:
    return f"{ours}/{samples} ours, {peers} peer" if ours or peers else "0"


def verdict_cells(r: Row) -> list[str]:
    """A row's ratio, target and whether it is met, as table cells (shared with the other
    benches whose rows are :class:`Row`)."""
    return [
        f"{r.ratio:.2f}x",
        "-" if r.target is None else f"<= {r.target}x",
        {None: "-", True: "yes", False: "NO"}[r.met],
    ]


def render(report: Report, rounds: int, calls: int) -> str:
    """Both tables: against django-ratelimit, and against the fastest peer."""
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
            *verdict_cells(r),
            _failed_cell(r.ours_failed, r.peer_failed, r.samples),
        ]
        for r in report.rows
    ]
    title = (
        f"Per-check latency vs django-ratelimit 4.1 ({rounds} interleaved rounds x {calls} "
        "checks; 3 rates = 3 stacked django-ratelimit checks)"
    )
    peer_headers = [
        "backend",
        "case",
        "subject",
        "ours med us",
        *(f"{name} med us" for name in PEERS),
        "fastest peer",
        "ours/fastest",
        "target",
        "met",
        "failed",
    ]
    peer_body = [
        [
            r.backend,
            r.case,
            r.subject,
            r.ours_median,
            *(r.peer_medians[name] for name in PEERS),
            r.fastest,
            f"{r.ratio:.2f}x",
            f"<= {r.target}x",
            "yes" if r.met else "NO",
            _failed_cell(r.ours_failed, r.peers_failed, r.samples),
        ]
        for r in report.peer_rows
    ]
    peer_title = (
        f"Per-check latency vs the fastest peer, same run (django-ratelimit 4.1, "
        f"django-smart-ratelimit 4.12, django-fast-ratelimit 9.1; {rounds} x {calls} checks)"
    )
    return table(title, headers, body) + "\n\n" + table(peer_title, peer_headers, peer_body)


def main(argv: list[str] | None = None) -> Report:
    global COST
    parser = timing_parser(__doc__)
    parser.add_argument(
        "--cost", type=int, default=1, help="the hits each of our checks counts (default 1)"
    )
    args = parser.parse_args(argv)
    COST = args.cost
    info = machine()
    print(
        f"machine: {info['cores']} cores, {info['cpu']}; Python {info['python']}; "
        f"{info['memcached']}; {info['redis']}\n"
    )
    report = run(args.rounds, args.calls, args.ips)
    print(render(report, args.rounds, args.calls))
    return report


if __name__ == "__main__":
    main()
