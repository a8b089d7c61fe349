"""Every backend against the model: a hypothesis state machine on real servers.

The reference is pure: :mod:`ratelimit_app.algorithms.windows` (which buckets a check writes
and reads, how the values read make a usage) and :mod:`ratelimit_app.algorithms.gcra` (the
leaky bucket). The **model** is a plain dict of bucket counters and leaky-bucket TATs that
carries those plans itself: it applies a plan's writes, take-backs and reads to the dict and
evaluates with the same pure functions, following what :func:`~ratelimit_app.engine.check_many`
does around the backend (a second round trip that takes refused hits back, reads the fine
buckets of the limited checks and counts the strikes of limits that ban).
:class:`LimiterMachine` sends the same random requests to ``check_many`` on a backend and to
the model, and every result must be equal: counts, ``limited``, ``remaining``,
``retry_after`` and ``reset`` of every rate (exactly: both sides feed the same integers to
the same functions), a leaky bucket's state, ``reaches_ban`` (the refusal's strike brought its
subject to the ban); and the refusal memory must hold exactly the refusals the model says
are remembered (never one of a limit that bans: each must reach its strike).

An example has one to three limits (each a group of its own, so examples never share
counters: a sliding window of one to three rates, with or without a ban of 1 to 3 strikes;
a leaky bucket with or without a burst; or an in-flight limit, a window as long as its lease
whose refusals wait a second; counts up to 12, windows and leases from 10 s to an hour, a
day in the long run) and three subjects, and runs on one bucket layout (uniform with 60, 6
or 1 buckets a window, or hierarchical). Its steps are requests (one to three limits, each
for one subject, counted or a look, of a cost mostly 1, sometimes 2 to 5 and sometimes above
every limit, repeated up to 13 times), with each take-back policy of ``check_many`` (the
refused hits; everything when one is refused, as blocking middleware rules do; nothing, as
failure counting does) and with or without exact waits; places given back (``take_back`` of
an admitted in-flight check, as the adapters do when its response is done; sometimes a place
given back already, which takes nothing more); up to two resets (:func:`core.reset
<ratelimit_app.core.reset>`, which calls ``Backend.delete``; the model forgets the subject
whole, so a bucket the reset missed is a mismatch); and clock moves on the limiter's frozen
clock: inside a bucket, onto (and a millisecond either side of) the edges of fine and coarse
buckets, of the hierarchical levels and of whole windows, by the last ``retry_after`` or
``reset`` (the moments a hit leaves a window), and far past every TTL. A backend error, even
one ``check_many`` swallows (a failed take-back), fails the run.

**Time and TTLs.** The limiter's clock is frozen and moves by the steps; a server's TTLs run
in real seconds. The two are reconciled as follows.

* A TTL is relative (every TTL here is under memcached's 30 days), so where the frozen clock
  stands (the examples start in 2027) does not matter to the servers: within an example a
  key lives at least its TTL less one second (memcached's clock ticks in whole seconds) of
  real time. Every example uses fresh groups, so keys of earlier examples are never read.
* "Past the TTL" is modelled, not waited for: the model drops an entry once the limiter's
  clock reaches its creation time plus its TTL less one second (the earliest moment a
  server could have dropped it, had it lived on that clock; counters take their TTL when
  created and keep it, as memcached's ``ma N<ttl>`` and the generic ``add`` do). The
  server still holds it, because little real time has passed. So whenever the clock has
  moved past a TTL, the model reads 0 where the server may still hold a count: the two
  agree only if no plan ever reads a bucket after its TTL (nor a leaky bucket's TAT that
  still matters). That is the property expiry relies on in production, and it is checked,
  not assumed, by every far move of the clock. The reverse, a key a server dropped in real
  time that the model still holds, cannot happen while an example takes less real time
  than the shortest TTL it wrote (at least ``W + 1`` s for a window of ``W`` s, the shortest
  being 10 s; 2 s for a TAT): the model notes when each entry was written in real time, and
  an example that outlived one of its entries' real TTLs is discarded (``assume``), never
  reported as a mismatch. An example takes well under a second.

Backends: local memory and Django's own ``RedisCache`` (both through the generic
:class:`~ratelimit_app.backends.cache.CacheBackend`; the latter on a real Redis), memcached
with one node and with three, Redis through django-redis, and Redis Cluster (three nodes,
:class:`~ratelimit_app.backends.redis.RedisClusterBackend`; the cluster of
``tests/reliability/test_cluster_slots.py``, imported from there).

The normal suite runs a short, derandomized run without an example database, so CI is
deterministic. ``BUCKETRY_FUZZ=1`` (``make fuzz``) runs a long one with fresh random
examples (and hypothesis's example database, so a failure found is replayed first the next
time); ``BUCKETRY_FUZZ_EXAMPLES`` sets its number of examples per backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, assume, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ratelimit_app import ALL
from ratelimit_app.algorithms import calendar, gcra, windows
from ratelimit_app.algorithms.gcra import IN_FLIGHT, LEAKY_BUCKET, SLIDING_WINDOW
from ratelimit_app.algorithms.rates import MAX_LEASE, Rate, Slots, parse
from ratelimit_app.backends import reset_backends
from ratelimit_app.config.bans import BanSpec
from ratelimit_app.core import reset, scope
from ratelimit_app.engine import Check, Result, check_many, take_back
from ratelimit_app.engine.checking import STRIKES, checking_many, taking_back
from ratelimit_app.engine.refusals.remembered import refusal_key
from ratelimit_app.engine.trips import arun
from ratelimit_app.identity.keys import namespace
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.testing import FrozenClock, forget_refusals, frozen_clock
from tests.conftest import start_or_skip

FUZZ = os.environ.get("BUCKETRY_FUZZ", "").strip().lower() in {"1", "true", "yes"}
if FUZZ:
    SETTINGS = settings(
        max_examples=int(os.environ.get("BUCKETRY_FUZZ_EXAMPLES", "500")),
        stateful_step_count=60,
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
else:
    # Deterministic: the same examples on every run and every backend, no example database
    # (a failure found by someone's earlier run cannot make CI fail, or pass, differently).
    SETTINGS = settings(
        max_examples=50,
        stateful_step_count=30,
        deadline=None,
        derandomize=True,
        database=None,
        report_multiple_bugs=False,  # shrink one failure, not each symptom of it
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )

T0 = 1_800_000_000.0
SUBJECTS = ("192.0.2.1", "192.0.2.2", "192.0.2.3")
#: Windows from 10 s (the shortest: its keys outlive any example in real time) to an hour,
#: and a day in the long run only: a reset deletes every second bucket a day's window may
#: hold (about 88,000, :func:`windows.stored_suffixes`), a second or more on Redis.
WINDOWS = (10, 30, 60, 90, 600, 3600, *((86400,) if FUZZ else ()))
#: (hierarchical, buckets per window).
LAYOUTS = ((False, 60), (False, 6), (False, 1), (True, 60))
#: Resets an example may make: each deletes every bucket a subject's windows may hold (a
#: person's operation, not a request's), thousands for a long window.
MAX_RESETS = 2
#: Real seconds a key may expire before its TTL (memcached's clock ticks in whole seconds),
#: plus a margin for the time a check takes.
WALL_SLACK = 1.5
LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
#: What a refusal of an in-flight limit says to wait, whatever its window (``Retry-After: 1``).
IN_FLIGHT_WAIT = 1.0
#: Numbers the examples of a session (their servers are the session's own).
_examples = itertools.count()


# -- the model ----------------------------------------------------------------------------------


@dataclass
class Entry:
    """A counter (``value``: its count) or a leaky bucket's TAT (``value``: ticks)."""

    value: int
    #: Limiter time from which a server on that clock could have dropped it.
    expires: float
    #: ``time.monotonic()`` from which the real server may have dropped it.
    wall_deadline: float


@dataclass
class ModelResult:
    namespace: str
    usages: list[windows.Usage]
    meter: gcra.State | None = None
    #: The plan of the hit it still holds (a counted check's, None once taken back).
    plan: windows.Plan | None = None
    #: Its refusal brought its subject to its limit's ban.
    reaches_ban: bool = False
    #: Its refusal is remembered (the engine's refusal memory).
    remembered: bool = False

    @property
    def limited(self) -> bool:
        return any(u.limited for u in self.usages)


Policy = Callable[[Sequence[Check], Sequence[Any]], set[int]]


def refused_counted(checks: Sequence[Check], results: Sequence[Any]) -> set[int]:
    """``check_many``'s default: the refused hits."""
    return {i for i, r in enumerate(results) if r.limited and checks[i].increment}


def everything_if_refused(checks: Sequence[Check], results: Sequence[Any]) -> set[int]:
    """As the middleware's blocking rules: a refused request counts nowhere."""
    return set(range(len(checks))) if any(r.limited for r in results) else set()


def nothing(checks: Sequence[Check], results: Sequence[Any]) -> set[int]:
    """As failure counting: every hit stays counted."""
    return set()


#: Policy name -> (what the model applies, what check_many is given: None for its default).
POLICIES: dict[str, tuple[Policy, Policy | None]] = {
    "refused": (refused_counted, None),
    "everything": (everything_if_refused, everything_if_refused),
    "nothing": (nothing, nothing),
}


class Model:
    """The counters and TATs of an example, driven by the pure plans."""

    def __init__(self, per_window: int, hierarchical: bool) -> None:
        self.per_window = per_window
        self.hierarchical = hierarchical
        self.entries: dict[tuple[str, str], Entry] = {}
        #: Take-backs that dropped a digit (10 to 9, 100 to 99...).
        self.digits_dropped = 0

    def get(self, ns: str, suffix: str, t: float) -> Entry | None:
        entry = self.entries.get((ns, suffix))
        if entry is not None and t >= entry.expires:
            del self.entries[ns, suffix]
            return None
        return entry

    def put(self, ns: str, suffix: str, value: int, t: float, ttl: int) -> Entry:
        entry = Entry(value, t + ttl - 1, time.monotonic() + ttl - WALL_SLACK)
        self.entries[ns, suffix] = entry
        return entry

    def value(self, ns: str, suffix: str, t: float) -> int:
        entry = self.get(ns, suffix, t)
        return 0 if entry is None else entry.value

    def forget(self, ns: str) -> None:
        """A reset: the subject has no counters and no TAT left (what a reset promises,
        whichever buckets the backend had to delete to keep it)."""
        for key in [k for k in self.entries if k[0] == ns]:
            del self.entries[key]

    def outlived(self, t: float) -> bool:
        """True when an entry a check may still read has outlived its real TTL."""
        now = time.monotonic()
        return any(e.wall_deadline <= now and t < e.expires for e in self.entries.values())

    def tally(
        self, ns: str, p: windows.Plan, t: float, increment: bool, cost: int
    ) -> list[windows.Usage]:
        """Plan ``p``'s writes raised by ``cost`` when it counts, then its reads evaluated."""
        if increment:
            for suffix, ttl in p.writes:
                entry = self.get(ns, suffix, t) or self.put(ns, suffix, 0, t, ttl)
                entry.value += cost
        values = [self.value(ns, s, t) for s in p.reads]
        return windows.evaluate(p, values, t, counted=increment, cost=cost)

    def count(self, c: Check, ns: str, t: float) -> ModelResult:
        """A sliding window's check, or an in-flight one (a window as long as the lease,
        whose refusal waits :data:`IN_FLIGHT_WAIT`: a place frees when a response ends)."""
        p = windows.plan(c.rates, t, self.per_window, self.hierarchical)
        usages = self.tally(ns, p, t, c.increment, c.cost)
        if c.algorithm == IN_FLIGHT and any(u.limited for u in usages):
            wait = IN_FLIGHT_WAIT
            usages = [u._replace(retry_after=wait, reset=wait) if u.limited else u for u in usages]
        return ModelResult(ns, usages, plan=p if c.increment else None)

    def strike(self, c: Check, t: float) -> bool:
        """Count one refusal of ``c`` toward its ban: True when it brings its subject there."""
        assert c.ban is not None
        p = windows.plan((c.ban.strikes,), t, self.per_window, self.hierarchical)
        ns = namespace(c.scope + STRIKES, *c.subject)
        return self.tally(ns, p, t, True, 1)[0].count >= c.ban.after

    def release(self, c: Check, r: ModelResult, t: float) -> None:
        """Give back the place ``r`` holds (its response is done), once."""
        if r.plan is not None:
            self.uncount(r.namespace, r.plan, c.cost, t)
            r.plan = None

    def uncount(self, ns: str, p: windows.Plan, cost: int, t: float) -> None:
        """A take-back of ``cost`` from each write of ``p``: a bucket that is gone stays
        gone, and one stops at 0, as memcached's decrement does (Redis drops the bucket,
        which reads as 0 too)."""
        for suffix, _ in p.writes:
            entry = self.get(ns, suffix, t)
            if entry is not None:
                left = max(0, entry.value - cost)
                if len(str(left)) < len(str(entry.value)):
                    self.digits_dropped += (
                        1  # memcached pads it: "10" - 1 -> "9 ", "12" - 5 -> "7 "
                    )
                entry.value = left

    def meter(self, c: Check, ns: str, t: float) -> tuple[ModelResult, int | None]:
        """A leaky bucket's check: its result, and the TAT it stored (None: none)."""
        now_us = gcra.micros(t)
        m = gcra.meter(c.rates, c.burst)
        stored = self.get(ns, gcra.SUFFIX, t)
        read = None if stored is None else stored.value
        written = None
        if c.increment and gcra.fits(m, read, now_us, c.cost):
            written = gcra.advance(m, read, now_us, c.cost)
            self.put(ns, gcra.SUFFIX, written, t, gcra.ttl_seconds(m, written, now_us))
        state = gcra.outcome(m, read, written, now_us, c.increment, c.cost)
        # Its one usage: the level rounded up, and "reset" when the bucket is empty.
        usage = windows.Usage(
            rate=m.rate,
            count=state.count,
            remaining=state.remaining,
            limited=state.limited,
            retry_after=state.retry_after,
            reset=state.empty_in,
        )
        return ModelResult(ns, [usage], state), written

    def unmeter(self, c: Check, ns: str, admitted: int, t: float) -> None:
        """Take back a leaky bucket's admitted request, if its TAT is still the one stored."""
        now_us = gcra.micros(t)
        m = gcra.meter(c.rates, c.burst)
        stored = self.get(ns, gcra.SUFFIX, t)
        if stored is not None and stored.value == admitted:
            restored = gcra.take_back(m, admitted, c.cost)
            if restored > m.ticks(now_us):
                self.put(ns, gcra.SUFFIX, restored, t, gcra.ttl_seconds(m, restored, now_us))
            else:  # the bucket is empty again
                del self.entries[ns, gcra.SUFFIX]

    def check_many(
        self, checks: Sequence[Check], policy: Policy, exact: bool, t: float
    ) -> list[ModelResult]:
        """What ``check_many`` returns, on the dict."""
        results, admitted = self.first_trip(checks, t)
        limited = {i for i, r in enumerate(results) if r.limited}
        if not limited:
            return results
        undo = {i for i in policy(checks, results) if checks[i].increment}
        coarse = self.hierarchical or windows.coarse_factor(self.per_window) > 1
        # A refused sliding window reads its fine buckets to time its wait exactly.
        timed = set()
        if exact and coarse and not self.hierarchical:
            timed = {i for i in limited if checks[i].algorithm == SLIDING_WINDOW}
        for i in sorted(undo | timed):
            r = results[i]
            if i in undo and r.plan is not None:
                self.uncount(r.namespace, r.plan, checks[i].cost, t)
                r.plan = None
            if i in timed:
                self.time_wait(checks[i], r, t)
        for i in sorted(undo.intersection(admitted)):
            self.unmeter(checks[i], results[i].namespace, admitted[i], t)
        for i in sorted(limited):
            exact_wait = checks[i].algorithm != SLIDING_WINDOW or i in timed or not coarse
            self.refused(checks[i], results[i], exact_wait, t)
        return results

    def time_wait(self, c: Check, r: ModelResult, t: float) -> None:
        """A refusal's waits timed exactly, from its fine buckets."""
        detail = windows.plan(c.rates, t, self.per_window, fine_only=True)
        values = [self.value(r.namespace, s, t) for s in detail.reads]
        r.usages = windows.refine(r.usages, detail, values, t, c.cost)

    def first_trip(
        self, checks: Sequence[Check], t: float
    ) -> tuple[list[ModelResult], dict[int, int]]:
        """Each check's result, and the TAT each leaky bucket that admitted stored."""
        results: list[ModelResult] = []
        admitted: dict[int, int] = {}
        for i, c in enumerate(checks):
            ns = namespace(c.scope, *c.subject)
            if c.algorithm == LEAKY_BUCKET:
                result, written = self.meter(c, ns, t)
                if written is not None:
                    admitted[i] = written
            else:
                result = self.count(c, ns, t)
            results.append(result)
        return results, admitted

    def refused(self, c: Check, r: ModelResult, exact_wait: bool, t: float) -> None:
        """A refusal's strike (a counted check of a limit that bans), and whether it is
        remembered: a counted refusal whose wait is exact and not 0, of no limit that bans
        (each of its refusals must reach its strike)."""
        if c.ban is not None and c.increment:
            r.reaches_ban = self.strike(c, t)
        wait = max((u.retry_after for u in r.usages if u.limited), default=0.0)
        r.remembered = c.increment and c.ban is None and exact_wait and wait > 0


def observed(result: Result | ModelResult) -> tuple[Any, ...]:
    """Everything a check reports that the model predicts.

    A leaky bucket's state is compared without its ``tat``: a TAT in the past is an empty
    bucket, which the model may have dropped (past its TTL) while the server still holds it.
    """
    usages = [
        (u.rate, u.count, u.remaining, u.limited, u.retry_after, u.reset) for u in result.usages
    ]
    state = result.meter
    meter: tuple[Any, ...] | None = None
    if state is not None:
        meter = (state.admitted, state.limited, state.level, state.remaining)
        meter += (state.retry_after, state.empty_in)
    return (result.namespace, result.limited, usages, meter, result.reaches_ban)


# -- the machine --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limit:
    """One limit of an example: a group of its own, its rates (an in-flight limit's
    :class:`Slots`), its algorithm, and the ban of a sliding window (None: none)."""

    group: str
    rates: tuple[Rate, ...]
    algorithm: str
    burst: int | None
    ban: BanSpec | None = None

    @property
    def text(self) -> str:
        return ";".join(r.text for r in self.rates)

    def check(self, ip: str, increment: bool, cost: int = 1) -> Check:
        return Check(
            scope(self.group, ALL, self.rates),
            ("ip", ip),
            self.rates,
            increment,
            self.algorithm,
            self.burst,
            cost,
            self.ban,
        )


#: Small counts (refusals, windows that empty), and counts around 10. Nine is a boundary of
#: its own: a burst's tenth hit is refused and taken back from a bucket at 10, which
#: memcached then stores as "9 " (a decrement keeps the value's length).
counts = st.integers(0, 3) | st.just(9) | st.integers(10, 12)
#: Requests repeated a few times, or enough to fill a limit around 10 in one bucket.
repeats = st.integers(1, 3) | st.integers(10, 13)
rate = st.builds(Rate, counts, st.sampled_from(WINDOWS))
#: Quotas on the calendar, in zones whose days are not all 24 hours (a 30-minute change in
#: Lord Howe, midnight skipped in Santiago) beside UTC.
QUOTA_ZONES = ("UTC", "Europe/Paris", "America/Santiago", "Australia/Lord_Howe")
quota = st.builds(
    lambda count, unit, zone: calendar.Quota(count, calendar.UNITS[unit], unit, zone),
    counts,
    st.sampled_from(sorted(calendar.UNITS)),
    st.sampled_from(QUOTA_ZONES),
)
#: A ban's strikes: 1 to 3 refusals within a window (the ban's own length is not the
#: engine's business: it is imposed above ``check_many``).
ban_specs = st.builds(
    lambda after, within: BanSpec(after, within, 60, 60),
    st.integers(1, 3),
    st.sampled_from(WINDOWS),
)
#: (rates, algorithm, burst, ban).
sliding = st.tuples(
    st.lists(rate | quota, min_size=1, max_size=3, unique=True),
    st.just(SLIDING_WINDOW),
    st.none(),
    st.none() | ban_specs,
)
leaky = st.tuples(
    rate.map(lambda r: [r]), st.just(LEAKY_BUCKET), st.none() | counts.filter(bool), st.none()
)
#: Leases from 10 s, as windows (a lease is the window of its places' hits).
slots = st.builds(
    Slots, counts.filter(bool), st.sampled_from([w for w in WINDOWS if w <= MAX_LEASE])
)
in_flight = st.tuples(slots.map(lambda s: [s]), st.just(IN_FLIGHT), st.none(), st.none())
limit_specs = st.lists(st.one_of(sliding, leaky, in_flight), min_size=1, max_size=3)
#: A request's cost: mostly 1, sometimes 2 to 5, sometimes above every limit (counts and
#: bursts are at most 12).
costs = st.sampled_from((1,) * 14 + (2, 3, 4, 5, 13, 30))
#: (limit index, subject, counted, cost): the checks of one request.
picks = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.sampled_from(SUBJECTS),
        st.sampled_from([True, True, False]),
        costs,
    ),
    min_size=1,
    max_size=3,
)
MOVES = (
    "inside",
    "fine edge",
    "coarse edge",
    "level edge",
    "window",
    "retry_after",
    "reset",
    "past every TTL",
    "period edge",
)


def _given(rates: list[Rate]) -> tuple[Rate, ...]:
    """Rates as a decorator's text gives them (sorted: the scope spells them in order), the
    quotas after them as a limit's quota is."""
    plain = [r for r in rates if type(r) is not calendar.Quota]
    quotas = tuple(r for r in rates if type(r) is calendar.Quota)
    return (parse(";".join(r.text for r in plain)) if plain else ()) + quotas


class LimiterMachine(RuleBasedStateMachine):
    """Requests, resets and clock moves on the configured backend and on the model."""

    def __init__(self) -> None:
        super().__init__()
        self.stack = contextlib.ExitStack()
        self.limits: list[Limit] = []
        self.model = Model(60, False)
        self.clock: FrozenClock | None = None
        self.last: list[ModelResult] = []
        #: The places admitted in-flight checks took, given back or not: (check, its result,
        #: the model's).
        self.held: list[tuple[Check, Result, ModelResult]] = []
        self.resets = 0
        self.failures: list[logging.LogRecord] = []

    @initialize(
        specs=limit_specs,
        layout=st.sampled_from(LAYOUTS),
        start=st.integers(0, 86_400_000),
    )
    def start(
        self,
        specs: list[tuple[list[Rate], str, int | None, BanSpec | None]],
        layout: tuple[bool, int],
        start: int,
    ) -> None:
        hierarchical, per_window = layout
        run = next(_examples)  # fresh groups: no counter of another example is read
        self.limits = []
        for n, (rates, algorithm, burst, ban) in enumerate(specs):
            # Rates as a decorator's text gives them (sorted; the scope spells them in order).
            given = tuple(rates) if algorithm == IN_FLIGHT else _given(rates)
            self.limits.append(Limit(f"model-{run}-{n}", given, algorithm, burst, ban))
        self.model = Model(per_window, hierarchical)
        self.stack.enter_context(mock.patch.object(windows, "HIERARCHICAL", hierarchical))
        self.stack.enter_context(mock.patch.object(windows, "BUCKETS_PER_WINDOW", per_window))
        self.clock = self.stack.enter_context(frozen_clock(T0 + start / 1000))
        handler = _Collect(self.failures)
        log = logging.getLogger("ratelimit_app")
        log.addHandler(handler)
        self.stack.callback(log.removeHandler, handler)

    def teardown(self) -> None:
        self.stack.close()
        forget_refusals()  # this example's (the suite keeps the memory on)

    @property
    def now(self) -> float:
        assert self.clock is not None
        return self.clock.t

    @invariant()
    def no_backend_failure(self) -> None:
        """Not even one that ``check_many`` swallows (a take-back that failed)."""
        assert not self.failures, [r.getMessage() for r in self.failures]

    def _discard_if_outlived(self) -> None:
        # A key may have expired on the real server: the example says nothing either way.
        assume(not self.model.outlived(self.now))

    @rule(
        chosen=picks,
        policy=st.sampled_from(sorted(POLICIES)),
        exact=st.booleans(),
        times=repeats,
    )
    def request(
        self, chosen: list[tuple[int, str, bool, int]], policy: str, exact: bool, times: int
    ) -> None:
        """``times`` identical requests, each checking its limits in one ``check_many``."""
        checks, used = [], set()
        for index, ip, increment, cost in chosen:
            n = index % len(self.limits)
            if n not in used:  # a request checks each of its limits once
                used.add(n)
                checks.append(self.limits[n].check(ip, increment, cost))
        model_policy, given = POLICIES[policy]
        event(f"a request, {'repeated' if times > 3 else 'once to three times'}")
        for attempt in range(times):
            self._discard_if_outlived()
            expected = self.model.check_many(checks, model_policy, exact, self.now)
            got = self._check_many(checks, given, exact)
            self.no_backend_failure()  # first: a swallowed failure also changes the results
            where = f"request {attempt + 1} of {times} at t={self.now!r}"
            assert [observed(r) for r in got] == [observed(r) for r in expected], where
            assert self._remembered(checks, got) == [r.remembered for r in expected], where
            self.last = expected
            for c, g, r in zip(checks, got, expected, strict=True):
                if c.algorithm == IN_FLIGHT and not r.limited and r.plan is not None:
                    self.held.append((c, g, r))
                _tell(c, r)
            if any(r.limited for r in expected):
                event(f"a refusal, take-back policy {policy!r}")
            if any(e.value >= 10 for e in self.model.entries.values()):
                event("a counter at 10 or more")
        if self.model.digits_dropped:
            event("a take-back dropped a digit (memcached pads the count)")

    def _check_many(self, checks: list[Check], given: Any, exact: bool) -> list[Result]:
        """``check_many`` (``given``: its take-back policy, None for its default)."""
        if given is None:
            return check_many(checks, exact=exact)
        return check_many(checks, take_back=given, exact=exact)

    def _take_back(self, check: Check, got: Result) -> None:
        take_back([check], [got])

    def _remembered(self, checks: Sequence[Check], got: Sequence[Result]) -> list[bool]:
        """For each check, whether the refusal memory holds its result just returned."""
        found = [RUNTIME.refusals.recall(refusal_key(c), self.now) for c in checks]
        return [f is not None and f[1][1] is r for f, r in zip(found, got, strict=True)]

    @precondition(lambda self: self.held)
    @rule(index=st.integers(0, 12))
    def release(self, index: int) -> None:
        """The response of an admitted in-flight request is done: its place is given back,
        as the adapters give it (``take_back``). A place given back already may be given
        again (a stream closed after an error): nothing more is taken."""
        self._discard_if_outlived()
        check, got, expected = self.held[index % len(self.held)]
        event("a place given back" + (" again" if expected.plan is None else ""))
        self._take_back(check, got)
        self.model.release(check, expected, self.now)

    @property
    def resettable(self) -> list[Limit]:
        """The limits ``core.reset`` can name by a decorator's arguments (not in-flight)."""
        return [limit for limit in self.limits if limit.algorithm != IN_FLIGHT]

    @precondition(lambda self: self.resets < MAX_RESETS and self.resettable)
    @rule(index=st.integers(0, 2), ip=st.sampled_from(SUBJECTS))
    def reset_subject(self, index: int, ip: str) -> None:
        limits = self.resettable
        limit = limits[index % len(limits)]
        self._discard_if_outlived()
        self.resets += 1
        assert reset(
            limit.group,
            ip,
            key="ip",
            rate=limit.rates
            if any(type(r) is calendar.Quota for r in limit.rates)
            else limit.text,
            algorithm=limit.algorithm,
            burst=limit.burst,
        )
        self.model.forget(namespace(scope(limit.group, ALL, limit.rates), "ip", ip))

    @rule(
        move=st.sampled_from(MOVES),
        index=st.integers(0, 8),
        fraction=st.floats(0, 1, exclude_max=True),
        nudge=st.sampled_from([0.0, -0.001, 0.001]),
    )
    def move_clock(self, move: str, index: int, fraction: float, nudge: float) -> None:
        """Forward only: a clock that goes back is another property (never lenient), and
        Redis drops the fields of a hash that a forward clock never reads again."""
        t = self.now
        every = [r for limit in self.limits for r in limit.rates]
        r = every[index % len(every)]
        g = self.model.per_window
        width = r.seconds / g
        if move == "inside":
            target = t + fraction * width
        elif move in ("fine edge", "coarse edge", "level edge"):
            if move == "fine edge":
                size = width
            elif move == "coarse edge":
                size = width * windows.coarse_factor(g)
            else:
                size = float(windows.LEVELS[index % len(windows.LEVELS)])
            target = (math.floor(t / size) + 1) * size + nudge
        elif move == "window":
            target = t + r.seconds + nudge
        elif move == "period edge":  # where a quota's period ends (a rate's: its window)
            quotas = [q for q in every if type(q) is calendar.Quota]
            q = quotas[index % len(quotas)] if quotas else None
            target = (t + r.seconds if q is None else calendar.renews(q, t)) + nudge
        elif move in ("retry_after", "reset"):
            waits = [
                u.retry_after if move == "retry_after" else u.reset
                for result in self.last
                for u in result.usages
            ]
            waits = [w for w in waits if w > 0] or [width]
            target = t + waits[index % len(waits)] + nudge
        else:  # past every TTL: nothing written so far is read again
            target = t + 2 * max(WINDOWS) + 3600 + fraction * 86400
        if target > t:
            assert self.clock is not None
            self.clock.set(target)
            event(f"clock move: {move}")


def _tell(c: Check, r: ModelResult) -> None:
    """The events of one check (``--hypothesis-show-statistics``)."""
    kind = "counted" if c.increment else "look"
    event(f"{c.algorithm} {kind}: {'limited' if r.limited else 'admitted'}")
    if c.cost > 1:
        event(f"a cost of {'2 to 5' if c.cost <= 5 else 'over the limit'}")
    if c.ban is not None and r.limited and c.increment:
        event(f"a strike{' that bans' if r.reaches_ban else ''}")


class _Collect(logging.Handler):
    """Collects what the limiter logs at INFO and above: a backend failure, or a take-back
    that failed (which ``check_many`` only logs)."""

    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.INFO)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


# -- the backends -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def more_memcached() -> Iterator[list[str]]:
    """Two memcached servers beside the session's, for a three-node backend."""
    from tests.servers import start_memcached

    servers = [start_or_skip(start_memcached) for _ in range(2)]
    yield [s.address for s in servers]
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[Any]:
    """Three Redis nodes in cluster mode (the cluster of the cluster tests)."""
    from tests.servers.redis_cluster import Cluster

    cluster = start_or_skip(Cluster)
    try:
        yield cluster
    finally:
        cluster.stop()


def backend_settings(kind: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """``override_settings`` keyword arguments that count on ``kind`` (alias "rl")."""
    memcached = "django.core.cache.backends.memcached.PyMemcacheCache"
    if kind == "locmem":
        config: dict[str, Any] = {**LOCMEM, "LOCATION": "model"}
    elif kind == "django-redis-cache":
        location = request.getfixturevalue("redis_server")
        config = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": location}
    elif kind == "memcached":
        config = {"BACKEND": memcached, "LOCATION": request.getfixturevalue("memcached_server")}
    elif kind == "memcached-3-nodes":
        nodes = [request.getfixturevalue("memcached_server")]
        nodes += request.getfixturevalue("more_memcached")
        config = {"BACKEND": memcached, "LOCATION": nodes}
    elif kind == "redis":
        config = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": request.getfixturevalue("redis_server"),
        }
    else:
        cluster = request.getfixturevalue("redis_cluster")
        config = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{cluster.ports[0]}/0",
        }
        return {
            "CACHES": {"default": LOCMEM, "rl": config},
            "RATELIMIT_USE_CACHE": "rl",
            "RATELIMIT_BACKEND": "ratelimit_app.backends.redis.RedisClusterBackend",
        }
    return {"CACHES": {"default": LOCMEM, "rl": config}, "RATELIMIT_USE_CACHE": "rl"}


BACKEND_KINDS = (
    "locmem",
    "django-redis-cache",
    "memcached",
    "memcached-3-nodes",
    "redis",
    "redis-cluster",
)


class AsyncLimiterMachine(LimiterMachine):
    """The same requests through the async path: the engine's checks run by the event
    loop's driver (:func:`~ratelimit_app.engine.trips.arun`), each round trip through the
    backend's ``aexecute``, on one loop for the whole run."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()

    def teardown(self) -> None:
        super().teardown()
        self.loop.close()

    def _check_many(self, checks: list[Check], given: Any, exact: bool) -> list[Result]:
        if given is None:
            checking = checking_many(checks, exact=exact)
        else:
            checking = checking_many(checks, take_back=given, exact=exact)
        return self.loop.run_until_complete(arun(checking))

    def _take_back(self, check: Check, got: Result) -> None:
        self.loop.run_until_complete(arun(taking_back([check], [got])))


@pytest.mark.django_db  # the configuration in force is read (run alone, no test loaded it)
@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_backend_agrees_with_the_model(kind: str, request: pytest.FixtureRequest) -> None:
    with override_settings(**backend_settings(kind, request)):
        reset_backends()
        try:
            run_state_machine_as_test(LimiterMachine, settings=SETTINGS)
        finally:
            reset_backends()


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["memcached-3-nodes", "redis", "redis-cluster"])
def test_the_async_path_agrees_with_the_model(kind: str, request: pytest.FixtureRequest) -> None:
    """The native ``aexecute`` of memcached (several nodes: placement and all, one code
    path with one node), Redis and Redis Cluster against the model, as the sync path is.
    (A Django cache's is ``execute`` in a thread: the sync path's test covers it.)"""
    with override_settings(**backend_settings(kind, request)):
        reset_backends()
        try:
            run_state_machine_as_test(AsyncLimiterMachine, settings=SETTINGS)
        finally:
            reset_backends()


def test_the_model_expires_what_no_plan_reads_again() -> None:
    """The model alone: counters and TATs a check wrote are gone from the dict once the
    clock is past their TTLs, and a reset forgets a subject whole."""
    model = Model(60, False)
    limit = Limit("model-alone", parse("2/m;5/h"), SLIDING_WINDOW, None)
    meter = Limit("model-alone-meter", parse("2/m"), LEAKY_BUCKET, None)
    checks = [limit.check(SUBJECTS[0], True), meter.check(SUBJECTS[0], True)]
    for _ in range(3):
        results = model.check_many(checks, refused_counted, True, T0)
    assert [r.limited for r in results] == [True, True]
    assert [u.count for u in results[0].usages] == [3, 3]
    assert len(model.entries) == 5  # fine and coarse of two windows, and a TAT
    later = T0 + 2 * 3600 + 600
    assert model.check_many(checks, refused_counted, True, later)[0].usages[1].count == 1
    model.forget(namespace(checks[0].scope, *checks[0].subject))
    assert [k[1] for k in model.entries] == [gcra.SUFFIX]
