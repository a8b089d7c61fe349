"""Requests another site's page makes a reader's browser send earn no ban (docs/operators.rst,
"Which requests count toward a ban").

The demo's ``shorturl-scan`` rule (30 wrong short keys a minute per address, failures only)
bans an address from the whole site after 5 refusals within 10 minutes. A forum post or an
HTML e-mail with 35 ``<img src="https://site/s/zz1">`` makes every reader's browser send them
from the reader's own address: the limit still refuses them, but they must not ban the reader.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client, override_settings

from ratelimit_app import store
from ratelimit_app.models import Ban
from ratelimit_app.testing import forget_refusals, frozen_clock

T0 = 1_800_000_000.0
READER = "192.0.2.10"

#: The Fetch Metadata a browser sends with an ``<img>`` of another site's page.
CROSS_SITE_IMAGE: dict[str, Any] = {
    "HTTP_SEC_FETCH_SITE": "cross-site",
    "HTTP_SEC_FETCH_MODE": "no-cors",
    "HTTP_SEC_FETCH_DEST": "image",
}
#: ... of a page of the site itself (a forum post on the same site).
SAME_ORIGIN_IMAGE: dict[str, Any] = {**CROSS_SITE_IMAGE, "HTTP_SEC_FETCH_SITE": "same-origin"}
#: ... of an address typed in the address bar, or a bookmark.
TYPED: dict[str, Any] = {
    "HTTP_SEC_FETCH_SITE": "none",
    "HTTP_SEC_FETCH_MODE": "navigate",
    "HTTP_SEC_FETCH_DEST": "document",
}


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    """No ban or refusal left in this process by an earlier test."""
    store.forget()
    forget_refusals()
    yield
    store.forget()
    forget_refusals()


def scan(headers: dict[str, Any], n: int = 35) -> list[int]:
    """The statuses of ``n`` requests for an unknown short key from :data:`READER`."""
    client = Client()
    return [client.get("/s/zz1", REMOTE_ADDR=READER, **headers).status_code for _ in range(n)]


def site_pages() -> list[int]:
    """The reader's own requests afterwards: the home page and the log-in page."""
    client = Client()
    return [client.get(p, REMOTE_ADDR=READER).status_code for p in ("/", "/accounts/login/")]


def test_a_page_of_images_does_not_ban_its_reader() -> None:
    with frozen_clock(T0):
        codes = scan(CROSS_SITE_IMAGE)
        assert codes == [404] * 30 + [429] * 5  # the limit still refuses them
        assert site_pages() == [200, 200]
    assert not Ban.objects.exists()


def test_a_scanner_is_still_banned_from_the_site() -> None:
    with frozen_clock(T0):
        assert scan({}) == [404] * 30 + [429] * 5
        assert site_pages() == [429, 429]
    assert Ban.objects.get().seconds == 900


def test_an_address_typed_in_the_browser_counts() -> None:
    with frozen_clock(T0):
        scan(TYPED)
        assert site_pages() == [429, 429]


def test_a_same_origin_image_earns_no_site_ban(demo_settings: dict[str, Any]) -> None:
    """An ``<img>`` planted on the site itself is same-origin too: a site-wide ban counts
    only what the reader asked for (a top-level navigation)."""
    with frozen_clock(T0):
        assert scan(SAME_ORIGIN_IMAGE) == [404] * 30 + [429] * 5
        assert site_pages() == [200, 200]
    assert not Ban.objects.exists()


def test_a_same_origin_image_earns_a_ban_on_the_rules_own_paths(
    demo_settings: dict[str, Any],
) -> None:
    rules = [
        {**r, "ban": {**r["ban"], "scope": "rule"}} if r["name"] == "shorturl-scan" else r
        for r in demo_settings["RATELIMIT_RULES"]
    ]
    with override_settings(RATELIMIT_RULES=rules), frozen_clock(T0) as clock:
        scan(SAME_ORIGIN_IMAGE)
        clock.advance(120)  # the window is empty again: the ban holds
        banned = Client().get("/s/zz1", REMOTE_ADDR=READER, **SAME_ORIGIN_IMAGE)
        assert (banned.status_code, banned["Retry-After"]) == (429, "780")
        assert site_pages() == [200, 200]  # on the rule's paths only
    assert Ban.objects.count() == 1


def test_a_cross_site_image_earns_no_ban_on_the_rules_own_paths(
    demo_settings: dict[str, Any],
) -> None:
    rules = [
        {**r, "ban": {**r["ban"], "scope": "rule"}} if r["name"] == "shorturl-scan" else r
        for r in demo_settings["RATELIMIT_RULES"]
    ]
    with override_settings(RATELIMIT_RULES=rules), frozen_clock(T0):
        scan(CROSS_SITE_IMAGE)
    assert not Ban.objects.exists()


@pytest.mark.parametrize(
    ("headers", "banned"),
    [
        ({"HTTP_REFERER": "https://forum.example/t/42"}, False),
        ({"HTTP_ORIGIN": "https://forum.example"}, False),
        ({"HTTP_ORIGIN": "null"}, False),
        ({"HTTP_REFERER": "http://testserver/links/"}, True),
        ({"HTTP_ORIGIN": "http://testserver"}, True),
    ],
)
def test_without_fetch_metadata_origin_and_referer_tell(
    headers: dict[str, Any], banned: bool
) -> None:
    """A browser from before Fetch Metadata (or a site on plain HTTP) still sends a
    ``Referer`` (or ``Origin``) naming the page that made it send the request."""
    with frozen_clock(T0):
        scan(headers)
    assert Ban.objects.exists() is banned
