"""The log-in of docs/rules' shell sessions: any answer is a wrong password (200, the form
again, as Django's log-in view answers one), the rule counting every POST."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path


def login(request: HttpRequest) -> HttpResponse:
    return HttpResponse("the form again")


urlpatterns = [path("login/", login)]
