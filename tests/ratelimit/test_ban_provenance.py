"""Which refusals count toward a ban (docs/operators.rst, "Which requests count toward a
ban"): :func:`~ratelimit_app.identity.provenance.page_sent`, and the strikes it spares, on
local memory, real memcached and real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path

from ratelimit_app import store
from ratelimit_app.decorators import ratelimit
from ratelimit_app.identity.provenance import page_sent
from ratelimit_app.models import Ban
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE

T0 = 1_800_000_000.0


def fetch(site: str | None, mode: str = "no-cors", dest: str = "image", **meta: Any) -> Any:
    """A request with the Fetch Metadata a browser sends (none with ``site=None``)."""
    if site is not None:
        meta.update(HTTP_SEC_FETCH_SITE=site, HTTP_SEC_FETCH_MODE=mode, HTTP_SEC_FETCH_DEST=dest)
    return RequestFactory().get("/s/zz1", **meta)


# -- the predicate ----------------------------------------------------------------------------


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize(
    ("site", "sent"),
    [
        ("cross-site", True),
        ("same-site", True),  # another subdomain: someone else's page, maybe
        ("none", False),  # typed, a bookmark
        (" None ", False),  # header values are read as browsers would send them
        ("CROSS-SITE", True),
        ("anything-new", True),  # a value the spec may add: not the client's own
    ],
)
def test_fetch_metadata_says_who_sent_it(site: str, sent: bool, strict: bool) -> None:
    assert page_sent(fetch(site), strict) is sent


@pytest.mark.parametrize(
    ("mode", "dest", "strict", "sent"),
    [
        ("no-cors", "image", False, False),  # an <img> of the site's own page
        ("no-cors", "image", True, True),  # ... which anyone may have planted there
        ("navigate", "iframe", True, True),
        ("cors", "empty", True, True),  # the site's own script
        ("navigate", "document", True, False),  # a link the user followed
        ("navigate", "document", False, False),
    ],
)
def test_same_origin_is_the_clients_own_but_strictly_only_a_navigation(
    mode: str, dest: str, strict: bool, sent: bool
) -> None:
    assert page_sent(fetch("same-origin", mode, dest), strict) is sent


@pytest.mark.parametrize(
    ("meta", "sent"),
    [
        ({}, False),  # a program of the client's own (curl, a scanner)
        ({"HTTP_ORIGIN": "https://forum.example"}, True),
        ({"HTTP_ORIGIN": "null"}, True),  # a sandboxed page, a data: URL
        ({"HTTP_ORIGIN": "http://testserver"}, False),
        ({"HTTP_ORIGIN": "https://TestServer.:8443"}, False),  # the host, not its port
        ({"HTTP_REFERER": "https://forum.example/t/42"}, True),
        ({"HTTP_REFERER": "http://testserver/links/"}, False),
        ({"HTTP_REFERER": "/relative"}, False),  # names no host
        ({"HTTP_REFERER": "http://[::1"}, False),  # cannot be read
        ({"HTTP_ORIGIN": "http://testserver", "HTTP_REFERER": "https://a.example/"}, True),
    ],
)
def test_without_fetch_metadata_origin_and_referer_say(meta: dict[str, Any], sent: bool) -> None:
    for strict in (False, True):
        assert page_sent(fetch(None, **meta), strict) is sent


def test_fetch_metadata_wins_over_the_referer() -> None:
    request = fetch("none", HTTP_REFERER="https://forum.example/")
    assert page_sent(request, True) is False


def test_an_unknown_host_is_read_as_sent() -> None:
    request = fetch(None, HTTP_REFERER="http://evil.example/", HTTP_HOST="not-allowed.example")
    assert page_sent(request, False) is True
    request = fetch(None, HTTP_REFERER="http://x.example/", HTTP_HOST="x.example")
    assert page_sent(request, False) is False


def test_a_drf_request_is_read_through_and_none_is_nobodys() -> None:
    class Wrapper:
        _request = fetch("cross-site")

    assert page_sent(Wrapper(), False) is True
    assert page_sent(None, True) is False


# -- the strikes it spares ---------------------------------------------------------------------


@ratelimit(group="images", key="ip", rate="1/m", ban={"after": 2, "within": "1h", "for": "10m"})
def decorated(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("decorated/", decorated)]
pytestmark = [pytest.mark.django_db]


@pytest.fixture
def fresh() -> Iterator[None]:
    store.forget()
    forget_refusals()
    with override_settings(MIDDLEWARE=MIDDLEWARE):
        yield
    store.forget()
    forget_refusals()


IMAGE: dict[str, Any] = {"HTTP_SEC_FETCH_SITE": "cross-site", "HTTP_SEC_FETCH_MODE": "no-cors"}


@pytest.mark.urls(__name__)
@pytest.mark.usefixtures("backend_kind", "fresh")
def test_a_decorators_ban_counts_no_page_sent_refusal(client: Client) -> None:
    with frozen_clock(T0) as clock:
        codes = [client.get("/decorated/", **IMAGE).status_code for _ in range(6)]
        assert codes == [200] + [429] * 5  # refused at the limit's rate all the same
        assert not Ban.objects.exists()
        clock.advance(61)
        codes = [client.get("/decorated/").status_code for _ in range(3)]
    assert codes == [200, 429, 429] and Ban.objects.count() == 1  # its own requests do
