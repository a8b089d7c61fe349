"""Django REST framework: a refused ``@ratelimit`` answers 429, as everywhere else.

DRF handles ``PermissionDenied`` (``Ratelimited`` is one) inside its views and answers 403
before ``RatelimitMiddleware`` sees it. Point DRF at this handler::

    REST_FRAMEWORK = {"EXCEPTION_HANDLER": "myproject.api.exception_handler"}
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from rest_framework.views import exception_handler as drf_exception_handler

from ratelimit_app.exceptions import Ratelimited
from ratelimit_app.responses import too_many_requests


def exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse | None:
    if isinstance(exc, Ratelimited):
        request = context["request"]._request  # the Django request under DRF's
        return too_many_requests(request, exc, exc.usage)
    return drf_exception_handler(exc, context)
