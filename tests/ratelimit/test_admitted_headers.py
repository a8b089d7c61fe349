"""``@ratelimit`` adds the ``RateLimit`` headers to the responses it admits, as rules do.

Only the requester's own counters are shown on an admitted response (a key on the address
or the user); a counter keyed on what the request names shows only when it refuses. Each
limit of a request is shown once: the outermost layer that shows limits writes the headers
of every layer inside it (:func:`ratelimit_app.core.show`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from django.urls import path
from django.views import View

from ratelimit_app import core, request_state, store
from ratelimit_app.decorators import ratelimit
from ratelimit_app.exceptions import Ratelimited
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE, rules

pytestmark = pytest.mark.usefixtures("backend_kind")

T0 = 1_800_000_000.0


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    forget_refusals()
    yield
    forget_refusals()


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def call(view: Any, ip: str = "192.0.2.1", **post: str) -> HttpResponse:
    factory = RequestFactory()
    request = factory.post("/", post, REMOTE_ADDR=ip) if post else factory.get("/", REMOTE_ADDR=ip)
    response: HttpResponse = view(request)
    return response


def test_an_admitted_request_shows_its_counter() -> None:
    view = ratelimit(group="adm-ip", key="ip", rate="3/m")(ok)
    with frozen_clock(T0):
        first, second = call(view), call(view)
        other = call(view, ip="192.0.2.2")
    assert first["RateLimit-Policy"] == '"3/m";q=3;w=60'
    assert first["RateLimit"] == '"3/m";r=2;t=61'
    assert second["RateLimit"] == '"3/m";r=1;t=61'
    assert other["RateLimit"] == '"3/m";r=2;t=61'  # another client, its own counter


def test_every_rate_of_a_limit() -> None:
    view = ratelimit(group="adm-rates", key="user_or_ip", rate="2/m;10/h")(ok)
    with frozen_clock(T0):
        first = call(view)
    assert first["RateLimit-Policy"] == '"2/m";q=2;w=60, "10/h";q=10;w=3600'
    assert first["RateLimit"].startswith('"2/m";r=1;')


def test_a_counter_of_what_the_request_names_shows_only_its_refusal() -> None:
    """Someone else's counter (a posted email) is not the requester's to read; its refusal
    (``block=False``: the view answers) shows how long to wait, as a rule's does."""
    seen = []

    def view(request: HttpRequest) -> HttpResponse:
        seen.append(request.limited)  # type: ignore[attr-defined]
        return HttpResponse("ok")

    limited = ratelimit(group="adm-email", key="post:email", rate="1/m", block=False)(view)
    with frozen_clock(T0):
        admitted = call(limited, email="someone@example.com")
        refused = call(limited, email="someone@example.com")
    assert seen == [False, True]
    assert "RateLimit" not in admitted and "RateLimit-Policy" not in admitted
    assert refused["RateLimit-Policy"] == '"1/m";q=1;w=60'
    assert refused["RateLimit"] == '"1/m";r=0;t=61'


def test_a_non_blocking_refusal_of_the_own_counter() -> None:
    view = ratelimit(group="adm-nb", key="ip", rate="1/m", block=False)(ok)
    with frozen_clock(T0):
        call(view)
        refused = call(view)
    assert refused.status_code == 200
    assert refused["RateLimit"] == '"1/m";r=0;t=61'


def test_stacked_decorators_show_each_limit_once() -> None:
    """The outermost decorator writes the headers: its limit first, then the inner ones."""
    inner = ratelimit(group="adm-in", key="ip", rate="5/m")(ok)
    named = ratelimit(group="adm-named", key="post:email", rate="9/m")(inner)
    outer = ratelimit(group="adm-out", key="user_or_ip", rate="100/h")(named)
    with frozen_clock(T0):
        response = call(outer, email="someone@example.com")
    assert response["RateLimit-Policy"] == '"100/h";q=100;w=3600, "5/m";q=5;w=60'
    assert response["RateLimit"] == '"100/h";r=99;t=3660, "5/m";r=4;t=61'


def test_a_request_passed_again_starts_afresh() -> None:
    """The writer forgets what it showed, even when an inner decorator refuses: a request
    object called again (as tests do) gets its own headers."""
    inner = ratelimit(group="adm-again-in", key="ip", rate="1/m")(ok)
    outer = ratelimit(group="adm-again", key="ip", rate="5/m")(inner)
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.1")
    with frozen_clock(T0):
        first = outer(request)
        with pytest.raises(Ratelimited):
            outer(request)
        kept = request_state.of(request)
        assert kept is not None and kept.shown is None
        again = ratelimit(group="adm-again-2", key="ip", rate="5/m")(ok)
        answers = [again(request), again(request)]
    assert first["RateLimit"] == '"5/m";r=4;t=61, "1/m";r=0;t=61'
    assert [a["RateLimit"] for a in answers] == ['"5/m";r=4;t=61', '"5/m";r=3;t=61']


def test_the_views_own_headers_stay() -> None:
    def own(request: HttpRequest) -> HttpResponse:
        response = HttpResponse("ok")
        response["RateLimit"] = "mine"
        return response

    response = call(ratelimit(group="adm-own", key="ip", rate="3/m")(own))
    assert response["RateLimit"] == "mine"
    assert response["RateLimit-Policy"] == '"3/m";q=3;w=60'


def test_an_async_view() -> None:
    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    limited = ratelimit(group="adm-async", key="ip", rate="3/m")(view)
    with frozen_clock(T0):
        response = asyncio.run(limited(RequestFactory().get("/", REMOTE_ADDR="192.0.2.1")))
    assert response["RateLimit"] == '"3/m";r=2;t=61'


def test_a_class_based_view() -> None:
    @ratelimit(group="adm-class", key="ip", rate="3/m")
    class Page(View):
        def get(self, request: HttpRequest) -> HttpResponse:
            return HttpResponse("ok")

    with frozen_clock(T0):
        response = call(Page.as_view())
    assert response["RateLimit"] == '"3/m";r=2;t=61'


def test_a_request_shows_what_every_layer_put_on_it() -> None:
    """:func:`core.show`: the first caller writes, later ones add to its list."""
    request = RequestFactory().get("/")
    owned = core.show(request, [])
    assert owned == []
    assert core.show(request, ["d"]) is None  # type: ignore[list-item]
    assert owned == ["d"]


# -- under the middleware's rules -------------------------------------------------------------


@ratelimit(group="adm-mw", key="ip", rate="5/m")
def decorated(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("adm/", decorated)]


def under_rule(client: Any, url: str, **rule: Any) -> HttpResponse:
    """A GET of ``url`` under the middleware and ``rule``."""
    store.forget()
    with rules({"path": url, **rule}, MIDDLEWARE=MIDDLEWARE), frozen_clock(T0):
        response: HttpResponse = client.get(url)
    store.forget()
    return response


@pytest.mark.urls(__name__)
def test_under_a_rule_both_are_shown_once(client: Any) -> None:
    """The rule's limit first, then the decorator's, each once."""
    response = under_rule(client, "/adm/", name="adm-rule", key="ip", rate="10/m")
    assert response["RateLimit-Policy"] == '"adm-rule:10/m";q=10;w=60, "5/m";q=5;w=60'
    assert response["RateLimit"] == '"adm-rule:10/m";r=9;t=61, "5/m";r=4;t=61'
