"""The JSON API's HTTP Basic authentication, in a module of its own: Django REST framework
imports the classes of ``DEFAULT_AUTHENTICATION_CLASSES`` while ``rest_framework.views`` is
still loading, so they cannot live beside the views (``demo_site.api``)."""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import BasicAuthentication
from rest_framework.request import Request


class BasicAuthenticationOnPost(BasicAuthentication):
    """HTTP Basic, read on POST only: the method the log-in rules cover at ``/api/``.

    DRF checks the password before any throttle, so only a middleware rule can hold the
    account's budget here. Those rules count a failed request as a wrong password; on the
    API's reads, a failure is also an unknown key (404), which must not count against the
    account of a client that sent the right password. Reading credentials on POST alone
    keeps the two apart: an API POST fails only on a wrong password (401) or a page that
    does not exist. A GET with credentials is served as anonymous (reading needs no
    account).
    """

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        if request.method != "POST":
            return None
        return super().authenticate(request)
