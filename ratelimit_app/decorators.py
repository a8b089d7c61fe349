"""``@ratelimit``: django-ratelimit 4.1's decorator, on sliding windows or a leaky bucket.

Works on function views, async views, methods of class-based views (with or without
``method_decorator``) and on view classes themselves (their ``dispatch`` is wrapped).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponseBase

from ratelimit_app import ALL, UNSAFE
from ratelimit_app.algorithms import rates
from ratelimit_app.conf import conf
from ratelimit_app.config import kinds, limits
from ratelimit_app.config.limits import Limit, Method
from ratelimit_app.config.policy import Policy, policy
from ratelimit_app.core import group_name, limit_verdict, limit_verdicting
from ratelimit_app.engine.matched import on_the_loop
from ratelimit_app.engine.outcome import Outcome, view_outcome
from ratelimit_app.engine.trips import arun
from ratelimit_app.identity import keys

__all__ = ["ratelimit"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Registered:
    """What the system checks report of one decorated view."""

    #: Its configuration's mistakes (check E010).
    problems: tuple[str, ...] = ()
    #: No rate: it limits nothing (check W010).
    unlimited: bool = False
    #: A literal cost over the whole limit (check W011).
    over_cost: str | None = None


#: Decorated views with something to report, for the system checks. Keyed by view, so
#: ``method_decorator`` (which decorates again on every request) adds nothing.
registry: dict[str, Registered] = {}


def _find_request(args: tuple[Any, ...]) -> HttpRequest:
    # fn(request, ...) or, undecorated by method_decorator, fn(self, request, ...).
    if args and hasattr(args[0], "META"):
        return args[0]
    if len(args) > 1 and hasattr(args[1], "META"):
        return args[1]
    raise TypeError("@ratelimit could not find the request among the view's arguments.")


def ratelimit(
    group: str | None = None,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    block: bool = True,
    algorithm: str = kinds.DEFAULT,
    burst: int | None = None,
    cost: limits.CostSpec = 1,
    shadow: bool = False,
    concurrent: int | None = None,
    lease: str | int | None = None,
    ban: dict[str, Any] | None = None,
    quota: str | None = None,
    timezone: str | None = None,
    fallback: str | bool | None = None,
) -> Callable[[F], F]:
    """Limit a view: django-ratelimit's arguments and meaning, sliding windows underneath.

    ``request.limited`` tells the view whether it is over the limit; with ``block=True`` a
    limited request raises ``RATELIMIT_EXCEPTION_CLASS`` (``Ratelimited``, a
    ``PermissionDenied``) before the view runs.

    The view's response gets the ``RateLimit`` headers of
    the limit when it counts the client itself (an ``ip``, ``user`` or ``user_or_ip`` key),
    or is over; each limit of a request once, written by the outermost layer
    (:func:`ratelimit_app.core.show`).

    When the counter backend is down, ``RATELIMIT_FAIL_OPEN`` decides: open, no limit
    applies; closed (the default), ``request.limited`` is true and, with ``block=True``, the
    view is answered 503 ("service unavailable") as a
    fail-closed rule is, rather than a refusal that would blame the client.

    ``algorithm="leaky_bucket"`` meters a leaky bucket instead
    (:mod:`ratelimit_app.algorithms.gcra`):
    ``rate`` is its leak rate (one rate) and ``burst`` its capacity (default: the rate's
    count). A bad algorithm or burst is reported like a bad rate: system check E010, and
    ``ImproperlyConfigured`` when the view is called. No rate limits nothing, as in
    django-ratelimit (check W010); a bare ``@ratelimit`` raises ``TypeError`` at import.

    ``cost``: the hits each request counts (an integer, or a callable
    ``(group, request) -> int``; 0: the limit does not apply); the view may add more with
    :func:`ratelimit_app.charge`. ``shadow=True``: a dry run: nothing is refused, and what
    would be is counted as a refusal would be, logged and signalled (``docs/operators``).
    ``concurrent=n``: at most ``n`` requests of a subject inside the view at once (alone, or
    with a rate), each holding its place until its response is done, or for ``lease`` at
    most (``"30s"``, ``"2m"``; default a minute) when its worker dies. ``ban``:
    ``{"after": 10, "within": "10m", "for": "1h", "max": "1d"}`` bans a subject refused
    that often; ``fallback="memory"`` counts in memory during an outage (``docs/operators``).
    """
    if callable(group):  # a bare @ratelimit: the view came as the first argument
        raise TypeError(
            f"@ratelimit on {group_name(group)} has no parentheses: use "
            "@ratelimit(key=..., rate=...), e.g. @ratelimit(key='ip', rate='5/m')."
        )

    # django-ratelimit's "no rate, no limit" (check W010): nothing to build.
    unlimited = rate is None and concurrent is None and quota is None
    options: dict[str, Any] = {"cost": cost, "concurrent": concurrent, "lease": lease, "ban": ban}
    if quota is not None or timezone is not None:
        options.update(quota=quota, timezone=timezone)

    def decorator(fn: F) -> F:
        if isinstance(fn, type):
            # Each view class gets its own default group, even when it inherits dispatch.
            name = f"{fn.__module__}.{fn.__qualname__}"
        else:
            name = group_name(fn)
        build = None
        if not unlimited:
            build = functools.partial(
                limits.build, group or name, key, rate, method, algorithm, burst, **options
            )
        guard = ViewLimit(name, block, build, shadow, fallback)
        if isinstance(fn, type):
            fn.dispatch = _wrap(fn.dispatch, guard)  # type: ignore[attr-defined]
            return fn
        return _wrap(fn, guard)

    return decorator


class ViewLimit:
    """One decorated view's limit, and what its requests get before the view runs."""

    __slots__ = ("block", "holds", "limit", "policy", "problems", "view_name")

    def __init__(
        self,
        view_name: str,
        block: bool,
        build: Callable[[], Limit] | None,
        shadow: bool = False,
        fallback: Any = None,
    ) -> None:
        """The limit of ``view_name``, made by ``build`` (None: no limit, as django-ratelimit
        has it without a rate), and its policy (``shadow``: a dry run; ``fallback``: while
        the counters are down)."""
        self.view_name = view_name
        self.block = block
        self.holds = False
        self.limit: Limit | None = None
        #: How the limit is enforced (None: no limit, or a mistake in it).
        self.policy: Policy | None = None
        self.problems: list[str] = []
        if build is None:
            registry[view_name] = Registered(unlimited=True)
            return
        try:
            self.limit = build()
            self.holds = self.limit.inflight is not None or self.limit.algorithm_kind.holds_places
            self.policy = policy(self.limit, shadow=bool(shadow), fallback=fallback)
            over = self.limit.cost_problem()
            if over is not None:
                registry[self.view_name] = Registered(over_cost=f"{self.view_name}: {over}")
        except ImproperlyConfigured as exc:
            # Every mistake at once, for check E010 (a LimitError carries them all).
            self.problems = [str(error) for error in getattr(exc, "errors", (exc,))]
            registry[self.view_name] = Registered(problems=tuple(self.problems))

    def inline(self) -> bool:
        """True when an async view's check may run on the event loop, its round trip
        awaited (:meth:`aenter`): it reads no database and calls no user code."""
        # (A limit of places always runs in a thread, as its give-back does.)
        return self.limit is not None and not self.holds and on_the_loop([self.limit])

    def enter(self, request: HttpRequest) -> HttpResponseBase | Outcome:
        """Count the request: the answer instead of the view's (a 503 when the counters are
        down and the limit fails closed; a refusal raises ``RATELIMIT_EXCEPTION_CLASS`` when
        the limit blocks), else what to do after the view (:class:`Outcome`: places to give
        back, headers to write)."""
        if self.problems:
            raise ImproperlyConfigured(
                f"@ratelimit on {self.view_name}: {' '.join(self.problems)}"
            )
        verdict = None
        if self.policy is not None and conf.ENABLE:
            verdict = limit_verdict(request, self.policy)
        return view_outcome(request, verdict, self.block, self.holds)

    async def aenter(self, request: HttpRequest) -> HttpResponseBase | Outcome:
        """:meth:`enter` on the event loop, its round trip awaited (when :meth:`inline`)."""
        if self.problems:
            return self.enter(request)  # (raises)
        verdict = None
        if self.policy is not None and conf.ENABLE:
            verdict = await arun(limit_verdicting(request, self.policy))
        return view_outcome(request, verdict, self.block, self.holds)


def _wrap(fn: F, guard: ViewLimit) -> F:
    """``fn`` (sync or async) with ``guard`` before it, and the outcome finished after it
    (after an exception too: the places are given back)."""
    if iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapped(*args: Any, **kwargs: Any) -> Any:
            request = _find_request(args)
            if guard.inline():
                entered = await guard.aenter(request)
            else:
                entered = await sync_to_async(guard.enter)(request)
            if isinstance(entered, HttpResponseBase):
                return entered
            try:
                response = await fn(*args, **kwargs)
            except BaseException:
                if entered.places:  # a round trip: off the event loop
                    await sync_to_async(entered.abort)()
                else:
                    entered.abort()
                raise
            if entered.places and not getattr(response, "streaming", False):
                return await sync_to_async(entered.finish)(response)
            return entered.finish(response)

        async_wrapped.ratelimit_limits = _limits(fn, guard)  # type: ignore[attr-defined]
        return async_wrapped  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        request = _find_request(args)
        entered = guard.enter(request)
        if isinstance(entered, HttpResponseBase):
            return entered
        try:
            response = fn(*args, **kwargs)
        except BaseException:
            entered.abort()
            raise
        return entered.finish(response)

    wrapped.ratelimit_limits = _limits(fn, guard)  # type: ignore[attr-defined]
    return wrapped  # type: ignore[return-value]


def _limits(fn: Callable[..., Any], guard: ViewLimit) -> tuple[ViewLimit, ...]:
    """The guards of every ``@ratelimit`` on ``fn``, this one last, left on its wrapper:
    the admin and the commands find a view's limits there (:mod:`ratelimit_app.config.views`)."""
    return (*getattr(fn, "ratelimit_limits", ()), guard)


ratelimit.ALL = ALL  # type: ignore[attr-defined]
ratelimit.UNSAFE = UNSAFE  # type: ignore[attr-defined]
