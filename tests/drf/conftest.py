"""Fixtures for ``ratelimit_app.throttling``: DRF views behind our throttles, on real servers.

``backend_kind`` (from ``tests/ratelimit/conftest.py``) runs a test on local memory, real
memcached and real Redis; the counters are alias ``rl``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from ratelimit_app.testing import forget_refusals
from tests.peers.conftest import closed_port  # noqa: F401  (a fixture)
from tests.ratelimit.conftest import backend_kind  # noqa: F401  (a fixture)

_unique = itertools.count()


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    """No refusal remembered from an earlier test, and DRF's settings as configured."""
    forget_refusals()
    api_settings.reload()
    yield
    forget_refusals()
    api_settings.reload()


@pytest.fixture
def scope() -> str:
    """A throttle scope no other test counts in."""
    return f"s{next(_unique)}"


def api_view(*throttles: type, **attrs: Any) -> Callable[..., Any]:
    """A DRF view (GET answers ``{"ok": true}``) behind ``throttles``; ``attrs`` are set on
    the view class (``throttle_scope``...)."""

    def get(self: APIView, request: Any) -> Response:
        return Response({"ok": True})

    cls = type("ThrottledView", (APIView,), {"throttle_classes": list(throttles), "get": get})
    for name, value in attrs.items():
        setattr(cls, name, value)
    return cls.as_view()


def get(view: Callable[..., Any], ip: str = "192.0.2.1", user: Any = None, **meta: Any) -> Any:
    """One GET of ``view`` from ``ip`` (signed in as ``user`` when given)."""
    from rest_framework.test import force_authenticate

    request = APIRequestFactory().get("/api/", REMOTE_ADDR=ip, **meta)
    if user is not None:
        force_authenticate(request, user=user)
    return view(request)


def statuses(view: Callable[..., Any], n: int, **kwargs: Any) -> list[int]:
    return [get(view, **kwargs).status_code for _ in range(n)]


@pytest.fixture
def rates() -> Iterator[Callable[..., None]]:
    """``rates(scope="5/m", ...)``: those ``DEFAULT_THROTTLE_RATES`` while the test runs."""
    stack: list[Any] = []

    def apply(**found: Any) -> None:
        changed = override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": found})
        changed.enable()
        stack.append(changed)

    yield apply
    while stack:
        stack.pop().disable()
