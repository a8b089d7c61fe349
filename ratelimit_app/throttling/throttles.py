"""The throttle classes and their request path: what Django REST framework calls.

What a view's throttles of this package do, per request:

* the first one that DRF asks checks **all** of them, in one backend round trip
  (:func:`ratelimit_app.engine.check_many`), and leaves the results on the request for the
  others;
* each counts the request where the counts are kept atomically (never more than N in any
  window of W seconds, whatever the concurrency); when one refuses, none of them counts
  it (a client retrying too fast gets in as soon as the window has room);
* a refusal is remembered by the process until its wait ends (the refusal memory of
  :mod:`ratelimit_app.engine.refusals.memory`, shared with the middleware and ``@ratelimit``);
* the answer carries the ``RateLimit-Policy`` and ``RateLimit`` headers (through the view's
  ``headers``, which DRF adds to every response it finalises); a refused one, DRF's 429
  with ``Retry-After`` from :meth:`SimpleRateThrottle.wait`;
* a refusal is sent as :data:`ratelimit_app.signals.ratelimited` with ``rule="drf:<scope>"``
  (so ``metrics_app`` counts it in the series ``ratelimit:drf:<scope>``);
* when the backend fails, the throttle fails open or closed (``fail_open``, default
  ``RATELIMIT_FAIL_OPEN``); closed answers 503.
"""

from __future__ import annotations

import math
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext
from rest_framework import exceptions as drf_exceptions
from rest_framework import throttling as drf_throttling
from rest_framework.settings import api_settings

from ratelimit_app import ALL, clock
from ratelimit_app.algorithms import rates
from ratelimit_app.backends import base
from ratelimit_app.conf import conf
from ratelimit_app.config import kinds, limits, sources
from ratelimit_app.config.limits import Limit
from ratelimit_app.config.policy import policy
from ratelimit_app.engine import Result, responses
from ratelimit_app.engine.enforce import Decision
from ratelimit_app.engine.outcome import decided_together, shown_together
from ratelimit_app.identity import addresses, keys

__all__ = [
    "PREFIX",
    "SUBJECT_KIND",
    "AnonRateThrottle",
    "BaseThrottle",
    "ScopedRateThrottle",
    "SimpleRateThrottle",
    "ThrottleUnavailable",
    "UserRateThrottle",
]

#: A throttle's limits are named ``drf:<scope>``: their group, the rule of their metrics
#: series and of the ``ratelimited`` signal, the label of their ``RateLimit`` headers.
PREFIX = sources.DRF + ":"
#: The kind every throttle's subject is filed under: its ident (a user's primary key or a
#: masked IP address) or, for a ``get_cache_key`` of another shape, the whole key. With this
#: kind, :func:`ratelimit_app.core.lookup` finds a subject from what a person types.
SUBJECT_KIND = "user_or_ip"


class ThrottleUnavailable(drf_exceptions.APIException):
    """A fail-closed throttle could not reach its counters: answered with
    503 and ``Retry-After: 5`` (``base.DEAD_RETRY``)."""

    default_code = "throttle_unavailable"

    def __init__(self, name: str) -> None:
        self.status_code = responses.FAIL_CLOSED_STATUS
        #: DRF's exception handler turns ``wait`` into ``Retry-After``.
        self.wait = max(1, math.ceil(base.DEAD_RETRY))
        unchecked = gettext("The rate limit %(name)s cannot be checked right now.")
        super().__init__(f"{unchecked % {'name': repr(name)}} {responses.try_again(self.wait)}")


class BaseThrottle(drf_throttling.BaseThrottle):
    """DRF's ``BaseThrottle`` with our client address (:meth:`get_ident`)."""

    def get_ident(self, request: Any) -> str | None:
        """The client's address, as DRF finds it, made safe to count by.

        ``REST_FRAMEWORK["NUM_PROXIES"]`` is honoured as DRF does: ``0`` means
        ``REMOTE_ADDR``; ``n`` the n-th address from the right of ``X-Forwarded-For`` (the
        one the outermost of your n proxies saw). Unset (``None``, the default), DRF would
        take the whole ``X-Forwarded-For``, which any client can write: here it means our
        own rule instead (``REMOTE_ADDR``, and ``X-Forwarded-For`` only from
        ``RATELIMIT_TRUSTED_PROXIES``, read right to left, as every ``ip`` key counts).

        Beyond DRF: when ``RATELIMIT_TRUSTED_PROXIES`` is set, a peer that is not one of
        them reached Django directly, and its own address counts, whatever
        ``X-Forwarded-For`` it sent; a hop that is no IP address counts the proxy that sent
        it; an IPv4-mapped address counts as its IPv4 address; and the address is masked
        by ``RATELIMIT_IPV4_MASK`` / ``RATELIMIT_IPV6_MASK`` (a client holds a whole IPv6
        /64). None when the request has no usable address (DRF's ``REMOTE_ADDR`` of None).
        """
        ident = addresses.drf_ident(request, api_settings.NUM_PROXIES)
        self._no_ident = ident is None  # (allow_request says what to do)
        return ident


class _SettingsRates:
    """``THROTTLE_RATES`` read when used: ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` as DRF's
    ``api_settings`` has it now (reloaded when the setting changes: DRF's own class reads
    it once, at import). A subclass may set a dict of its own instead."""

    def __get__(self, instance: object, owner: type | None = None) -> dict[str, Any]:
        found: dict[str, Any] = api_settings.DEFAULT_THROTTLE_RATES
        return found


class SimpleRateThrottle(BaseThrottle):
    """DRF's ``SimpleRateThrottle`` on sliding windows: override :meth:`get_cache_key`.

    ``rate`` (or ``THROTTLE_RATES[scope]``) may hold several rates, every one enforced:
    ``"10/m;1000/d"``. ``algorithm = "leaky_bucket"`` meters a leaky bucket instead (the
    rate is its leak rate; ``burst`` its capacity, default the rate's count). ``fail_open``
    (None: ``RATELIMIT_FAIL_OPEN``) decides when the counters cannot be reached.

    ``cost`` (or :meth:`get_cost`) is the hits a request counts; ``shadow = True`` makes
    the throttle a dry run; ``quota = "10000/month"`` adds a quota on the calendar (its
    ``wait()`` then the seconds until its period renews, when it is the one spent).

    A view's throttles of this module are checked together, at the time of the first one's
    :meth:`timer`. Two throttles count apart unless they have the same scope, rates,
    algorithm and ident (DRF shares one history between classes of the same scope).
    """

    cache_format = "throttle_%(scope)s_%(ident)s"
    scope: str | None = None
    rate: Any = None
    THROTTLE_RATES: Any = _SettingsRates()
    algorithm: str = kinds.DEFAULT
    burst: int | None = None
    fail_open: bool | None = None
    #: The hits each request counts (see :meth:`get_cost`).
    cost: int = 1
    #: A dry run: nothing is refused; what would be is counted, logged and signalled.
    shadow: bool = False
    #: Ban a client refused that often: ``{"after": 10, "within": "10m", "for": "1h"}``.
    ban: dict[str, Any] | None = None
    #: While the counters are down: ``"memory"`` counts in this process's memory, ``False``
    #: never, None as ``RATELIMIT_FALLBACK`` says (docs/operators).
    fallback: str | bool | None = None
    #: A quota on the calendar beside the rate (both must allow), ``"10000/month"``, in the
    #: periods of ``timezone`` (default: ``TIME_ZONE``): docs/quotas.
    quota: str | None = None
    timezone: str | None = None

    #: Set by :meth:`allow_request`: the cache key, the time, and the outcome.
    key: str | None = None
    now: float | None = None
    result: Result | None = None
    usage: dict[str, Any] | None = None
    _no_ident = False

    def __init__(self) -> None:
        if not getattr(self, "rate", None):
            self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)

    def timer(self) -> float:
        """The time the windows are read at: :func:`ratelimit_app.clock.now`. Override it
        (as DRF's tests do) to move one throttle's clock."""
        return clock.now()

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        """A key unique to the client (and scope), or None not to throttle the request.
        Must be overridden."""
        raise NotImplementedError(".get_cache_key() must be overridden")

    def get_rate(self) -> Any:
        """The rate of :attr:`scope` in :attr:`THROTTLE_RATES`."""
        if not getattr(self, "scope", None):
            raise ImproperlyConfigured(
                f"You must set either `.scope` or `.rate` for '{type(self).__name__}' throttle"
            )
        try:
            return self.THROTTLE_RATES[self.scope]
        except KeyError:
            raise ImproperlyConfigured(
                f"No default throttle rate set for '{self.scope}' scope"
            ) from None

    def parse_rate(self, rate: Any) -> tuple[int | None, int | None]:
        """``(requests, seconds)`` of the rate (the one with the shortest window when there
        are several); ``(None, None)`` for no rate. Raises ``ImproperlyConfigured`` naming
        the string (``'10/M'``, ``'3/1.5m'``, ``'10 / m'``) for a bad one."""
        if rate is None:
            return (None, None)
        try:
            first = rates.normalize(rate)[0]
        except ImproperlyConfigured as exc:
            raise self._misconfigured(exc) from None
        return (first.count, first.seconds)

    @property
    def name(self) -> str:
        """``drf:<scope>``: the name of this throttle's limit (see :data:`PREFIX`)."""
        scope = self.scope or f"{type(self).__module__}.{type(self).__qualname__}"
        return PREFIX + str(scope)

    def limit(self) -> Limit:
        """The validated limit this throttle counts with (its rates, algorithm and burst)."""
        spec = self.rate
        if type(self).parse_rate is not SimpleRateThrottle.parse_rate:
            # A parse_rate of the project's own (a DRF idiom for rates such as "5/15m"):
            # its answer is the rate.
            spec = (self.num_requests, self.duration)
        try:
            return limits.build(
                self.name,
                SUBJECT_KIND,
                spec,
                ALL,
                self.algorithm,
                self.burst,
                ban=self.ban,
                quota=self.quota,
                timezone=self.timezone,
            )
        except ImproperlyConfigured as exc:
            raise self._misconfigured(exc) from None

    def _misconfigured(self, exc: Exception) -> ImproperlyConfigured:
        return ImproperlyConfigured(f"{type(self).__name__} (scope {self.scope!r}): {exc}")

    def decision(self, request: Any, view: Any) -> Decision | None:
        """What this throttle decides for the request, or None when it does not apply (no
        rate, no cache key, ``RATELIMIT_ENABLE`` off). Sets :attr:`key`."""
        if self.rate is None or not conf.ENABLE:
            return None
        self._no_ident = False
        key = self.key = self.get_cache_key(request, view)
        if key is None:
            return None
        if self._no_ident:
            raise ImproperlyConfigured(addresses.NO_DRF_IDENT % type(self).__name__)
        lim = self.limit()
        subject = (SUBJECT_KIND, keys.throttle_subject(str(key), self.cache_format, self.scope))
        check = lim.check(request, subject=subject)
        assert check is not None  # a throttle's rate is literal: parse_rate took it
        cost = self.cost if type(self).get_cost is SimpleRateThrottle.get_cost else None
        if cost != 1:
            cost = limits.checked_cost(self.get_cost(request, view), type(self).__name__)
            if not cost:
                return None
            check = check._replace(cost=cost)
        enforced = policy(
            lim,
            name=self.name,
            fail_open=self.fail_open,
            shadow=self.shadow,
            sender=type(self),
            counts_requester=_keyed_on_the_client(self),
            fallback=self.fallback,
        )
        return Decision(enforced, check)

    def get_cost(self, request: Any, view: Any) -> int:
        """The hits this request counts (default: :attr:`cost`); 0: not throttled. Override
        it to weigh requests (a bulk endpoint by the items it takes)."""
        return self.cost

    def allow_request(self, request: Any, view: Any) -> bool:
        """Count the request; False when it is over the limit (then :meth:`wait` says how
        long). Calls :meth:`throttle_success` or :meth:`throttle_failure`, as DRF does."""
        self.result = self.usage = None
        decision = self.decision(request, view)
        if decision is None:
            return True
        self.now = t = self.timer()
        at = None if _own_timer(self) else t
        decision, verdict = decided_together(
            request, decision, lambda: _view_decisions(decision, request, view), at
        )
        if verdict.failed is not None:  # (the policy's fail_open, decided in the decision)
            if decision.fail_open:
                return True
            raise ThrottleUnavailable(self.name)
        outcome = decision.result
        if outcome is None:  # not checked: another throttle of the view refused from memory
            return True
        self.result = outcome
        self.usage = decision.usage()
        shown_together(request, getattr(view, "headers", None), decision)
        if decision.refused:
            return bool(self.throttle_failure())
        return bool(self.throttle_success())

    def throttle_success(self) -> bool:
        """Called when the request is admitted (already counted): True."""
        return True

    def throttle_failure(self) -> bool:
        """Called when the request is refused (not counted): False."""
        return False

    def wait(self) -> float | None:
        """Seconds to wait: when refused, until the window admits one more request (whole
        seconds, at least 1, exact: it comes from the buckets, not from an estimate).

        Otherwise DRF's pacing hint: the seconds until the window frees up, spread over
        the requests it still admits (before any check, over an empty window:
        ``duration / (num_requests + 1)``).
        """
        usage = self.usage
        if usage is not None:
            if usage["should_limit"]:
                return float(usage["retry_after"])
            return usage["reset"] / float(usage["remaining"] + 1)
        num_requests = getattr(self, "num_requests", None)
        duration = getattr(self, "duration", None)
        if num_requests is None or duration is None:
            return None
        return duration / float(num_requests + 1)


class AnonRateThrottle(SimpleRateThrottle):
    """Anonymous requests, by client address (:meth:`get_ident`); scope ``anon``."""

    scope = "anon"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        if request.user and request.user.is_authenticated:
            return None  # only anonymous requests are throttled
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


def _user_key(throttle: SimpleRateThrottle, request: Any) -> str:
    """DRF's key by user: the signed-in user's primary key, else the client address."""
    user = request.user
    ident = user.pk if user and user.is_authenticated else throttle.get_ident(request)
    return throttle.cache_format % {"scope": throttle.scope, "ident": ident}


class UserRateThrottle(SimpleRateThrottle):
    """Requests by user (anonymous ones by client address); scope ``user``."""

    scope = "user"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        return _user_key(self, request)


class ScopedRateThrottle(SimpleRateThrottle):
    """Views with a ``throttle_scope``, each scope at its rate of ``THROTTLE_RATES``, by
    user (anonymous requests by client address); views without one are not throttled."""

    scope_attr = "throttle_scope"

    def __init__(self) -> None:
        # The rate depends on the view: known when the view calls allow_request.
        pass

    def decision(self, request: Any, view: Any) -> Decision | None:
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return None
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().decision(request, view)

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        return _user_key(self, request)


#: The ``get_cache_key`` of our classes: each keys on the session's user or the client's
#: address.
_CLIENT_KEYS = frozenset(
    [
        AnonRateThrottle.get_cache_key,
        UserRateThrottle.get_cache_key,
        ScopedRateThrottle.get_cache_key,
    ]
)


# -- one check for all of a view's throttles -------------------------------------------------


def _view_decisions(decision: Decision, request: Any, view: Any) -> list[Decision]:
    """What every throttle of ours on ``view`` decides for the request (``decision``, the
    asking throttle's, among them), as the view's ``get_throttles()`` makes them."""
    if not _several_throttles(view):
        return [decision]
    found = []
    for other in view.get_throttles():
        if isinstance(other, SimpleRateThrottle):
            made = other.decision(request, view)
            if made is not None:
                found.append(made)
    if all(d.check != decision.check for d in found):  # called by hand, not by the view
        found.insert(0, decision)
    return found


def _several_throttles(view: Any) -> bool:
    """True unless the view surely has one throttle at most (the default ``get_throttles``
    over one class): then there is nobody to check with."""
    get = getattr(view, "get_throttles", None)
    if get is None:
        return False
    if getattr(type(view).get_throttles, "__qualname__", "") == "APIView.get_throttles":
        return len(getattr(view, "throttle_classes", ())) > 1
    return True


def _own_timer(throttle: SimpleRateThrottle) -> bool:
    """True when ``throttle`` reads the limiter's clock (its ``timer`` is not overridden)."""
    return type(throttle).timer is SimpleRateThrottle.timer and "timer" not in vars(throttle)


def _keyed_on_the_client(throttle: SimpleRateThrottle) -> bool:
    """True when ``throttle`` counts the requester itself (our classes' keys: the session's
    user or the client's address). A ``get_cache_key`` of a project's own may key on a value
    the request names (a posted user name): its counter is not the requester's to read, so
    only a refusal shows it (docs/security.rst)."""
    return type(throttle).get_cache_key in _CLIENT_KEYS
