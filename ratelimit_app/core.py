"""django-ratelimit's API: ``get_usage`` and ``is_ratelimited``, with its helpers.

Same signatures and return values as django-ratelimit 4.1's ``django_ratelimit.core``, so a
project moves over by changing the import. The limit is validated
(:func:`ratelimit_app.config.limits.build`) and checked by the engine
(:mod:`ratelimit_app.engine`).
``reset`` and ``lookup`` (:mod:`ratelimit_app.operators.operations`) are importable from here too:
the one way to read or clear a subject's counters for any limit, a DRF throttle's included.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from ratelimit_app import ALL, UNSAFE, store
from ratelimit_app.algorithms import rates
from ratelimit_app.conf import conf
from ratelimit_app.config import kinds, limits
from ratelimit_app.config.limits import Method, method_set
from ratelimit_app.config.policy import Policy, of_call
from ratelimit_app.engine import compiled, enforce, failure_dict
from ratelimit_app.engine.enforce import Decision
from ratelimit_app.engine.matched import on_the_loop
from ratelimit_app.engine.outcome import add_shown as add_shown
from ratelimit_app.engine.outcome import release as release
from ratelimit_app.engine.outcome import show as show
from ratelimit_app.engine.trips import Checking, arun, run
from ratelimit_app.identity import keys
from ratelimit_app.identity.keys import get_header, user_or_ip
from ratelimit_app.operators.operations import lookup, reset

__all__ = [
    "ALL",
    "UNSAFE",
    "aget_usage",
    "ais_ratelimited",
    "charge",
    "get_header",
    "get_usage",
    "is_ratelimited",
    "lookup",
    "reset",
    "user_or_ip",
]


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
    """What counters are kept apart by (:func:`ratelimit_app.config.limits.scope`), for a method
    spec as the decorators take it."""
    methods = method_set(method)
    return limits.scope(group, ",".join(sorted(methods)) if methods else "", rate_list)


def get_usage(
    request: HttpRequest,
    group: str | None = None,
    fn: Callable[..., Any] | None = None,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    increment: bool = False,
    fail_open: bool | None = None,
    algorithm: str = kinds.DEFAULT,
    burst: int | None = None,
    cost: limits.CostSpec = 1,
    shadow: bool = False,
    ban: dict[str, Any] | None = None,
    quota: str | None = None,
    timezone: str | None = None,
    fallback: str | bool | None = None,
) -> dict[str, Any] | None:
    """Usage of a limit for this request, counting it when ``increment`` is true.

    Same arguments and return value as django-ratelimit 4.1's ``get_usage``: ``None`` when no
    limit applies, else a dict with ``count``, ``limit``, ``should_limit`` and ``time_left``,
    plus ``remaining``, ``reset`` and ``retry_after`` (seconds), ``rate`` (the rate that
    decides), ``rates`` (every rate of a multi-rate limit) and ``algorithm``.

    ``algorithm="leaky_bucket"`` meters a leaky bucket instead of sliding windows: ``rate``
    is the leak rate (one rate) and ``burst`` the capacity (default: the rate's count); the
    dict then also has ``level`` and ``capacity`` (see :func:`usage_dict`). ``cost``: the
    hits the request counts, ``shadow``: a dry run, ``ban``: who it refuses too often it
    bans (each as ``@ratelimit`` takes it).

    A dry run (``shadow=True``) has ``should_limit`` False and ``shadow_limited`` True where
    the limit would refuse.

    ``quota`` (``"10000/month"``; units ``day``, ``week``, ``month``) counts in the calendar
    periods of ``timezone`` (default: ``TIME_ZONE``), alone or beside ``rate``: both must
    allow, and ``renews`` and ``renews_in`` say when the period ends (docs/quotas).

    ``fallback="memory"``: while the counters cannot be reached, count in this process's
    memory (default: ``RATELIMIT_FALLBACK``; ``False``: never; docs/operators).
    """
    enforced = _called(
        group, fn, key, rate, method, increment, fail_open, algorithm, burst, cost, shadow,
        ban, quota, timezone, fallback,
    )  # fmt: skip
    return None if enforced is None else limit_usage(request, enforced, increment)


async def aget_usage(
    request: HttpRequest,
    group: str | None = None,
    fn: Callable[..., Any] | None = None,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    increment: bool = False,
    fail_open: bool | None = None,
    algorithm: str = kinds.DEFAULT,
    burst: int | None = None,
    cost: limits.CostSpec = 1,
    shadow: bool = False,
    ban: dict[str, Any] | None = None,
    quota: str | None = None,
    timezone: str | None = None,
    fallback: str | bool | None = None,
) -> dict[str, Any] | None:
    """:func:`get_usage` for async code: the same arguments and answer, and the event loop
    serves other requests while the counters answer (the round trip is awaited on the
    loop; a limit that reads the database or calls user code, a key needing
    ``request.user``, a callable rate, a ban, is checked in a thread instead)."""
    enforced = _called(
        group, fn, key, rate, method, increment, fail_open, algorithm, burst, cost, shadow,
        ban, quota, timezone, fallback,
    )  # fmt: skip
    if enforced is None:
        return None
    if on_the_loop([enforced.limit]):
        return await arun(_limit_usage(request, enforced, increment))
    return await sync_to_async(limit_usage)(request, enforced, increment)


def _called(
    group: str | None,
    fn: Callable[..., Any] | None,
    key: keys.KeySpec | None,
    rate: rates.RateSpec,
    method: Method,
    increment: bool,
    fail_open: bool | None,
    algorithm: str,
    burst: int | None,
    cost: limits.CostSpec,
    shadow: bool,
    ban: dict[str, Any] | None,
    quota: str | None,
    timezone: str | None,
    fallback: str | bool | None,
) -> Policy | None:
    """The policy :func:`get_usage`'s arguments make, or None: no limit (disabled, no rate)."""
    if group is None and fn is None:
        raise ImproperlyConfigured("get_usage must be called with either `group` or `fn`.")
    if not conf.ENABLE or (rate is None and quota is None):
        return None
    if quota is not None or timezone is not None:  # (made once per arguments)
        rate = limits.with_quota(rate, quota, timezone, algorithm)
    group = group if group is not None else group_name(fn)  # type: ignore[arg-type]
    if fail_open is None and not increment:  # a look that counts nothing never enforces
        fail_open = True
    return of_call(
        group, key, rate, method, algorithm, burst, cost, ban, fail_open, shadow, fallback
    )


def limit_usage(request: HttpRequest, enforced: Policy, increment: bool) -> dict[str, Any] | None:
    """:func:`get_usage` for a :class:`~ratelimit_app.config.policy.Policy`."""
    return run(_limit_usage(request, enforced, increment))


def _limit_usage(
    request: HttpRequest, enforced: Policy, increment: bool
) -> Checking[dict[str, Any] | None]:
    verdict = yield from limit_verdicting(request, enforced, increment)
    decision = _first(verdict, enforced)
    if decision is None:
        return None
    if decision.result is None:  # the counters failed, and the limit fails closed
        return failure_dict()
    usage = decision.usage()
    if decision.shadowed and usage is not None:  # a dry run refuses nothing
        return {**usage, "should_limit": False, "shadow_limited": True}
    return usage


def limit_decision(
    request: HttpRequest, enforced: Policy, increment: bool = True
) -> Decision | None:
    """The decided :class:`~ratelimit_app.engine.enforce.Decision` of ``enforced``'s limit
    for ``request``, or None when no limit applies (another method, no rate) or the
    counters failed and the limit fails open (as its policy says: by default as
    ``RATELIMIT_FAIL_OPEN`` does; :func:`get_usage`'s look that counts nothing never
    enforces, as in django-ratelimit, unless ``fail_open=False`` is passed)."""
    return _first(limit_verdict(request, enforced, increment), enforced)


def _first(verdict: enforce.Verdict | None, enforced: Policy) -> Decision | None:
    if verdict is None:
        return None
    first = verdict.decisions[0]
    return first if first.policy is enforced else None  # (an override lifted the limit)


def limit_verdict(
    request: HttpRequest, enforced: Policy, increment: bool = True
) -> enforce.Verdict | None:
    """:func:`limit_decision`'s verdict: the limit's decision first, then its places' in
    flight (``concurrent``) when the request counts; None when no limit applies, or the
    counters failed and the limit fails open."""
    return run(limit_verdicting(request, enforced, increment))


def limit_verdicting(
    request: HttpRequest, enforced: Policy, increment: bool = True
) -> Checking[enforce.Verdict | None]:
    """:func:`limit_verdict`, as a generator of :mod:`~ratelimit_app.engine.trips` (its round
    trips yielded: run by an async caller's driver too)."""
    limit = enforced.limit
    if not limit.applies_to(request):
        return None
    check = limit.check(request, increment)
    if check is None:
        return None
    if increment and enforced.plain and _compiled():  # a count and nothing more
        verdict = yield from compiled.checking(request, (enforced,), (check,), None)
        if verdict.failed is None:  # (no override on this path: its one decision is there)
            return verdict
    else:
        decisions = enforce.decisions(enforced, check, request, increment)
        verdict = yield from enforce.deciding(request, decisions)
    if not verdict.decisions:
        return None  # (an override lifts the limit for this subject)
    if verdict.failed is not None and verdict.decisions[0].fail_open:
        return None
    return verdict


def _compiled() -> bool:
    """True when a plain limit's count takes the compiled path now (the snapshot kept fresh
    first, as :func:`~ratelimit_app.engine.enforce.deciding` keeps it)."""
    if not conf.MIDDLEWARE_INSTALLED:
        store.current()
    return compiled.usable()


def is_ratelimited(
    request: HttpRequest,
    group: str | None = None,
    fn: Callable[..., Any] | None = None,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    increment: bool = False,
    algorithm: str = kinds.DEFAULT,
    burst: int | None = None,
    cost: limits.CostSpec = 1,
    shadow: bool = False,
    ban: dict[str, Any] | None = None,
) -> bool:
    """True when the request is over the limit (django-ratelimit's ``is_ratelimited``)."""
    usage = get_usage(
        request,
        group,
        fn,
        key,
        rate,
        method,
        increment,
        algorithm=algorithm,
        burst=burst,
        cost=cost,
        shadow=shadow,
        ban=ban,
    )
    return bool(usage and usage["should_limit"])


async def ais_ratelimited(
    request: HttpRequest,
    group: str | None = None,
    fn: Callable[..., Any] | None = None,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    increment: bool = False,
    algorithm: str = kinds.DEFAULT,
    burst: int | None = None,
    cost: limits.CostSpec = 1,
    shadow: bool = False,
    ban: dict[str, Any] | None = None,
) -> bool:
    """:func:`is_ratelimited` for async code (as :func:`aget_usage` checks)."""
    usage = await aget_usage(
        request, group, fn, key, rate, method, increment,
        algorithm=algorithm, burst=burst, cost=cost, shadow=shadow, ban=ban,
    )  # fmt: skip
    return bool(usage and usage["should_limit"])


def charge(request: Any, hits: int) -> int:
    """Add ``hits`` more to every limit that admitted ``request``, each in the request's own
    subject (tokens used, rows exported: what a view learns once it has run), in one round
    trip; returns the number of limits charged. A charge that takes a subject over its limit
    refuses its next requests, never this one; a backend failure is logged and signalled,
    not raised. Also importable as ``ratelimit_app.charge``."""
    return enforce.charge(request, hits)


get_usage.ALL = ALL  # type: ignore[attr-defined]
get_usage.UNSAFE = UNSAFE  # type: ignore[attr-defined]
is_ratelimited.ALL = ALL  # type: ignore[attr-defined]
is_ratelimited.UNSAFE = UNSAFE  # type: ignore[attr-defined]
