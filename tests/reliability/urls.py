"""Views behind ``RATELIMIT_RULES`` for the in-process fault tests."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("open/", plain),
    path("closed/", plain),
]
