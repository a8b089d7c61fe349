"""Views of the gunicorn site: each answers with the pid of the worker that served it."""

from __future__ import annotations

import os

from django.http import HttpRequest, HttpResponse
from django.urls import path

from metrics_app.decorators import count_visits

VISITS = "reliability:visits"


def pid(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(os.getpid()), headers={"X-Pid": str(os.getpid())})


urlpatterns = [
    path("pid/", pid),
    path("limited/", pid),  # behind the "one-subject" rule
    path("counted/", count_visits(VISITS)(pid)),
]
