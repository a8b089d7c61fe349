"""What the limiter leaves on a request: one private attribute, besides django-ratelimit's
public ``limited`` and ``ratelimit_usage`` (:mod:`ratelimit_app.request_state`).

Every layer at once: a middleware rule keyed on a JSON body's field (the body parsed once for
the keys), ``@ratelimit`` around a DRF view, two DRF throttles of ours (sharing one check),
and ``charge()`` in the view. The request's attributes are compared with those the same view
leaves with no limit at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import path
from django.utils.decorators import method_decorator
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app import charge, request_state, store, throttling
from ratelimit_app.decorators import ratelimit
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE, rules

pytestmark = pytest.mark.usefixtures("backend_kind")

T0 = 1_800_000_000.0
#: What the limiter may set on a request (issue 36: at most three).
ALLOWED = {request_state.ATTRIBUTE, "limited", "ratelimit_usage"}
#: Each view's last requests: (the DRF request, the Django request it wraps).
SEEN: list[tuple[Any, Any]] = []


class Anon(throttling.AnonRateThrottle):
    scope = "attrs-anon"
    rate = "50/m"


class User(throttling.UserRateThrottle):
    scope = "attrs-user"
    rate = "60/m"


class Plain(APIView):
    def post(self, request: Any) -> Response:
        assert request.data == {"email": "someone@example.com"}  # the body read either way
        SEEN.append((request, request._request))
        return Response({"ok": True})


@method_decorator(ratelimit(key="ip", rate="40/m"), name="post")
class Limited(Plain):
    throttle_classes = [Anon, User]

    def post(self, request: Any) -> Response:
        assert charge(request, 1) >= 2  # the decorator's limit and the throttles'
        return super().post(request)


urlpatterns = [path("plain/", Plain.as_view()), path("limited/", Limited.as_view())]


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    store.forget()
    forget_refusals()
    SEEN.clear()
    yield
    store.forget()
    forget_refusals()


def attributes(client: Any, url: str) -> tuple[set[str], set[str]]:
    """The attribute names of the DRF request and of the Django request after a POST."""
    body = json.dumps({"email": "someone@example.com"})
    rule = {"path": "/limited/", "key": "post:email", "rate": "30/m", "name": "attrs-email"}
    with rules(rule, MIDDLEWARE=MIDDLEWARE), frozen_clock(T0):
        response = client.post(url, body, content_type="application/json")
    assert response.status_code == 200, response.content
    drf, django = SEEN.pop()
    return set(vars(drf)), set(vars(django))


@pytest.mark.urls(__name__)
def test_every_layer_sets_at_most_three_attributes(client: Any) -> None:
    plain_drf, plain_django = attributes(client, "/plain/")
    limited_drf, limited_django = attributes(client, "/limited/")
    added = (limited_drf - plain_drf) | (limited_django - plain_django)
    assert added <= ALLOWED, added - ALLOWED
    assert limited_django >= ALLOWED


@pytest.mark.urls(__name__)
def test_the_state_holds_what_the_layers_share(client: Any) -> None:
    """The Django request's state: the JSON body parsed for the rule's key, the rule's
    verdict; the DRF request's: the throttles' shared check, the decorator's verdict and
    theirs."""
    body = json.dumps({"email": "someone@example.com"})
    rule = {"path": "/limited/", "key": "post:email", "rate": "30/m", "name": "attrs-email"}
    with rules(rule, MIDDLEWARE=MIDDLEWARE), frozen_clock(T0):
        response = client.post("/limited/", body, content_type="application/json")
    drf, django = SEEN.pop()
    # The rule's counter is of what the request names (not shown when admitted); the inner
    # layers' are the requester's own (the throttles run before the method's decorator),
    # and the middleware writes them.
    assert response["RateLimit-Policy"] == (
        '"drf:attrs-anon:50/m";q=50;w=60, "drf:attrs-user:60/m";q=60;w=60, "40/m";q=40;w=60'
    )
    outer, inner = request_state.of(django), request_state.of(drf)
    assert outer is not None and inner is not None and outer is not inner
    assert outer.json == {"email": "someone@example.com"}
    assert [[d.name for d in v.decisions] for v in outer.verdicts] == [["attrs-email"]]
    assert inner.throttles is not None and len(inner.verdicts) == 2
    assert outer.shown is None  # the middleware wrote the headers and let them go
