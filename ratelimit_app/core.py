"""The limiter: ``get_usage`` / ``is_ratelimited`` (django-ratelimit's API) and ``reset``.

One check = resolve the rates and the subject, plan the buckets
(:mod:`ratelimit_app.windows`), run the plan on the backend in one round trip, evaluate.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from ratelimit_app import ALL, UNSAFE, clock, keys, rates, windows
from ratelimit_app.backends import get_backend
from ratelimit_app.conf import conf
from ratelimit_app.exceptions import BackendError
from ratelimit_app.signals import backend_failed, ratelimited

__all__ = ["ALL", "UNSAFE", "get_usage", "is_ratelimited", "reset"]

logger = logging.getLogger("ratelimit_app")

Method = str | Sequence[str | None] | None


def method_matches(request: HttpRequest, method: Method) -> bool:
    if method == ALL or method is None:
        return True
    methods = [method] if isinstance(method, str) else method
    return request.method in [m.upper() for m in methods if m]


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


def namespace(group: str, kind: str, value: str) -> str:
    """The hashed, hash-tagged part of a key: no raw IP or email ever reaches the cache.

    The hash is salted with a value derived from ``SECRET_KEY``, so a key read off the cache
    cannot be reversed by hashing every IPv4 address.
    """
    raw = f"{conf.SALT}\x00{group}\x00{kind}\x00{value}".encode()
    return "{" + conf.HASH(raw).hexdigest()[:32] + "}"


def scope(group: str, method: Method, rate_list: tuple[rates.Rate, ...]) -> str:
    """What counters are kept apart by, as django-ratelimit keys them: the group, the methods
    and the rates (two stacked decorators on one view never share a counter)."""
    if method == ALL or method is None:
        methods = ""
    elif isinstance(method, str):
        methods = method.upper()
    else:
        methods = ",".join(sorted(m.upper() for m in method if m))
    return f"{group}\x00{methods}\x00{';'.join(map(str, rate_list))}"


@dataclass(frozen=True, slots=True)
class Result:
    """Outcome of one check of one subject."""

    usages: list[windows.Usage]
    namespace: str

    @property
    def limited(self) -> bool:
        return any(u.limited for u in self.usages)

    def binding(self) -> windows.Usage:
        """The rate that decides: the limited one that frees up last, else the tightest."""
        limited = [u for u in self.usages if u.limited]
        if limited:
            return max(limited, key=lambda u: u.retry_after)
        return min(self.usages, key=lambda u: (u.remaining, -u.reset))


def check(
    group: str, subject: tuple[str, str], rate_list: tuple[rates.Rate, ...], increment: bool
) -> Result:
    """Count (if ``increment``) and read one subject's windows. Raises ``BackendError``."""
    t = clock.now()
    plan = windows.plan(rate_list, t, conf.BUCKETS_PER_WINDOW, conf.HIERARCHICAL)
    ns = namespace(group, *subject)
    backend = get_backend()
    values = backend.run(ns, plan, increment)
    result = Result(windows.evaluate(plan, values, t, counted=increment), ns)
    if not result.limited:
        return result
    # A refused hit does not use up the quota: a client that keeps retrying gets in as soon
    # as the window has room. Counting first and taking back after keeps the check one round
    # trip for admitted hits and never lenient under concurrency.
    undo = plan if increment else None
    if conf.HIERARCHICAL or windows.coarse_factor(conf.BUCKETS_PER_WINDOW) == 1:
        if undo is not None:
            _take_back(backend, ns, undo)
        # Every bucket of this layout was read (hierarchical: waits stay conservative by up
        # to one coarse bucket, as documented).
        return result
    # The check read whole coarse buckets in the middle of the windows: enough to count, not
    # to know when each hit leaves. Take the hit back and read every fine bucket, in one
    # round trip, to time the waits exactly; the counts stay as the check saw them.
    detail = windows.plan(rate_list, t, conf.BUCKETS_PER_WINDOW, fine_only=True)
    try:
        values = backend.run(ns, detail, False, undo=undo)
    except BackendError as exc:
        # Whether the hit was taken back is unknown: leaving it counted is the safe side
        # (trying again could take it back twice, which would be lenient).
        logger.info("ratelimit: could not time the wait exactly: %s", exc)
        return result
    return Result(windows.refine(result.usages, detail, values, t), result.namespace)


def _take_back(backend: Any, ns: str, plan: windows.Plan) -> None:
    try:
        backend.undo(ns, plan)
    except BackendError as exc:
        logger.info("ratelimit: could not take back a refused hit: %s", exc)


def usage_dict(result: Result) -> dict[str, Any]:
    """django-ratelimit's dict (count, limit, should_limit, time_left) plus our fields."""
    u = result.binding()
    return {
        "count": u.count,
        "limit": u.rate.count,
        "should_limit": result.limited,
        "time_left": math.ceil(u.reset),
        "remaining": u.remaining,
        "reset": math.ceil(u.reset),
        "retry_after": max(1, math.ceil(u.retry_after)) if result.limited else 0,
        "rate": str(u.rate),
        "rates": [
            {
                "rate": str(x.rate),
                "count": x.count,
                "limit": x.rate.count,
                "remaining": x.remaining,
                "reset": math.ceil(x.reset),
                "should_limit": x.limited,
            }
            for x in result.usages
        ],
    }


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
) -> dict[str, Any] | None:
    """Usage of a limit for this request, counting it when ``increment`` is true.

    Same arguments and return value as django-ratelimit 4.1's ``get_usage``: ``None`` when no
    limit applies, else a dict with ``count``, ``limit``, ``should_limit`` and ``time_left``,
    plus ``remaining``, ``reset`` and ``retry_after`` (seconds), ``rate`` (the rate that
    decides) and ``rates`` (every rate of a multi-rate limit).
    """
    if group is None and fn is None:
        raise ImproperlyConfigured("get_usage must be called with either `group` or `fn`.")
    if not conf.ENABLE or not method_matches(request, method):
        return None
    group = group if group is not None else group_name(fn)  # type: ignore[arg-type]
    rate_list = rates.resolve(rate, group, request)
    if not rate_list:
        return None
    if not key:
        raise ImproperlyConfigured("Ratelimit key must be specified.")
    subject = keys.subject(key, group, request)
    if subject is None:
        return None
    try:
        result = check(scope(group, method, rate_list), subject, rate_list, increment)
    except BackendError as exc:
        report_failure(exc)
        if conf.FAIL_OPEN if fail_open is None else fail_open:
            return None
        return failure_dict()
    usage = usage_dict(result)
    if increment and result.limited:
        ratelimited.send(
            sender=None, group=group, subject=result.namespace, usage=usage, request=request
        )
    return usage


def is_ratelimited(
    request: HttpRequest,
    group: str | None = None,
    fn: Callable[..., Any] | None = None,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    increment: bool = False,
) -> bool:
    """True when the request is over the limit (django-ratelimit's ``is_ratelimited``)."""
    usage = get_usage(request, group, fn, key, rate, method, increment)
    return bool(usage and usage["should_limit"])


#: Buckets deleted per backend call by :func:`reset`.
RESET_BATCH = 5000


def reset(
    group: str, key: keys.KeySpec, value: str, rate: rates.RateSpec, method: Method = ALL
) -> bool:
    """Clear the counters of one subject (e.g. an IP or an email) for ``group``.

    ``value`` is what a person would type: it is normalised as the key would (emails case
    folded, IPs masked). ``rate`` and ``method`` are the decorator's (a callable rate cannot
    be resolved without a request: pass the rate it returns). Returns False when there is
    nothing to reset; raises ``BackendError`` when the backend fails.
    """
    normalized = keys.normalize_value(key, value)
    if normalized is None or rate is None or callable(rate) or rates.is_dotted_path(rate):
        return False
    rate_list = rates.normalize(rate)
    suffixes = sorted(windows.stored_suffixes(rate_list, clock.now(), conf.BUCKETS_PER_WINDOW))
    backend = get_backend()
    group_scope = scope(group, method, rate_list)
    for kind in {keys.kind(key), "ip"}:  # the key's own values, and its IP fallback
        ns = namespace(group_scope, kind, normalized)
        for start in range(0, len(suffixes), RESET_BATCH):
            backend.delete(ns, suffixes[start : start + RESET_BATCH])
    return True


get_usage.ALL = ALL  # type: ignore[attr-defined]
get_usage.UNSAFE = UNSAFE  # type: ignore[attr-defined]
is_ratelimited.ALL = ALL  # type: ignore[attr-defined]
is_ratelimited.UNSAFE = UNSAFE  # type: ignore[attr-defined]
