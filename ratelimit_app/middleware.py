"""``RatelimitMiddleware``: turns ``Ratelimited`` into a response.

As in django-ratelimit, ``RATELIMIT_VIEW`` (a dotted path to ``view(request, exception)``)
answers when it is set. Otherwise the answer is a plain 429 with ``Retry-After``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

from ratelimit_app.conf import conf
from ratelimit_app.exceptions import Ratelimited


def ratelimited_response(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The response for a limited request: ``RATELIMIT_VIEW`` or a 429."""
    view = conf.VIEW
    if view:
        handler = import_string(view) if isinstance(view, str) else view
        return handler(request, exception)
    usage = getattr(exception, "usage", None) or {}
    response = HttpResponse("Too many requests.\n", status=429, content_type="text/plain")
    retry_after = usage.get("retry_after")
    if retry_after and retry_after > 0:
        response["Retry-After"] = str(int(retry_after))
    return response


class RatelimitMiddleware:
    """Sync and async capable; both paths share :func:`ratelimited_response`."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> Any:
        response: Awaitable[Any] = self.get_response(request)
        return await response

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        if isinstance(exception, Ratelimited | conf.EXCEPTION_CLASS):
            return ratelimited_response(request, exception)
        return None
