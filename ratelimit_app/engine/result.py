"""What a check found (:class:`Result`), and django-ratelimit's usage dict of it."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from ratelimit_app import clock
from ratelimit_app.algorithms import calendar, gcra, windows
from ratelimit_app.algorithms.calendar import Quota
from ratelimit_app.backends.base import MeterReply
from ratelimit_app.config import kinds
from ratelimit_app.config.limits import Check
from ratelimit_app.identity.namespaces import namespace


class Result:
    """Outcome of one check of one subject (built on every request: a plain slotted class,
    cheaper to make than a frozen dataclass)."""

    __slots__ = (
        "banned",
        "in_memory",
        "limited",
        "meter",
        "namespace",
        "plan",
        "reaches_ban",
        "reply",
        "settled",
        "usages",
    )

    #: Counted in this process's memory while the counters were down (set on such results
    #: only: read it with ``getattr(result, "in_memory", False)``; :mod:`..fallback`).
    in_memory: bool
    #: Seconds a refusal surely lasts, counting only the hits made
    #: :data:`~ratelimit_app.engine.refusals.remembered.SETTLED` seconds or more before
    #: (admitted ones): set on refusals whose waits were timed from fine buckets only (read
    #: it with ``getattr(result, "settled", 0.0)``; :mod:`ratelimit_app.engine.refusals`).
    settled: float

    def __init__(
        self, usages: list[windows.Usage], namespace: str, meter: gcra.State | None = None
    ) -> None:
        self.usages = usages
        self.namespace = namespace
        #: A leaky bucket's state (its one usage is derived from it); None for sliding
        #: windows.
        self.meter = meter
        #: What a take-back needs to undo an admitted hit: the sliding windows' plan that
        #: counted it, or the leaky bucket's reply that stored it (None: nothing held).
        self.plan: windows.Plan | None = None
        self.reply: MeterReply | None = None
        #: True when any rate is over its limit.
        self.limited = usages[0].limited if len(usages) == 1 else any([u.limited for u in usages])
        #: A refusal that brings the subject's refusals to its limit's ban (``Check.ban``),
        #: and a refusal by a ban (:mod:`ratelimit_app.bans.applied`).
        self.reaches_ban = self.banned = False

    def __repr__(self) -> str:
        return f"Result({self.usages!r}, {self.namespace!r}, meter={self.meter!r})"

    def binding(self) -> windows.Usage:
        """The rate that decides: the limited one that frees up last, else the tightest."""
        return binding(self.usages)

    def counted_down(self, elapsed: float) -> Result:
        """This refusal, made ``elapsed`` seconds ago, with its waits counted down (the
        refusal memory's answer, :mod:`ratelimit_app.engine.refusals`)."""
        usages = [
            windows.Usage(
                u.rate,
                u.count,
                0 if u.limited else u.remaining,
                u.limited,
                max(0.0, u.retry_after - elapsed),
                max(0.0, u.reset - elapsed),
            )
            for u in self.usages
        ]
        return Result(usages, self.namespace, self.meter)


def binding(usages: list[windows.Usage]) -> windows.Usage:
    """The rate of ``usages`` (one limit's) that decides: the limited one that frees up
    last, else the tightest."""
    if len(usages) == 1:  # the common case: one rate
        return usages[0]
    limited = [u for u in usages if u.limited]
    if limited:
        return max(limited, key=lambda u: u.retry_after)
    return min(usages, key=lambda u: (u.remaining, -u.reset))


def banned(c: Check, wait: float) -> Result:
    """A check's refusal by its ban (:mod:`ratelimit_app.bans`): every rate over, to be
    waited out until the ban ends."""
    usages = [windows.Usage(r, r.count, 0, True, wait, wait) for r in c.rates]
    found = Result(usages, namespace(c.scope, *c.subject))
    found.banned = True
    return found


def meter_result(state: gcra.State, ns: str) -> Result:
    """A leaky bucket's state as a :class:`Result`: its usage counts the level rounded up,
    and resets when the bucket is empty."""
    usage = windows.Usage(
        state.meter.rate,
        state.count,
        state.remaining,
        state.limited,
        state.retry_after,
        state.empty_in,
    )
    return Result([usage], ns, state)


def _rate_entry(u: windows.Usage, limit: int) -> dict[str, Any]:
    """One rate's entry of the usage dict's ``rates`` (a quota's with when it renews)."""
    entry = {
        "rate": u.rate.text,
        "window": u.rate.seconds,
        "count": u.count,
        "limit": limit,
        "remaining": u.remaining,
        "reset": math.ceil(u.reset),
        "should_limit": u.limited,
    }
    if type(u.rate) is Quota:
        entry.update(renewal(u.rate))
    return entry


def renewal(quota: Quota) -> dict[str, Any]:
    """When ``quota``'s period (now, on the limiter's clock) ends: ``renews``, the instant
    in ISO 8601 in its zone, and ``renews_in``, the whole seconds until then."""
    now = clock.now()
    ends = calendar.renews(quota, now)
    instant = datetime.fromtimestamp(ends, calendar.zone_info(quota.zone))
    return {"renews": instant.isoformat(), "renews_in": math.ceil(ends - now)}


def usage_dict(result: Result) -> dict[str, Any]:
    """django-ratelimit's dict (count, limit, should_limit, time_left) plus our fields, and
    those of the result's kind of limit (:meth:`~ratelimit_app.config.kinds.Kind.add_usage`).

    For a leaky bucket, ``count`` is the level rounded up, ``limit`` the capacity, ``reset``
    (and ``time_left``) the seconds until the bucket is empty, and ``level`` (fractional)
    and ``capacity`` are added.
    """
    state = result.meter  # (None: a kind whose results carry no state, its limit the rate's)
    kind = kinds.of_state(state)
    u = result.binding()
    rate = u.rate
    limit = rate.count if state is None else kind.limit_of(rate, state)
    if len(result.usages) == 1:
        each = [_rate_entry(u, limit)]
    elif state is None:
        each = [_rate_entry(x, x.rate.count) for x in result.usages]
    else:
        each = [_rate_entry(x, kind.limit_of(x.rate, state)) for x in result.usages]
    reset = math.ceil(u.reset)
    usage: dict[str, Any] = {
        "count": u.count,
        "limit": limit,
        "should_limit": result.limited,
        # django-ratelimit's meaning: at most the period. ``reset`` is exact, and may pass the
        # period by up to one fine bucket: the oldest bucket counts in full (never lenient).
        "time_left": reset if reset < rate.seconds else rate.seconds,
        "remaining": u.remaining,
        "reset": reset,
        "retry_after": max(1, math.ceil(u.retry_after)) if result.limited else 0,
        "rate": rate.text,
        "rates": each,
        "algorithm": kind.name,
    }
    if state is not None:
        kind.add_usage(usage, state)
    for entry in each:  # a quota's entry says when it renews (a limit has one at most)
        if "renews" in entry:
            usage["renews"], usage["renews_in"] = entry["renews"], entry["renews_in"]
            break
    return usage


def failure_dict() -> dict[str, Any]:
    """What a fail-closed check reports when the backend failed (django-ratelimit's)."""
    return {
        "count": 0,
        "limit": 0,
        "should_limit": True,
        "time_left": -1,
        "remaining": 0,
        "reset": -1,
        "retry_after": 1,
        "rate": None,
        "rates": [],
    }
