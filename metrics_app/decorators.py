"""``count_visits``: count a view's successful responses as a series.

A short-URL service counts each redirect of a key::

    @count_visits(series="shorturl:{key}")
    def follow(request, key): ...

The series name is ``series`` formatted with the view's keyword arguments, or what a
callable ``series(request, *args, **kwargs)`` returns. Such a name holds what the client
typed, so it is recorded as *client-chosen*: all of them together take at most 300,000 of
the buffer's 350,000 keys (:data:`metrics_app.buffer.aggregator.MAX_CLIENT_KEYS`), and the
names the code chooses (the limiter's ``ratelimit:<rule>``) keep the rest. A plain string
without ``{...}`` names one series, chosen by the code.

What counts: a response with a status below 400 (a 404 for a made-up key must not create a
series per guess), and, when ``only`` is given, only if ``only(request, *args, **kwargs)``
is true: a view that answers 200 for any slug passes ``only`` to count the slugs that exist.

A name :func:`metrics_app.record` refuses (too long, a NUL: the URL chose it) is not counted,
with a WARNING, and the response goes out as the view made it.
"""

from __future__ import annotations

import functools
import logging
import string
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async

from metrics_app.buffer import record

logger = logging.getLogger("metrics_app")

F = TypeVar("F", bound=Callable[..., Any])

SeriesName = str | Callable[..., str]
#: ``only(request, *args, **kwargs) -> bool``, a coroutine function for an async view if it
#: likes (a plain one is then run in a thread, so it may query the database).
Only = Callable[..., Any]


def _name(series: SeriesName, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    if callable(series):
        return series(request, *args, **kwargs)
    return series.format(**kwargs)


def _client_chosen(series: SeriesName) -> bool:
    """Whether the request shapes the names: a callable, or a template with a field."""
    if callable(series):
        return True
    return any(field is not None for _, field, _, _ in string.Formatter().parse(series))


def _succeeded(response: Any) -> bool:
    return bool(getattr(response, "status_code", 200) < 400)


def _count(series: SeriesName, client_chosen: bool, request: Any, args: Any, kwargs: Any) -> None:
    try:
        record(_name(series, request, args, kwargs), client_chosen=client_chosen)
    except ValueError as exc:
        # The name is built from the URL, so a visitor chooses it: a name record()
        # refuses costs that visit's count, never the response (it would be a 500).
        logger.warning("count_visits: a visit was not counted: %s", exc)


def count_visits(series: SeriesName, *, only: Only | None = None) -> Callable[[F], F]:
    """Decorate a sync or async view so each successful response records one visit.

    ``only(request, *args, **kwargs)``, when given, must also be true for the visit to count
    (for example, that the slug names a page that exists).
    """
    client_chosen = _client_chosen(series)
    only_is_async = only is not None and iscoroutinefunction(only)

    def decorator(view: F) -> F:
        if iscoroutinefunction(view):
            check = only
            if check is not None and not only_is_async:
                check = sync_to_async(check)

            @functools.wraps(view)
            async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
                response = await view(request, *args, **kwargs)
                if _succeeded(response) and (
                    check is None or await check(request, *args, **kwargs)
                ):
                    _count(series, client_chosen, request, args, kwargs)
                return response

            return async_wrapper  # type: ignore[return-value]

        if only_is_async:
            raise TypeError(
                f"count_visits(only={only!r}) is a coroutine function; "
                f"{view!r} is a sync view, which cannot await it"
            )

        @functools.wraps(view)
        def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            response = view(request, *args, **kwargs)
            if _succeeded(response) and (only is None or only(request, *args, **kwargs)):
                _count(series, client_chosen, request, args, kwargs)
            return response

        return wrapper  # type: ignore[return-value]

    return decorator
