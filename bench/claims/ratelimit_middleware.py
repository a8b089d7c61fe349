"""Rules through the middleware: the per-request cost three rules add, vs django-ratelimit 4.1.

One view, three ways, in one process against the same throwaway servers:

* **view alone**: the plain view (it reads the ``email`` form field, as a login view does,
  and answers ``HttpResponse("ok")``);
* **+ 3 rules**: ``RatelimitMiddleware`` wrapping the same view, with ``RATELIMIT_RULES``
  ``ip`` per minute, ``email`` per hour and ``ip`` per day on the path ``/login/``
  (the ``RateLimit`` headers are part of the cost);
* **+ 3 decorators**: the same view under three stacked django-ratelimit decorators,
  ``@ratelimit(key="ip", rate=".../m")``, ``@ratelimit(key="post:email", rate=".../h")``,
  ``@ratelimit(key="ip", rate=".../d")``.

Every limit is ``1000000`` per window, so nothing is limited and every check does its full
work. Both limiters use the same cache alias (``RATELIMIT_USE_CACHE``, which both read):
memcached (``PyMemcacheCache``), then Redis (``django_redis``). Requests are url-encoded
POSTs to ``/login/`` from a pool of client IPs, each with its own email; every call gets a
fresh request (built before the timed batch), so the form is parsed once per request, as
in production, and the view's own read of it is part of the baseline.

The cost a limiter adds is its median (90th percentile) time per request minus the view's
median (90th percentile) in the same run. The three contenders are interleaved: every round
times ``calls`` requests of each in turn, the order flipping between rounds. Before timing,
every bucket the rules read is filled (requests through the middleware at earlier times, with
``ratelimit_app.clock`` moved back), as for subjects that have been busy for a day; each
subject has made a request through the decorators too, so django-ratelimit's counters exist
and it does its usual ``add`` then ``incr`` per rate. A request whose rules could not be
checked (the middleware fails open: no usage on the request) or that django-ratelimit
refused (a backend failure without ``RATELIMIT_FAIL_OPEN``) counts in ``failed``.

The second case, a request no rule covers (``GET /other/``), times ``batch`` calls per
sample, because a call is a few microseconds. Samples come in pairs, the view alone and
through the middleware timed back to back (the order alternating), and what the middleware
adds is the median (90th percentile) of the pairs' differences: on a noisy machine the view's
own time drifts by more than the middleware's cost between rounds, much less within a pair.

Targets: the three rules add at most 0.5x what the three decorators add (median); a request
no rule covers pays under 5 microseconds.

``--operators`` runs the same with the operators' controls in play (docs/operators.rst): each
rule counts a cost of 3, and the configuration holds :data:`OVERRIDES` overrides of the three
rules (other emails, other networks, and one of the bench's own subjects), so every request
looks its subjects up in them; the targets are the same.

Run: ``python -m bench.claims.ratelimit_middleware [--rounds 20 --calls 300 --ips 100
--batch 100] [--operators]``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from bench.claims.ratelimit_latency import caches_for
from bench.common import (
    Servers,
    configure_django,
    quantile,
    table,
    throwaway_servers,
    timing_parser,
)

PATH = "/login/"
OTHER_PATH = "/other/"
RATES = {"m": "1000000/m", "h": "1000000/h", "d": "1000000/d"}
RULES = [
    {"name": "bench-ip-m", "path": PATH, "key": "ip", "rate": RATES["m"]},
    {"name": "bench-email-h", "path": PATH, "key": "email", "rate": RATES["h"]},
    {"name": "bench-ip-d", "path": PATH, "key": "ip", "rate": RATES["d"]},
]
WINDOWS = (60, 3600, 86400)
#: Target: what the three rules add / what the three decorators add (medians).
RATIO_TARGET = 0.5
#: Target: microseconds a request no rule covers spends in the middleware (median).
NO_MATCH_TARGET_US = 5.0
BACKENDS = ("memcached", "redis")
WARMUP = 5
#: Overrides in force with ``--operators``.
OVERRIDES = 1000

Call = Callable[[Any], Any]


@dataclass
class Contender:
    name: str
    call: Call
    samples: list[float] = field(default_factory=list)  # microseconds per request
    failures: int = 0


@dataclass
class Row:
    """The three rules against the three decorators on one backend (microseconds)."""

    backend: str
    view_median: float
    view_p90: float
    ours_median: float
    ours_p90: float
    peer_median: float
    peer_p90: float
    samples: int
    ours_failed: int = 0
    peer_failed: int = 0

    @property
    def ours_added(self) -> float:
        return self.ours_median - self.view_median

    @property
    def ours_added_p90(self) -> float:
        return self.ours_p90 - self.view_p90

    @property
    def peer_added(self) -> float:
        return self.peer_median - self.view_median

    @property
    def peer_added_p90(self) -> float:
        return self.peer_p90 - self.view_p90

    @property
    def ratio(self) -> float:
        return self.ours_added / self.peer_added

    @property
    def met(self) -> bool:
        """A run where any of our checks failed never meets the target."""
        return 0 < self.ratio <= RATIO_TARGET and not self.ours_failed


@dataclass
class NoMatchRow:
    """A request no rule covers (microseconds per call, each sample the mean of ``batch``
    calls): the view alone, through the middleware, and what the middleware adds (the
    quantiles of the differences of back-to-back pairs of samples)."""

    view_median: float
    ours_median: float
    added: float
    added_p90: float
    samples: int
    batch: int

    @property
    def met(self) -> bool:
        return self.added < NO_MATCH_TARGET_US


def view(request: Any) -> Any:
    """The view every contender calls: reads the form, as a login view does."""
    from django.http import HttpResponse

    request.POST.get("email")
    return HttpResponse(b"ok")


def decorated_view() -> Call:
    """``view`` under three stacked django-ratelimit decorators."""
    from django_ratelimit.decorators import ratelimit

    wrapped = ratelimit(key="ip", rate=RATES["d"])(view)
    wrapped = ratelimit(key="post:email", rate=RATES["h"])(wrapped)
    return ratelimit(key="ip", rate=RATES["m"])(wrapped)


def _address(i: int) -> str:
    return f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"


def login_requests(subjects: list[int]) -> list[Any]:
    """Fresh url-encoded POSTs to ``PATH``: subject ``i`` is client IP i with email i."""
    from django.test import RequestFactory

    factory = RequestFactory()
    return [
        factory.post(
            PATH,
            data=urlencode({"email": f"user{i}@example.com", "password": "x"}),
            content_type="application/x-www-form-urlencoded",
            REMOTE_ADDR=_address(i),
        )
        for i in subjects
    ]


def _fill_times(now: float) -> list[float]:
    """Times that put a hit in every bucket the windows read (as ratelimit_latency)."""
    times = {now - j for j in range(1, 62)} | {now - 60 * j for j in range(1, 62)}
    for w in WINDOWS:
        times |= {now - (j + 0.5) * w / 60 for j in range(61)}
        times |= {now - 3600 * j for j in range(1, w // 3600 + 1)}
    return sorted(times)


def _fill(middleware: Call, pool: list[Any]) -> None:
    from unittest import mock

    from ratelimit_app import clock

    for t in _fill_times(time.time()):
        with mock.patch.object(clock, "now", return_value=t):
            for request in pool:
                middleware(request)


def _ours_ok(request: Any, response: Any) -> bool:
    """The middleware checked all three rules (it fails open silently otherwise)."""
    usage = getattr(request, "ratelimit_usage", None) or {}
    return (
        response.status_code == 200
        and "RateLimit" in response
        and all(
            r["name"] in usage
            and usage[r["name"]]["limit"] >= 1
            and not usage[r["name"]]["should_limit"]
            for r in RULES
        )
    )


@contextmanager
def _quiet() -> Iterator[None]:
    # Failed checks are counted in the table; a log line for each would drown it.
    log = logging.getLogger("ratelimit_app")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def operator_rules() -> list[dict[str, Any]]:
    """:data:`RULES`, each counting a cost of 3."""
    return [{**r, "cost": 3} for r in RULES]


def install_overrides() -> None:
    """Put :data:`OVERRIDES` overrides of the rules in force in this process's snapshot (as
    the admin's rows would be, without a database): most for subjects the bench never sends,
    one for its first email."""
    from ratelimit_app import store
    from ratelimit_app.identity.addresses import mask_ip
    from ratelimit_app.overrides import table as overrides

    found = [overrides.parse("bench-email-h", "user1@example.com", "2000000/h")]
    for i in range(OVERRIDES - 1):
        rule = RULES[i % len(RULES)]["name"]
        subject = f"other{i}@example.org" if rule == "bench-email-h" else f"203.0.{i % 256}.0/24"
        found.append(overrides.parse(rule, subject, "5000000/d"))
    snap = store.current()
    snap.overrides = overrides.compile_table(found, mask_ip)
    snap.deadline = float("inf")  # no reload from the database during the run
    store._publish(snap)
    if not snap.overriding or store.current() is not snap:
        raise RuntimeError("the overrides are not in force")


def _rule_settings(backend: str, operators: bool = False) -> dict[str, Any]:
    return {
        "RATELIMIT_USE_CACHE": backend,
        "RATELIMIT_RULES": operator_rules() if operators else RULES,
        "RATELIMIT_ENABLE": True,
        "RATELIMIT_ALLOW": (),
        "RATELIMIT_DENY": (),
        "RATELIMIT_FAIL_OPEN": False,
    }


def time_backend(
    backend: str, rounds: int, calls: int, ips: int, operators: bool = False
) -> list[Contender]:
    """Interleaved rounds of the view, the middleware and the decorators on one alias."""
    from django.test import override_settings
    from django_ratelimit.exceptions import Ratelimited

    from ratelimit_app.middleware import RatelimitMiddleware

    middleware = RatelimitMiddleware(view)
    peer = decorated_view()
    runners = [Contender("view", view), Contender("ours", middleware), Contender("peer", peer)]
    clock = time.perf_counter_ns
    with override_settings(**_rule_settings(backend, operators)), _quiet():
        if operators:
            install_overrides()
        pool = login_requests(list(range(1, ips + 1)))
        _fill(middleware, pool)
        for request in login_requests(list(range(1, ips + 1))):
            peer(request)  # every subject's django-ratelimit counters exist
        for r in range(rounds):
            for c in runners if r % 2 == 0 else runners[::-1]:
                for request in login_requests([1 + i % ips for i in range(WARMUP)]):
                    response = c.call(request)
                    if c.name == "ours" and not _ours_ok(request, response):
                        raise RuntimeError(f"{backend}: the rules were not checked")
                offset = r * calls
                batch = login_requests([1 + (offset + i) % ips for i in range(calls)])
                call, samples = c.call, c.samples
                responses = []
                for request in batch:
                    start = clock()
                    try:
                        response = call(request)
                    except Ratelimited:  # django-ratelimit: its backend failed
                        response = None
                    samples.append((clock() - start) / 1000)
                    responses.append(response)
                if c.name == "ours":
                    c.failures += sum(
                        not _ours_ok(q, p) for q, p in zip(batch, responses, strict=True)
                    )
                elif c.name == "peer":
                    c.failures += responses.count(None)
    return runners


def time_no_match(rounds: int, calls: int, batch: int) -> tuple[list[float], list[float]]:
    """The view alone and through the middleware for ``GET OTHER_PATH``: ``rounds x calls``
    pairs of samples, each the mean of ``batch`` calls, the two of a pair timed back to back
    (the order alternating), so that the difference of a pair is the middleware's cost at
    that moment. Returns the samples of the view alone and of the middleware."""
    from django.test import RequestFactory, override_settings

    from ratelimit_app.middleware import RatelimitMiddleware

    request = RequestFactory().get(OTHER_PATH, REMOTE_ADDR=_address(1))
    middleware = RatelimitMiddleware(view)
    clock = time.perf_counter_ns
    alone: list[float] = []
    through: list[float] = []
    with override_settings(**_rule_settings("default")):
        for call in (view, middleware):
            for _ in range(WARMUP):
                response = call(request)
                if response.status_code != 200 or "RateLimit" in response:
                    raise RuntimeError(f"GET {OTHER_PATH} was limited")
        if hasattr(request, "ratelimit_usage"):
            raise RuntimeError(f"a rule matched GET {OTHER_PATH}")
        loop = range(batch)
        pairs = ((view, alone), (middleware, through))
        for i in range(rounds * calls):
            for call, samples in pairs if i % 2 == 0 else pairs[::-1]:
                start = clock()
                for _ in loop:
                    call(request)
                samples.append((clock() - start) / 1000 / batch)
    return alone, through


def run(
    rounds: int = 20,
    calls: int = 300,
    ips: int = 100,
    batch: int = 100,
    servers: Servers | None = None,
    backends: tuple[str, ...] = BACKENDS,
    operators: bool = False,
) -> tuple[list[Row], NoMatchRow]:
    """Time the three rules on each backend and the no-match path; start throwaway servers
    unless given. ``operators``: with costs and overrides in play."""
    configure_django()
    if servers is None:
        with throwaway_servers() as started:
            return run(rounds, calls, ips, batch, started, backends, operators)
    from django.test import override_settings

    rows = []
    with override_settings(CACHES=caches_for(servers)):
        for backend in backends:
            by = {c.name: c for c in time_backend(backend, rounds, calls, ips, operators)}
            v, o, p = by["view"].samples, by["ours"].samples, by["peer"].samples
            rows.append(
                Row(
                    backend=backend,
                    view_median=quantile(v, 0.5),
                    view_p90=quantile(v, 0.9),
                    ours_median=quantile(o, 0.5),
                    ours_p90=quantile(o, 0.9),
                    peer_median=quantile(p, 0.5),
                    peer_p90=quantile(p, 0.9),
                    samples=len(o),
                    ours_failed=by["ours"].failures,
                    peer_failed=by["peer"].failures,
                )
            )
        alone, through = time_no_match(rounds, calls, batch)
    added = [t - a for a, t in zip(alone, through, strict=True)]
    no_match = NoMatchRow(
        view_median=quantile(alone, 0.5),
        ours_median=quantile(through, 0.5),
        added=quantile(added, 0.5),
        added_p90=quantile(added, 0.9),
        samples=len(added),
        batch=batch,
    )
    return rows, no_match


def render(rows: list[Row], no_match: NoMatchRow, rounds: int, calls: int) -> str:
    headers = [
        "backend",
        "view alone med us",
        "+ 3 rules med us",
        "+ 3 rules p90 us",
        "+ 3 decorators med us",
        "+ 3 decorators p90 us",
        "ours/peer",
        "target",
        "met",
        "failed",
    ]
    body = [
        [
            r.backend,
            r.view_median,
            r.ours_added,
            r.ours_added_p90,
            r.peer_added,
            r.peer_added_p90,
            f"{r.ratio:.2f}x",
            f"<= {RATIO_TARGET}x",
            "yes" if r.met else "NO",
            f"{r.ours_failed}/{r.samples} ours, {r.peer_failed} peer"
            if r.ours_failed or r.peer_failed
            else "0",
        ]
        for r in rows
    ]
    first = table(
        f"Cost added per request: 3 rules through RatelimitMiddleware vs 3 stacked "
        f"django-ratelimit 4.1 decorators ({rounds} interleaved rounds x {calls} POST "
        f"{PATH}; + = time minus the view alone)",
        headers,
        body,
    )
    n = no_match
    second = table(
        f"A request no rule covers: GET {OTHER_PATH} through RatelimitMiddleware "
        f"({n.samples} pairs of samples x {n.batch} calls, timed back to back; "
        "added = the pair's difference)",
        [
            "view alone med us",
            "through middleware med us",
            "added med us",
            "added p90 us",
            "target",
            "met",
        ],
        [
            [
                n.view_median,
                n.ours_median,
                n.added,
                n.added_p90,
                f"< {NO_MATCH_TARGET_US:g} us",
                "yes" if n.met else "NO",
            ]
        ],
    )
    return first + "\n\n" + second


def main(argv: list[str] | None = None) -> tuple[list[Row], NoMatchRow]:
    parser = timing_parser(__doc__)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--backend", choices=BACKENDS, action="append", dest="backends")
    parser.add_argument("--operators", action="store_true", help="costs and overrides in play")
    args = parser.parse_args(argv)
    backends = tuple(args.backends or BACKENDS)
    rows, no_match = run(
        args.rounds, args.calls, args.ips, args.batch, backends=backends, operators=args.operators
    )
    print(render(rows, no_match, args.rounds, args.calls))
    return rows, no_match


if __name__ == "__main__":
    main()
