"""Views of the demo site."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse


def hello(request: HttpRequest) -> HttpResponse:
    """The home page: a plain view for the rate-limit examples to decorate."""
    return HttpResponse("Hello from the django-bucketry demo.\n", content_type="text/plain")
