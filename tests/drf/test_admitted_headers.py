"""The ``RateLimit`` headers of DRF views: shown as the rules and ``@ratelimit`` show them.

An admitted response shows the counters of throttles keyed on the requester (the address or
the user: our classes' keys); a throttle keyed on what the request names shows only its
refusal. With ``@ratelimit`` or the middleware's rules around the view, each limit of the
request is shown once, in one pair of headers.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import path
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from ratelimit_app import throttling
from ratelimit_app.decorators import ratelimit
from ratelimit_app.testing import frozen_clock
from tests.drf.conftest import api_view, get
from tests.ratelimit.test_admitted_headers import under_rule

pytestmark = pytest.mark.usefixtures("backend_kind")

T0 = 1_800_000_000.0


class User:
    is_authenticated = True

    def __init__(self, pk: int) -> None:
        self.pk = pk


def throttle(base: type, scope: str, rate: str | None = None, **attrs: Any) -> type:
    if rate is not None:
        attrs["rate"] = rate
    return type(f"Throttle_{scope}", (base,), {"scope": scope, **attrs})


def test_a_user_throttle_shows_the_users_counter(scope: str) -> None:
    view = api_view(throttle(throttling.UserRateThrottle, scope, "3/m"))
    with frozen_clock(T0):
        anonymous = get(view)
        signed_in = [get(view, user=User(7)) for _ in range(2)]
    assert anonymous["RateLimit-Policy"] == f'"drf:{scope}:3/m";q=3;w=60'
    assert anonymous["RateLimit"] == f'"drf:{scope}:3/m";r=2;t=61'
    assert signed_in[1]["RateLimit"] == f'"drf:{scope}:3/m";r=1;t=61'


def test_anon_and_user_throttles_together(scope: str) -> None:
    view = api_view(
        throttle(throttling.AnonRateThrottle, scope + "a", "2/m"),
        throttle(throttling.UserRateThrottle, scope + "u", "5/m"),
    )
    with frozen_clock(T0):
        response = get(view)
    assert response["RateLimit"] == (f'"drf:{scope}a:2/m";r=1;t=61, "drf:{scope}u:5/m";r=4;t=61')


def test_a_scoped_throttle(scope: str, rates: Any) -> None:
    rates(**{scope: "4/m"})
    view = api_view(throttling.ScopedRateThrottle, throttle_scope=scope)
    with frozen_clock(T0):
        response = get(view, user=User(8))
    assert response["RateLimit"] == f'"drf:{scope}:4/m";r=3;t=61'


class ByName(throttling.SimpleRateThrottle):
    """Keyed on a name the request gives: anyone's counter."""

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": request.GET.get("name")}


def test_a_counter_of_what_the_request_names_shows_only_its_refusal(scope: str) -> None:
    view = api_view(throttle(ByName, scope, "1/m"))
    with frozen_clock(T0):
        admitted = get(view, QUERY_STRING="name=alice")
        refused = get(view, QUERY_STRING="name=alice")
    assert admitted.status_code == 200 and refused.status_code == 429
    assert "RateLimit" not in admitted and "RateLimit-Policy" not in admitted
    assert refused["RateLimit"] == f'"drf:{scope}:1/m";r=0;t=61'


def test_a_request_passed_again_gets_its_headers_again(scope: str) -> None:
    view = api_view(throttle(throttling.AnonRateThrottle, scope, "3/m"))
    request = APIRequestFactory().get("/api/", REMOTE_ADDR="192.0.2.1")
    with frozen_clock(T0):
        answers = [view(request), view(request)]
    assert [a["RateLimit"] for a in answers] == [
        f'"drf:{scope}:3/m";r=2;t=61',
        f'"drf:{scope}:3/m";r=1;t=61',
    ]


def test_a_decorated_drf_view_shows_both_once(scope: str) -> None:
    """``@ratelimit`` on the view class is outside DRF's dispatch: it writes the headers,
    its limit first, then the throttle's, on DRF's 429 too."""

    @ratelimit(group=scope + "-deco", key="ip", rate="9/m")
    class Page(APIView):
        throttle_classes = [throttle(throttling.AnonRateThrottle, scope, "2/m")]

        def get(self, request: Any) -> Response:
            return Response({"ok": True})

    view = Page.as_view()
    with frozen_clock(T0):
        response, _, refused = get(view), get(view), get(view)
    assert response["RateLimit-Policy"] == f'"9/m";q=9;w=60, "drf:{scope}:2/m";q=2;w=60'
    assert response["RateLimit"] == f'"9/m";r=8;t=61, "drf:{scope}:2/m";r=1;t=61'
    assert refused.status_code == 429
    assert refused["RateLimit"] == f'"9/m";r=6;t=61, "drf:{scope}:2/m";r=0;t=61'


class Throttled(APIView):
    throttle_classes = [throttle(throttling.AnonRateThrottle, "adm-drf-mw", "3/m")]

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


urlpatterns = [path("api/", Throttled.as_view())]


@pytest.mark.urls(__name__)
def test_under_a_rule_both_are_shown_once(client: Any) -> None:
    """The throttle leaves its decision to the rules, and the response shows both."""
    response = under_rule(client, "/api/", name="api-ip", key="ip", rate="10/m")
    assert response["RateLimit-Policy"] == '"api-ip:10/m";q=10;w=60, "drf:adm-drf-mw:3/m";q=3;w=60'
    assert response["RateLimit"] == '"api-ip:10/m";r=9;t=61, "drf:adm-drf-mw:3/m";r=2;t=61'
