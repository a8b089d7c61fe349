"""The limiter: ``get_usage`` / ``is_ratelimited`` (django-ratelimit's API) and ``reset``.

One check = resolve the rates and the subject, plan the buckets
(:mod:`ratelimit_app.windows`), run the plan on the backend in one round trip, evaluate.
A leaky-bucket check (``algorithm="leaky_bucket"``, :mod:`ratelimit_app.gcra`) meters the
subject's bucket instead; the checks of one request, of either algorithm, go to the backend
together (:meth:`~ratelimit_app.backends.base.Backend.exchange`).
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest

from ratelimit_app import ALL, UNSAFE, clock, gcra, keys, limits, rates, refusals, store, windows
from ratelimit_app.backends import get_backend
from ratelimit_app.backends.base import MeterOp, MeterReply, Op
from ratelimit_app.conf import affects_limiter, conf
from ratelimit_app.exceptions import BackendError
from ratelimit_app.gcra import LEAKY_BUCKET, SLIDING_WINDOW
from ratelimit_app.keys import get_header, namespace, user_or_ip
from ratelimit_app.limits import Limit, Method, method_set
from ratelimit_app.rules import Rule
from ratelimit_app.signals import backend_failed, ratelimited

__all__ = [
    "ALL",
    "UNSAFE",
    "get_header",
    "get_usage",
    "is_ratelimited",
    "lookup",
    "reset",
    "user_or_ip",
]

logger = logging.getLogger("ratelimit_app")


def method_matches(request: HttpRequest, method: Method) -> bool:
    """True when the request's method is one ``method`` (as the decorators take it) names."""
    methods = method_set(method)
    return methods is None or request.method in methods


def group_name(fn: Callable[..., Any]) -> str:
    """django-ratelimit's default group: ``module.qualname`` of the view."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    parts = [getattr(fn, "__module__", "")]
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        parts.append(type(owner).__name__)
    parts.append(getattr(fn, "__qualname__", repr(fn)))
    return ".".join(p for p in parts if p)


def scope(group: str, method: Method, rate_list: tuple[rates.Rate, ...]) -> str:
    """What counters are kept apart by (:func:`ratelimit_app.rates.scope`), for a method
    spec as the decorators take it."""
    methods = method_set(method)
    return rates.scope(group, ",".join(sorted(methods)) if methods else "", rate_list)


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
        self.limited = False
        for u in usages:
            if u.limited:
                self.limited = True
                break

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
    """One subject's limit to check: its scope (:func:`scope`), subject, rates, and whether
    this request counts (``increment``) or only looks; the ``algorithm``, and the ``burst``
    (capacity) of a leaky bucket (None: the rate's count)."""

    scope: str
    subject: tuple[str, str]
    rates: tuple[rates.Rate, ...]
    increment: bool
    algorithm: str = SLIDING_WINDOW
    burst: int | None = None

    @property
    def metered(self) -> bool:
        return self.algorithm == LEAKY_BUCKET


def _limited_counted(checks: Sequence[Check], results: list[Result]) -> set[int]:
    return {i for i, r in enumerate(results) if r.limited and checks[i].increment}


TakeBack = Callable[[Sequence[Check], list[Result]], set[int]]


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
    # One pass over the checks (this runs on every request): the sliding windows' plans and
    # ops, the leaky buckets' meters and ops.
    namespaces: list[str] = []
    windowed: list[int] = []
    plans: dict[int, windows.Plan] = {}
    ops: list[Op] = []
    metered: list[int] = []
    meters: dict[int, gcra.Meter] = {}
    meter_ops: list[MeterOp] = []
    for i, c in enumerate(checks):
        ns = namespace(c.scope, *c.subject)
        namespaces.append(ns)
        if c.algorithm == LEAKY_BUCKET:
            metered.append(i)
            meters[i] = m = gcra.meter(c.rates, c.burst)
            meter_ops.append(MeterOp(ns, m, c.increment))
        else:
            windowed.append(i)
            plans[i] = p = windows.plan(c.rates, t, per_window, hierarchical)
            ops.append(Op(ns, p, c.increment))
    backend = get_backend()
    values, replies = backend.exchange(ops, meter_ops, now_us)
    results: list[Result] = [None] * len(checks)  # type: ignore[list-item]
    for i, v in zip(windowed, values, strict=True):
        usages = windows.evaluate(plans[i], v, t, counted=checks[i].increment)
        results[i] = r = Result(usages, namespaces[i])
        if checks[i].increment:
            r.plan = plans[i]
    admitted: dict[int, MeterReply] = {}
    for i, reply in zip(metered, replies, strict=True):
        state = gcra.outcome(meters[i], reply.read, reply.written, now_us, checks[i].increment)
        results[i] = r = meter_result(state, namespaces[i])
        if reply.written is not None:
            admitted[i] = r.reply = reply
    limited = {i for i, r in enumerate(results) if r.limited}
    if not limited:
        return results
    # A refused hit does not use up the quota: a client that keeps retrying gets in as soon
    # as the window has room. Counting first and taking back after keeps the check one round
    # trip for admitted hits and never lenient under concurrency.
    undo = {i for i in take_back(checks, results) if checks[i].increment}
    # A check reads whole coarse buckets in the middle of its windows: enough to count, not
    # to know when each hit leaves. Read every fine bucket of the limited checks, in the
    # same round trip as the take-backs, to time the waits exactly; the counts stay as the
    # check saw them. (Hierarchical: waits stay conservative by up to one coarse bucket.)
    coarse = hierarchical or windows.coarse_factor(per_window) > 1
    exact = exact and coarse and not hierarchical
    detail = {
        i: windows.plan(checks[i].rates, t, per_window, fine_only=True)
        for i in (limited.intersection(windowed) if exact else ())
    }
    second = sorted(undo.intersection(windowed) | set(detail))
    untake = sorted(undo.intersection(admitted))
    for i in undo:  # taken back here (or, if that fails, left counted): never again
        results[i].plan = results[i].reply = None
    # The refusals whose waits are exact: a leaky bucket's, and a sliding window's read
    # from fine buckets alone (a single-level layout now, the detail read below).
    timed = limited.intersection(metered)
    if not coarse:
        timed |= limited.intersection(windowed)
    if not second and not untake:
        _remember(checks, results, timed, t)
        return results
    ops = [
        Op(namespaces[i], detail.get(i, plans[i]), False, plans[i] if i in undo else None)
        for i in second
    ]
    meter_ops = [MeterOp(namespaces[i], meters[i], take_back=admitted[i]) for i in untake]
    try:
        values, _ = backend.exchange(ops, meter_ops, now_us)
    except BackendError as exc:
        # Whether the hits were taken back is unknown: leaving them counted is the safe side
        # (trying again could take them back twice, which would be lenient).
        logger.info("ratelimit: could not take back refused hits: %s", exc)
        return results
    for i, v in zip(second, values, strict=True):
        if i in detail:
            results[i] = Result(
                windows.refine(results[i].usages, detail[i], v, t), results[i].namespace
            )
    _remember(checks, results, timed.union(detail), t)
    return results


#: This process's refusals (:mod:`ratelimit_app.refusals`), shared by the middleware, the
#: decorator, ``get_usage`` and the DRF throttles.
REFUSALS: refusals.Memory[Result] = refusals.Memory()
refusals.after_fork(REFUSALS)


def refusal_key(c: Check) -> tuple[Any, ...]:
    """What a refusal is remembered by: the limit's counters of one subject."""
    return (c.scope, c.subject, c.algorithm, c.burst)


def _remember(checks: Sequence[Check], results: list[Result], timed: set[int], t: float) -> None:
    """Remember the refusals of counted checks whose waits are exact."""
    cap = conf.REFUSAL_MEMORY
    if cap <= 0:
        return
    REFUSALS.size = conf.REFUSAL_MEMORY_SIZE
    for i in timed:
        c, r = checks[i], results[i]
        if c.increment and r.limited:
            wait = r.binding().retry_after
            REFUSALS.remember(refusal_key(c), t, t + min(wait, cap), r, t + wait)


def recall(c: Check, t: float) -> Result | None:
    """The result of a check refused from memory (no round trip), with its waits counted
    down; None when the subject is not remembered as refused."""
    found = REFUSALS.recall(refusal_key(c), t)
    if found is None:
        return None
    return _counted_down(*found)


def recall_many(checks: Sequence[Check | None], t: float) -> list[Result | None]:
    """:func:`recall` for the checks of one request (None: a check not to recall).

    When none is refused from memory but some are **due** (the memory's cap ran out before
    the wait: :meth:`~ratelimit_app.refusals.Memory.due`), the due ones are confirmed in one
    round trip that only looks (no writes, where a counted check that is refused makes two:
    count, then take back): still no room, and they are refused and remembered again with
    the waits they had; room after all (a reset or a rule changed elsewhere), and they are
    forgotten, for the caller's counted check. So a botnet of subjects each over its limit
    costs one look per subject per process per ``RATELIMIT_REFUSAL_MEMORY``. A look that
    fails confirms nothing: the caller's check decides (and meets the outage).
    """
    if not REFUSALS:  # the common case: nothing refused lately, nothing to look up
        return [None] * len(checks)
    found = [None if c is None else recall(c, t) for c in checks]
    if any(found):
        return found
    due: list[tuple[int, Check, float, float, Result]] = []
    for i, c in enumerate(checks):
        if c is not None and c.increment:
            entry = REFUSALS.due(refusal_key(c), t)
            if entry is not None:
                due.append((i, c, *entry))
    if not due:
        return found
    looks = [c._replace(increment=False) for _, c, *_ in due]
    try:
        seen = check_many(looks, exact=False, at=t)
    except BackendError:
        return found
    cap = conf.REFUSAL_MEMORY
    for (i, c, elapsed, left, r), look in zip(due, seen, strict=True):
        if look.limited:
            found[i] = now = _counted_down(elapsed, r)
            REFUSALS.remember(refusal_key(c), t, t + min(left, cap), now, t + left)
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
    u = usages[0] if len(usages) == 1 else result.binding()
    state = result.meter
    limit = u.rate.count if state is None else state.meter.capacity
    each: list[dict[str, Any]] = []
    usage: dict[str, Any] = {
        "count": u.count,
        "limit": limit,
        "should_limit": result.limited,
        # django-ratelimit's meaning: at most the period. ``reset`` is exact, and may pass the
        # period by up to one fine bucket: the oldest bucket counts in full (never lenient).
        "time_left": min(math.ceil(u.reset), u.rate.seconds),
        "remaining": u.remaining,
        "reset": math.ceil(u.reset),
        "retry_after": max(1, math.ceil(u.retry_after)) if result.limited else 0,
        "rate": u.rate.text,
        "rates": each,
        "algorithm": SLIDING_WINDOW if state is None else LEAKY_BUCKET,
    }
    for x in usages:  # a loop, not a comprehension: one call fewer on every request
        each.append(
            {
                "rate": x.rate.text,
                "window": x.rate.seconds,
                "count": x.count,
                "limit": limit if state is not None else x.rate.count,
                "remaining": x.remaining,
                "reset": math.ceil(x.reset),
                "should_limit": x.limited,
            }
        )
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


def get_usage(
    request: HttpRequest,
    group: str | None = None,
    fn: Callable[..., Any] | None = None,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    increment: bool = False,
    fail_open: bool | None = None,
    algorithm: str = SLIDING_WINDOW,
    burst: int | None = None,
) -> dict[str, Any] | None:
    """Usage of a limit for this request, counting it when ``increment`` is true.

    Same arguments and return value as django-ratelimit 4.1's ``get_usage``: ``None`` when no
    limit applies, else a dict with ``count``, ``limit``, ``should_limit`` and ``time_left``,
    plus ``remaining``, ``reset`` and ``retry_after`` (seconds), ``rate`` (the rate that
    decides), ``rates`` (every rate of a multi-rate limit) and ``algorithm``.

    ``algorithm="leaky_bucket"`` meters a leaky bucket instead of sliding windows: ``rate``
    is the leak rate (one rate) and ``burst`` the capacity (default: the rate's count); the
    dict then also has ``level`` and ``capacity`` (see :func:`usage_dict`).
    """
    if group is None and fn is None:
        raise ImproperlyConfigured("get_usage must be called with either `group` or `fn`.")
    if not conf.ENABLE or rate is None:
        return None
    group = group if group is not None else group_name(fn)  # type: ignore[arg-type]
    limit = limits.build(group, key, rate, method, algorithm, burst)
    return limit_usage(request, limit, increment, fail_open)


def limit_usage(
    request: HttpRequest, limit: Limit, increment: bool, fail_open: bool | None = None
) -> dict[str, Any] | None:
    """:func:`get_usage` for a validated :class:`~ratelimit_app.limits.Limit`.

    When the backend fails, a request that counts fails open or closed as ``fail_open`` (or
    ``RATELIMIT_FAIL_OPEN``) says; a look that counts nothing never enforces (as in
    django-ratelimit), unless ``fail_open=False`` is passed.
    """
    if not limit.applies_to(request):
        return None
    rate_list = limit.rates_for(request)
    if not rate_list:
        return None
    subject = keys.subject(limit.key, limit.group, request)
    c = Check(
        limit.scope_for(rate_list), subject, rate_list, increment, limit.algorithm, limit.burst
    )
    try:
        result = (increment and recall_many([c], clock.now())[0]) or check_many([c])[0]
    except BackendError as exc:
        report_failure(exc)
        if fail_open is None:
            fail_open = conf.FAIL_OPEN or not increment
        return None if fail_open else failure_dict()
    found = usage_dict(result)
    if increment and result.limited:
        ratelimited.send(
            sender=None, group=limit.group, subject=result.namespace, usage=found, request=request
        )
    return found


def is_ratelimited(
    request: HttpRequest,
    group: str | None = None,
    fn: Callable[..., Any] | None = None,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    increment: bool = False,
    algorithm: str = SLIDING_WINDOW,
    burst: int | None = None,
) -> bool:
    """True when the request is over the limit (django-ratelimit's ``is_ratelimited``)."""
    usage = get_usage(
        request, group, fn, key, rate, method, increment, algorithm=algorithm, burst=burst
    )
    return bool(usage and usage["should_limit"])


#: Buckets deleted per backend call by :func:`reset`.
RESET_BATCH = 5000


@dataclass(frozen=True, slots=True)
class Target:
    """The counters of one subject of a limit, found from what a person types (for
    :func:`reset`, :func:`lookup`, the commands and the admin)."""

    limit: Limit
    #: The limit's rates (fixed: a target never depends on a request).
    rates: tuple[rates.Rate, ...]
    #: The subject as the key stores it.
    value: str
    #: The subject as a masked IP, when it is one and the key is of another kind: the
    #: counters of requests that had no value for the key and fell back to the client IP.
    fallback_ip: str | None = None

    @property
    def scope(self) -> str:
        return self.limit.scope_for(self.rates)

    def subjects(self) -> list[tuple[str, str]]:
        """``(kind, value)`` of every place the subject's counts may be filed."""
        found = [(self.limit.kind, self.value)]
        if self.fallback_ip is not None:
            found.append(("ip", self.fallback_ip))
        return found

    def kinds(self) -> set[str]:
        return {kind for kind, _ in self.subjects()}

    def checks(self) -> list[Check]:
        """A look (counting nothing) at each place the subject's counts may be filed."""
        lim = self.limit
        return [
            Check(self.scope, subject, self.rates, False, lim.algorithm, lim.burst)
            for subject in self.subjects()
        ]


def find_limit(
    rule_or_group: str | Rule | Limit,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    algorithm: str = SLIDING_WINDOW,
    burst: int | None = None,
) -> Limit:
    """The limit a rule (a :class:`~ratelimit_app.rules.Rule`, or the name of a rule in
    force) or a decorator's group (with the decorator's ``key``, ``rate``, ``method``,
    ``algorithm`` and ``burst``) counts with. Raises ``ValueError`` when there is none."""
    if isinstance(rule_or_group, Limit):
        return rule_or_group
    if isinstance(rule_or_group, Rule):
        return rule_or_group.limit
    if key is None:
        found = store.current().rules.by_name.get(rule_or_group)
        if found is None and rule_or_group.startswith("drf:"):
            # A DRF throttle's scope, when the project uses our throttles (imported by
            # then: this module never imports DRF itself).
            throttling = sys.modules.get("ratelimit_app.throttling")
            scoped = throttling.scope_limits().get(rule_or_group) if throttling else None
            if scoped is not None:
                return cast(Limit, scoped)
        if found is None:
            raise ValueError(
                f"No rule named {rule_or_group!r} in RATELIMIT_RULES; for a @ratelimit group "
                f"pass its key and rate."
            )
        return found.limit
    if rate is None:
        raise ValueError(f"{rule_or_group!r}: a group needs the key and rate of its decorator.")
    try:
        return limits.build(rule_or_group, key, rate, method, algorithm, burst)
    except ImproperlyConfigured as exc:
        raise ValueError(f"{rule_or_group!r}: {exc}") from exc


def target(
    rule_or_group: str | Rule | Limit,
    subject: str,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    algorithm: str = SLIDING_WINDOW,
    burst: int | None = None,
) -> Target | None:
    """The counters ``subject`` has under a limit (see :func:`find_limit`). ``subject`` is
    what a person types: an IP, an email (case folded as the key does), a user id. Returns
    None when the subject is empty or invalid.

    Raises ``ValueError`` when the limit cannot be found, its rates depend on the request,
    or its algorithm, rates and burst do not make a limit.
    """
    limit = find_limit(rule_or_group, key, rate, method, algorithm, burst)
    if limit.static_rates is None:
        name = rule_or_group.name if isinstance(rule_or_group, Rule) else limit.group
        raise ValueError(f"{name!r}: its rate depends on the request; pass the rate it returns.")
    value = keys.normalize_value(limit.key, subject)
    if value is None:
        return None
    fallback = None
    if limit.kind not in ("ip", "user_or_ip"):
        fallback = keys.mask_ip(subject)
    return Target(limit, limit.static_rates, value, fallback)


def reset(
    rule_or_group: str | Rule | Limit,
    subject: str,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    algorithm: str = SLIDING_WINDOW,
    burst: int | None = None,
) -> bool:
    """Clear the counters of one subject (an IP, an email, a user id) of a rule or group:
    its sliding windows and its leaky bucket, whichever it has.

    Arguments as for :func:`target`. Returns False when there is nothing to reset (an empty
    or invalid subject); raises ``ValueError`` for an unknown rule and ``BackendError`` when
    the backend fails.
    """
    found = target(rule_or_group, subject, key, rate, method, algorithm, burst)
    if found is None:
        return False
    suffixes = [gcra.SUFFIX]
    if not found.limit.metered:
        now = clock.now()
        suffixes += sorted(windows.stored_suffixes(found.rates, now, conf.BUCKETS_PER_WINDOW))
    lim = found.limit
    REFUSALS.forget(
        (found.scope, subject, lim.algorithm, lim.burst) for subject in found.subjects()
    )
    backend = get_backend()
    for kind, value in found.subjects():
        ns = namespace(found.scope, kind, value)
        for start in range(0, len(suffixes), RESET_BATCH):
            backend.delete(ns, suffixes[start : start + RESET_BATCH])
    return True


def lookup(
    rule_or_group: str | Rule | Limit,
    subject: str,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    algorithm: str = SLIDING_WINDOW,
    burst: int | None = None,
) -> dict[str, Any] | None:
    """The usage of one subject (as :func:`get_usage` reports it, counting nothing): for a
    leaky bucket, its level, capacity and the seconds until it is empty.

    Arguments as for :func:`target`; None for an empty or invalid subject. An IP typed for a
    key of another kind may name the key's own counters (a header holding an address) or the
    IP fallback's: both are read, in one round trip, and the busier is reported. Raises
    ``ValueError`` for an unknown rule and ``BackendError`` when the backend fails.
    """
    found = target(rule_or_group, subject, key, rate, method, algorithm, burst)
    if found is None:
        return None
    results = check_many(found.checks())
    busiest = max(results, key=lambda r: r.binding().count)  # the first on a tie: its own
    return usage_dict(busiest)


get_usage.ALL = ALL  # type: ignore[attr-defined]
get_usage.UNSAFE = UNSAFE  # type: ignore[attr-defined]
is_ratelimited.ALL = ALL  # type: ignore[attr-defined]
is_ratelimited.UNSAFE = UNSAFE  # type: ignore[attr-defined]
