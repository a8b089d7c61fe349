"""``count_visits``: count a view's successful responses as a series.

A short-URL service counts each redirect of a key::

    @count_visits(series="shorturl:{key}")
    def follow(request, key): ...

The series name is ``series`` formatted with the view's keyword arguments, or what a callable
``series(request, *args, **kwargs)`` returns. Only responses with a status below 400 count:
a 404 for a made-up key must not create a series per guess. A name :func:`metrics_app.record`
refuses (too long, a NUL: the URL chose it) is not counted, with a WARNING, and the response
goes out as the view made it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction

from metrics_app.buffer import record

logger = logging.getLogger("metrics_app")

F = TypeVar("F", bound=Callable[..., Any])

SeriesName = str | Callable[..., str]


def _name(series: SeriesName, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    if callable(series):
        return series(request, *args, **kwargs)
    return series.format(**kwargs)


def _count(series: SeriesName, request: Any, args: Any, kwargs: Any, response: Any) -> None:
    if getattr(response, "status_code", 200) < 400:
        try:
            record(_name(series, request, args, kwargs))
        except ValueError as exc:
            # The name is built from the URL, so a visitor chooses it: a name record()
            # refuses costs that visit's count, never the response (it would be a 500).
            logger.warning("count_visits: a visit was not counted: %s", exc)


def count_visits(series: SeriesName) -> Callable[[F], F]:
    """Decorate a sync or async view so each successful response records one visit."""

    def decorator(view: F) -> F:
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
                response = await view(request, *args, **kwargs)
                _count(series, request, args, kwargs, response)
                return response

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(view)
        def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            response = view(request, *args, **kwargs)
            _count(series, request, args, kwargs, response)
            return response

        return wrapper  # type: ignore[return-value]

    return decorator
