"""Views of the gunicorn site: each answers with the pid of the worker that served it, and
the id its metrics flushes carry in the flush ledger (``<id>:<sequence>``)."""

from __future__ import annotations

import os

from django.http import HttpRequest, HttpResponse
from django.urls import path

from metrics_app import buffer, record
from metrics_app.decorators import count_visits

VISITS = "reliability:visits"


def by_worker(worker: int) -> str:
    """The series of the visits one worker (pid) served: what each worker lost is known."""
    return f"{VISITS}:{worker}"


def pid(request: HttpRequest) -> HttpResponse:
    headers = {"X-Pid": str(os.getpid()), "X-Flush-Id": buffer.current().aggregator.process_id}
    return HttpResponse(str(os.getpid()), headers=headers)


@count_visits(VISITS)
def counted(request: HttpRequest) -> HttpResponse:
    record(by_worker(os.getpid()))
    return pid(request)


urlpatterns = [
    path("pid/", pid),
    path("limited/", pid),  # behind the "one-subject" rule
    path("counted/", counted),
]
