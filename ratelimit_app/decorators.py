"""``@ratelimit``: django-ratelimit 4.1's decorator, on sliding windows or a leaky bucket.

Works on function views, async views, methods of class-based views (with or without
``method_decorator``) and on view classes themselves (their ``dispatch`` is wrapped).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from ratelimit_app import ALL, UNSAFE, gcra, keys, limits, rates, responses
from ratelimit_app.backends import get_backend
from ratelimit_app.conf import conf
from ratelimit_app.core import failure_dict, group_name, limit_usage
from ratelimit_app.limits import Limit, Method

__all__ = ["ratelimit"]

F = TypeVar("F", bound=Callable[..., Any])

#: Decorated views whose configuration is invalid, for the system checks. Keyed by view, so
#: ``method_decorator`` (which decorates again on every request) adds nothing.
registry: dict[str, list[str]] = {}


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
    algorithm: str = gcra.SLIDING_WINDOW,
    burst: int | None = None,
) -> Callable[[F], F]:
    """Limit a view: django-ratelimit's arguments and meaning, sliding windows underneath.

    ``request.limited`` tells the view whether it is over the limit; with ``block=True`` a
    limited request raises ``RATELIMIT_EXCEPTION_CLASS`` (``Ratelimited``, a
    ``PermissionDenied``) before the view runs.

    When the counter backend is down, ``RATELIMIT_FAIL_OPEN`` decides: open, no limit
    applies; closed (the default), ``request.limited`` is true and, with ``block=True``, the
    view is answered ``RATELIMIT_FAIL_CLOSED_STATUS`` (503, "service unavailable") as a
    fail-closed rule is, rather than a refusal that would blame the client.

    ``algorithm="leaky_bucket"`` meters a leaky bucket instead (:mod:`ratelimit_app.gcra`):
    ``rate`` is its leak rate (one rate) and ``burst`` its capacity (default: the rate's
    count). A bad algorithm or burst is reported like a bad rate: system check E010, and
    ``ImproperlyConfigured`` when the view is called.
    """

    def decorator(fn: F) -> F:
        if isinstance(fn, type):
            # Each view class gets its own default group, even when it inherits dispatch.
            name = f"{fn.__module__}.{fn.__qualname__}"
            fn.dispatch = _wrap(fn.dispatch, group or name, name)  # type: ignore[attr-defined]
            return fn
        return _wrap(fn, group, group_name(fn))

    def _wrap(fn: F, group: str | None, view_name: str) -> F:
        limit: Limit | None = None
        problems: list[str] = []
        if rate is not None:  # django-ratelimit's "no rate, no limit"
            try:
                limit = limits.build(group or view_name, key, rate, method, algorithm, burst)
            except ImproperlyConfigured as exc:
                # Every mistake at once, for check E010 (a LimitError carries them all).
                problems = [str(error) for error in getattr(exc, "errors", (exc,))]
                registry[view_name] = problems

        def before(request: HttpRequest) -> HttpResponse | None:
            """Count the request; the answer instead of the view's, if any."""
            if problems:
                raise ImproperlyConfigured(f"@ratelimit on {view_name}: {' '.join(problems)}")
            old_limited = getattr(request, "limited", False)
            usage = None
            if limit is not None and conf.ENABLE:
                usage = limit_usage(request, limit, increment=True)
            limited = bool(usage and usage["should_limit"])
            request.limited = limited or old_limited  # type: ignore[attr-defined]
            if limited and block:
                if usage == failure_dict():
                    # The counters are down and the limit fails closed: the page is
                    # unavailable, as a fail-closed rule's is; the client did nothing wrong.
                    return responses.unavailable(request)
                raise _exception(usage, limit)
            return None

        if iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapped(*args: Any, **kwargs: Any) -> Any:
                request = _find_request(args)
                if limit is not None and limit.async_safe and _inline_ok():
                    answer = before(request)  # one bounded round trip: cheaper than a thread
                else:
                    answer = await sync_to_async(before)(request)
                return answer if answer is not None else await fn(*args, **kwargs)

            return async_wrapped  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            answer = before(_find_request(args))
            return answer if answer is not None else fn(*args, **kwargs)

        return wrapped  # type: ignore[return-value]

    return decorator


def _inline_ok() -> bool:
    try:
        return get_backend().inline_ok
    except Exception:  # cannot be built: get_usage reports it, off the event loop
        return False


def _exception(usage: dict[str, Any] | None, limit: Limit | None) -> Exception:
    cls = conf.EXCEPTION_CLASS
    exc = cls()
    with contextlib.suppress(AttributeError):  # a custom class may use __slots__
        exc.usage = usage  # type: ignore[attr-defined]
        # The 429 page words its answer by whom the limit counts (its key).
        exc.limit = limit  # type: ignore[attr-defined]
    return exc


ratelimit.ALL = ALL  # type: ignore[attr-defined]
ratelimit.UNSAFE = UNSAFE  # type: ignore[attr-defined]
