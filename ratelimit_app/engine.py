"""The engine: one request's checks in one backend round trip, and the refusals remembered.

A check (:class:`Check`) names a subject's limit; :func:`check_many` plans the buckets of
every sliding window (:mod:`ratelimit_app.windows`) and the meter of every leaky bucket
(:mod:`ratelimit_app.gcra`), runs them on the backend together
(:meth:`~ratelimit_app.backends.base.Backend.exchange`), and evaluates each into a
:class:`Result`. A refused hit is taken back; a refusal whose wait is exact is remembered by
this process (:data:`REFUSALS`, :mod:`ratelimit_app.refusals`) and answered from memory while
it lasts (:func:`recall_many`). :func:`usage_dict` reports a result as django-ratelimit's
usage dict. The middleware, the decorator, the django-ratelimit API
(:mod:`ratelimit_app.core`), the DRF throttles and the admin's operations
(:mod:`ratelimit_app.operations`) all check through here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from django.core import mail
from django.core.signals import setting_changed
from django.dispatch import receiver

from ratelimit_app import clock, gcra, rates, refusals, windows
from ratelimit_app.backends import get_backend
from ratelimit_app.backends.base import MeterOp, MeterReply, Op
from ratelimit_app.conf import affects_limiter, conf
from ratelimit_app.exceptions import BackendError
from ratelimit_app.gcra import LEAKY_BUCKET, SLIDING_WINDOW
from ratelimit_app.keys import namespace
from ratelimit_app.signals import backend_failed

logger = logging.getLogger("ratelimit_app")


class Result:
    """Outcome of one check of one subject (built on every request: a plain slotted class,
    cheaper to make than a frozen dataclass)."""

    __slots__ = ("limited", "meter", "namespace", "plan", "reply", "usages")

    def __init__(
        self, usages: list[windows.Usage], namespace: str, meter: gcra.State | None = None
    ) -> None:
        self.usages = usages
        self.namespace = namespace
        #: A leaky bucket's state (its one usage is derived from it); None for sliding
        #: windows.
        self.meter = meter
        #: What :func:`take_back` needs to undo an admitted hit: the sliding windows' plan
        #: that counted it, or the leaky bucket's reply that stored it (None: nothing stored).
        self.plan: windows.Plan | None = None
        self.reply: MeterReply | None = None
        #: True when any rate is over its limit.
        self.limited = usages[0].limited if len(usages) == 1 else any([u.limited for u in usages])

    def __repr__(self) -> str:
        return f"Result({self.usages!r}, {self.namespace!r}, meter={self.meter!r})"

    def binding(self) -> windows.Usage:
        """The rate that decides: the limited one that frees up last, else the tightest."""
        usages = self.usages
        if len(usages) == 1:  # the common case: one rate
            return usages[0]
        limited = [u for u in usages if u.limited]
        if limited:
            return max(limited, key=lambda u: u.retry_after)
        return min(usages, key=lambda u: (u.remaining, -u.reset))


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


class Check(NamedTuple):
    """One subject's limit to check: its scope (:meth:`~ratelimit_app.limits.Limit.scope_for`),
    subject, rates, and whether
    this request counts (``increment``) or only looks; the ``algorithm``, and the ``burst``
    (capacity) of a leaky bucket (None: the rate's count)."""

    scope: str
    subject: tuple[str, str]
    rates: tuple[rates.Rate, ...]
    increment: bool
    algorithm: str = SLIDING_WINDOW
    burst: int | None = None


def _limited_counted(checks: Sequence[Check], results: list[Result]) -> set[int]:
    return {i for i, r in enumerate(results) if r.limited and checks[i].increment}


TakeBack = Callable[[Sequence[Check], list[Result]], set[int]]


class _Job:
    """A check whose request was refused somewhere, on its way through the second round
    trip of :func:`check_many` (:class:`_Windowed` or :class:`_Metered`)."""

    __slots__ = ("check", "namespace", "result", "undo")
    check: Check
    namespace: str
    result: Result
    #: Its hit is to be taken back (see ``take_back`` in :func:`check_many`).
    undo: bool


class _Windowed(_Job):
    __slots__ = ("detail", "plan")

    def __init__(self, check: Check, namespace: str, plan: windows.Plan, result: Result) -> None:
        self.check, self.namespace, self.plan, self.result = check, namespace, plan, result
        self.undo = False
        #: A refused check's fine buckets, read to time its wait exactly.
        self.detail: windows.Plan | None = None


class _Metered(_Job):
    __slots__ = ("admitted", "meter")

    def __init__(self, check: Check, namespace: str, meter: gcra.Meter, result: Result) -> None:
        self.check, self.namespace, self.meter, self.result = check, namespace, meter, result
        self.undo = False
        #: Its admitted hit, as stored (what a take-back compares against).
        self.admitted: MeterReply | None = result.reply


def check_many(
    checks: Sequence[Check],
    take_back: TakeBack = _limited_counted,
    exact: bool = True,
    at: float | None = None,
) -> list[Result]:
    """Check several subjects (the rules of one request) in one backend round trip.

    When a check is over its limit, a second round trip takes back the hits that
    ``take_back`` names (default: the refused ones; a request refused by one rule may take
    back what the others counted) and, with ``exact``, reads the fine buckets of the
    limited checks to time their waits exactly. A leaky bucket stores nothing for a refused
    request, and its wait is exact from the start: its part of the second round trip only
    takes back requests it admitted (when another rule refused them). Raises
    ``BackendError``, and ``ImproperlyConfigured`` for a leaky bucket whose rates (from a
    callable) or burst do not make one. ``at``: the time of the check (default: now, by
    :func:`ratelimit_app.clock.now`), for a caller with a clock of its own (DRF's
    ``timer``).
    """
    t = clock.now() if at is None else at
    now_us = gcra.micros(t)
    per_window, hierarchical = conf.BUCKETS_PER_WINDOW, conf.HIERARCHICAL
    # Each check's namespace and its plan (sliding windows) or meter (a leaky bucket).
    namespaces: list[str] = []
    layouts: list[windows.Plan | gcra.Meter] = []
    ops: list[Op] = []
    meter_ops: list[MeterOp] = []
    for c in checks:
        ns = namespace(c.scope, *c.subject)
        namespaces.append(ns)
        if c.algorithm == LEAKY_BUCKET:
            meter = gcra.meter(c.rates, c.burst)
            layouts.append(meter)
            meter_ops.append(MeterOp(ns, meter, c.increment))
        else:
            p = windows.plan(c.rates, t, per_window, hierarchical)
            layouts.append(p)
            ops.append(Op(ns, p, c.increment))
    backend = get_backend()
    values, replies = backend.exchange(ops, meter_ops, now_us)
    results: list[Result] = []
    windowed, metered = iter(values), iter(replies)
    for c, ns, layout in zip(checks, namespaces, layouts, strict=True):
        if isinstance(layout, windows.Plan):
            r = Result(windows.evaluate(layout, next(windowed), t, c.increment), ns)
            if c.increment:
                r.plan = layout
        else:
            reply = next(metered)
            state = gcra.outcome(layout, reply.read, reply.written, now_us, c.increment)
            r = meter_result(state, ns)
            if reply.written is not None:
                r.reply = reply
        results.append(r)
    for r in results:
        if r.limited:
            break
    else:  # the common case: nothing refused, one round trip
        return results
    # Someone was refused: each check becomes a job of the second round trip.
    jobs: list[_Job] = [
        _Windowed(c, ns, layout, r)
        if isinstance(layout, windows.Plan)
        else _Metered(c, ns, layout, r)
        for c, ns, layout, r in zip(checks, namespaces, layouts, results, strict=True)
    ]
    windowed_jobs = [j for j in jobs if isinstance(j, _Windowed)]
    metered_jobs = [j for j in jobs if isinstance(j, _Metered)]
    # A refused hit does not use up the quota: a client that keeps retrying gets in as soon
    # as the window has room. Counting first and taking back after keeps the check one round
    # trip for admitted hits and never lenient under concurrency.
    for i in take_back(checks, results):
        job = jobs[i]
        if job.check.increment:
            job.undo = True
            # Taken back below (or, if that fails, left counted): never again.
            job.result.plan = job.result.reply = None
    # A check reads whole coarse buckets in the middle of its windows: enough to count, not
    # to know when each hit leaves. Read every fine bucket of the limited checks, in the
    # same round trip as the take-backs, to time the waits exactly; the counts stay as the
    # check saw them. (Hierarchical: waits stay conservative by up to one coarse bucket.)
    coarse = hierarchical or windows.coarse_factor(per_window) > 1
    if exact and coarse and not hierarchical:
        for w in windowed_jobs:
            if w.result.limited:
                w.detail = windows.plan(w.check.rates, t, per_window, fine_only=True)
    # The refusals whose waits are exact: a leaky bucket's, a sliding window's read from fine
    # buckets alone (a single-level layout), and those the detail read below times.
    timed: list[_Job] = [m for m in metered_jobs if m.result.limited]
    timed += [
        w for w in windowed_jobs if w.result.limited and (not coarse or w.detail is not None)
    ]
    second = [w for w in windowed_jobs if w.undo or w.detail is not None]
    untake = [m for m in metered_jobs if m.undo and m.admitted is not None]
    if not second and not untake:
        _remember(timed, t)
        return results
    try:
        values, _ = backend.exchange(
            [
                Op(w.namespace, w.detail or w.plan, False, w.plan if w.undo else None)
                for w in second
            ],
            [MeterOp(m.namespace, m.meter, take_back=m.admitted) for m in untake],
            now_us,
        )
    except BackendError as exc:
        # Whether the hits were taken back is unknown: leaving them counted is the safe side
        # (trying again could take them back twice, which would be lenient).
        logger.info("ratelimit: could not take back refused hits: %s", exc)
        return results
    for w, v in zip(second, values, strict=True):
        if w.detail is not None:
            w.result = Result(windows.refine(w.result.usages, w.detail, v, t), w.namespace)
    _remember(timed, t)
    return [job.result for job in jobs]


#: This process's refusals (:mod:`ratelimit_app.refusals`), shared by the middleware, the
#: decorator, ``get_usage`` and the DRF throttles: each check refused, and its result.
REFUSALS: refusals.Memory[tuple[Check, Result]] = refusals.Memory()
#: Checks one look confirms at most: the request's due refusals and others due soon.
LOOK_BATCH = 256
refusals.after_fork(REFUSALS)


def refusal_key(c: Check) -> tuple[Any, ...]:
    """What a refusal is remembered by: the limit's counters of one subject."""
    return (c.scope, c.subject, c.algorithm, c.burst)


#: Whether refusals are remembered inside Django's test environment too
#: (:func:`ratelimit_app.testing.remember_refusals`).
_IN_TESTS = [False]


def remembers() -> bool:
    """False while Django's test environment is set up (``manage.py test``, pytest-django:
    :func:`django.test.utils.setup_test_environment` gives ``django.core.mail`` its
    ``outbox``), unless a test asked for the memory. A test suite resets limits with
    ``cache.clear()``, which no process memory can see; without the memory every check asks
    the counters, so that reset is whole (and nothing else changes: the memory only saves
    round trips)."""
    return _IN_TESTS[0] or not hasattr(mail, "outbox")


def remember_in_tests(on: bool) -> bool:
    """Keep the memory on (or not) inside the test environment; returns the previous
    choice."""
    before, _IN_TESTS[0] = _IN_TESTS[0], on
    return before


def _remember(timed: list[_Job], t: float) -> None:
    """Remember the refusals of counted checks whose waits are exact."""
    cap = conf.REFUSAL_MEMORY
    if cap <= 0 or not remembers():
        return
    REFUSALS.size = conf.REFUSAL_MEMORY_SIZE
    for job in timed:
        c, r = job.check, job.result
        if c.increment and r.limited:
            wait = r.binding().retry_after
            REFUSALS.remember(refusal_key(c), t, t + min(wait, cap), (c, r), t + wait)


def recall(c: Check, t: float) -> Result | None:
    """The result of a check refused from memory (no round trip), with its waits counted
    down; None when the subject is not remembered as refused."""
    return _recalled(refusal_key(c), t)


def _recalled(key: tuple[Any, ...], t: float) -> Result | None:
    found = REFUSALS.recall(key, t)
    if found is None:
        return None
    elapsed, (_, r) = found
    return _counted_down(elapsed, r)


def recall_many(checks: Sequence[Check | None], t: float | None = None) -> list[Result | None]:
    """:func:`recall` for the checks of one request (None: a check not to recall).

    When none is refused from memory but some are **due** (the memory's cap ran out before
    the wait: :meth:`~ratelimit_app.refusals.Memory.due`), the due ones are confirmed in one
    round trip that only looks (no writes, where a counted check that is refused makes two:
    count, then take back): still no room, and they are refused and remembered again with
    the waits they had; room after all (a reset or a rule changed elsewhere), and they are
    forgotten, for the caller's counted check. The same look confirms the other refusals
    whose caps run out within half a cap (:meth:`~ratelimit_app.refusals.Memory.soon`, up
    to :data:`LOOK_BATCH` checks in all): confirming early is as safe as on time (a fresh
    read), and their next caps then run out together. So a botnet of subjects each over its
    limit costs a few looks per process per ``RATELIMIT_REFUSAL_MEMORY``, not one per
    subject. A look that fails confirms nothing: the caller's check decides (and meets the
    outage).
    """
    if not REFUSALS:  # nothing refused lately, nothing to look up
        return [None] * len(checks)
    keys = [None if c is None else refusal_key(c) for c in checks]
    if not REFUSALS.holds(keys):  # the common case: refusals, but not of these subjects
        return [None] * len(checks)
    if t is None:
        t = clock.now()
    found = [None if k is None else _recalled(k, t) for k in keys]
    if any(found):
        return found
    due: list[tuple[int | None, Check, float, float, Result]] = []
    for i, (c, k) in enumerate(zip(checks, keys, strict=True)):
        if c is not None and k is not None and c.increment:
            entry = REFUSALS.due(k, t)
            if entry is not None:
                elapsed, left, (_, r) = entry
                due.append((i, c, elapsed, left, r))
    if not due:
        return found
    cap = conf.REFUSAL_MEMORY
    mine = [refusal_key(c) for _, c, *_ in due]
    for _, elapsed, left, (c, r) in REFUSALS.soon(t, cap / 2, LOOK_BATCH - len(due), mine):
        due.append((None, c, elapsed, left, r))
    looks = [c._replace(increment=False) for _, c, *_ in due]
    try:
        seen = check_many(looks, exact=False, at=t)
    except BackendError:
        return found
    for (slot, c, elapsed, left, r), look in zip(due, seen, strict=True):
        if look.limited:
            now = _counted_down(elapsed, r)
            REFUSALS.remember(refusal_key(c), t, t + min(left, cap), (c, now), t + left)
            if slot is not None:  # this request's own check (not one due soon)
                found[slot] = now
        else:
            REFUSALS.forget([refusal_key(c)])
    return found


def _counted_down(elapsed: float, r: Result) -> Result:
    """``r``, a refusal made ``elapsed`` seconds ago, with its waits counted down."""
    usages = [
        windows.Usage(
            u.rate,
            u.count,
            0 if u.limited else u.remaining,
            u.limited,
            max(0.0, u.retry_after - elapsed),
            max(0.0, u.reset - elapsed),
        )
        for u in r.usages
    ]
    return Result(usages, r.namespace, r.meter)


@receiver(setting_changed)
def _forget_refusals(*, setting: str, **kwargs: Any) -> None:
    # Rules, backends and keys may mean something else now.
    if affects_limiter(setting):
        REFUSALS.clear()


def take_back(checks: Sequence[Check], results: Sequence[Result]) -> None:
    """Take back the hits ``results`` counted and still hold, in one round trip: a
    failure-only rule's provisional hit when the request turned out not to be a failure.

    A leaky bucket's hit is taken back only if nothing has changed its bucket since (else it
    stays counted: the safe side). Raises ``BackendError``; either way the results hold
    nothing more to take back.
    """
    ops: list[Op] = []
    meter_ops: list[MeterOp] = []
    for c, r in zip(checks, results, strict=True):
        if r.plan is not None:
            ops.append(Op(r.namespace, r.plan, False, r.plan))
        elif r.reply is not None:
            meter_ops.append(MeterOp(r.namespace, gcra.meter(c.rates, c.burst), take_back=r.reply))
        r.plan = r.reply = None
    if ops or meter_ops:
        get_backend().exchange(ops, meter_ops, gcra.micros(clock.now()))


def check(
    group: str,
    subject: tuple[str, str],
    rate_list: tuple[rates.Rate, ...],
    increment: bool,
    algorithm: str = SLIDING_WINDOW,
    burst: int | None = None,
) -> Result:
    """Count (if ``increment``) and read one subject's windows, or meter its leaky bucket.
    Raises ``BackendError``."""
    return check_many([Check(group, subject, rate_list, increment, algorithm, burst)])[0]


def usage_dict(result: Result) -> dict[str, Any]:
    """django-ratelimit's dict (count, limit, should_limit, time_left) plus our fields.

    For a leaky bucket, ``count`` is the level rounded up, ``limit`` the capacity, ``reset``
    (and ``time_left``) the seconds until the bucket is empty, and ``level`` (fractional)
    and ``capacity`` are added.
    """
    usages = result.usages
    state = result.meter
    if len(usages) == 1:
        # The common case, one rate: the entry of ``rates`` repeats the usage's own fields.
        u = usages[0]
        rate = u.rate
        limit = rate.count if state is None else state.meter.capacity
        reset = math.ceil(u.reset)
        each = [
            {
                "rate": rate.text,
                "window": rate.seconds,
                "count": u.count,
                "limit": limit,
                "remaining": u.remaining,
                "reset": reset,
                "should_limit": u.limited,
            }
        ]
    else:
        u = result.binding()
        rate = u.rate
        limit = rate.count if state is None else state.meter.capacity
        reset = math.ceil(u.reset)
        each = [
            {
                "rate": x.rate.text,
                "window": x.rate.seconds,
                "count": x.count,
                "limit": limit if state is not None else x.rate.count,
                "remaining": x.remaining,
                "reset": math.ceil(x.reset),
                "should_limit": x.limited,
            }
            for x in usages
        ]
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
        "algorithm": SLIDING_WINDOW if state is None else LEAKY_BUCKET,
    }
    if state is not None:
        usage["level"] = round(state.level, 6)
        usage["capacity"] = state.meter.capacity
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


def report_failure(exc: BackendError) -> None:
    """Log and signal a backend failure (the backend itself may not exist: bad settings)."""
    alias = conf.USE_CACHE
    logger.warning("ratelimit: counter backend %r failed: %s", alias, exc)
    backend_failed.send(sender=BackendError, alias=alias, error=exc)
