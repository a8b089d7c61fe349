"""Who a throttle counts: ``get_ident`` against spoofed, padded, mapped and hostile addresses.

DRF's ``NUM_PROXIES`` is honoured as DRF does, and made safe where a mistake in it, or in the
headers a client sends, would let one client count as many (or many as one).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from ratelimit_app import throttling
from ratelimit_app.identity import keys
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.drf.conftest import api_view, get

T0 = 1_800_000_000.0
PROXY = "10.0.0.2"


def ident(remote: Any = "192.0.2.1", xff: str | None = None, **settings: Any) -> str | None:
    """What our ``get_ident`` makes of a request from ``remote`` with ``X-Forwarded-For``."""
    meta = {"REMOTE_ADDR": remote}
    if xff is not None:
        meta["HTTP_X_FORWARDED_FOR"] = xff
    request = Request(APIRequestFactory().get("/api/", **meta))
    with override_settings(**settings):
        return throttling.BaseThrottle().get_ident(request)


def proxies(n: int | None) -> dict[str, Any]:
    return {"REST_FRAMEWORK": {"NUM_PROXIES": n}}


def test_unset_num_proxies_ignores_a_spoofed_header() -> None:
    """DRF takes the whole ``X-Forwarded-For`` then, which any client writes: we take the
    peer, as every ``ip`` key does."""
    assert ident("192.0.2.1", "203.0.113.5") == "192.0.2.1"
    assert ident("192.0.2.1", "203.0.113.5, 203.0.113.6") == "192.0.2.1"


def test_unset_num_proxies_reads_the_header_from_trusted_proxies() -> None:
    trusted = {"RATELIMIT_TRUSTED_PROXIES": ["10.0.0.0/8"]}
    assert ident(PROXY, "203.0.113.9, 198.51.100.7, 10.0.0.9", **trusted) == "198.51.100.7"


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, PROXY),
        (1, "198.51.100.3"),
        (2, "198.51.100.2"),
        (3, "198.51.100.1"),
        (9, "198.51.100.1"),
    ],
)
def test_num_proxies_as_drf_counts_them(n: int, expected: str) -> None:
    assert ident(PROXY, "198.51.100.1, 198.51.100.2, 198.51.100.3", **proxies(n)) == expected


def test_num_proxies_without_the_header_is_the_peer() -> None:
    assert ident(PROXY, None, **proxies(1)) == PROXY


def test_a_client_that_bypasses_the_proxy_cannot_choose_its_address() -> None:
    """``NUM_PROXIES = 1`` and a client reaching Django directly with a header of its own:
    with ``RATELIMIT_TRUSTED_PROXIES`` set, a peer that is not a proxy counts as itself."""
    spoof = {**proxies(1), "RATELIMIT_TRUSTED_PROXIES": ["10.0.0.0/8"]}
    assert ident("192.0.2.66", "203.0.113.1", **spoof) == "192.0.2.66"
    assert ident(PROXY, "203.0.113.1", **spoof) == "203.0.113.1"
    # Without the list, DRF's rule as it is: the header is believed (docs/drf.rst says so).
    assert ident("192.0.2.66", "203.0.113.1", **proxies(1)) == "203.0.113.1"


@pytest.mark.parametrize(
    "hop",
    ["garbage", "1.2.3.4.5", "", " ", "\x00", "198.51.100.1:8080", "unknown", "x" * 10_000],
)
def test_a_hop_that_is_no_address_counts_the_proxy(hop: str) -> None:
    assert ident(PROXY, f"203.0.113.1, {hop}", **proxies(1)) == PROXY


@pytest.mark.parametrize(
    "same",
    [
        " 198.51.100.9",
        "198.51.100.9 ",
        "\t198.51.100.9",
        "::ffff:198.51.100.9",
        "::FFFF:c633:6409",
    ],
)
def test_padded_and_mapped_addresses_are_one_client(same: str) -> None:
    assert ident(PROXY, same, **proxies(1)) == "198.51.100.9"
    assert ident(same) == "198.51.100.9"


def test_an_ipv6_client_is_its_64() -> None:
    """A client holds a whole /64: ``RATELIMIT_IPV6_MASK``, as every ``ip`` key."""
    assert ident("2001:db8:0:1::1") == ident("2001:db8:0:1:ffff::9") == "2001:db8:0:1::"
    assert ident("2001:db8:0:2::1") == "2001:db8:0:2::"
    assert ident("2001:db8::1", RATELIMIT_IPV6_MASK=128) == "2001:db8::1"
    assert ident(PROXY, "2001:db8:0:1::7", **proxies(1)) == "2001:db8:0:1::"


@pytest.mark.parametrize("remote", [None, "", "not-an-ip", "192.0.2.1:5555"])
def test_no_usable_address_is_none(remote: Any) -> None:
    assert ident(remote) is None
    assert ident(remote, "203.0.113.1, 203.0.113.2", **proxies(0)) is None


@pytest.mark.parametrize("bad", ["1", -1, 1.5])
def test_a_bad_num_proxies_is_a_configuration_error(bad: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="NUM_PROXIES"):
        ident(PROXY, "203.0.113.1", **proxies(bad))


def test_spoofing_does_not_escape_the_limit(scope: str) -> None:
    """Through the view: one client, a new forged header each time, one counter."""
    limited = type("T", (throttling.AnonRateThrottle,), {"scope": scope, "rate": "2/m"})
    view = api_view(limited)
    with frozen_clock(T0):
        answers = [
            get(view, ip="192.0.2.50", HTTP_X_FORWARDED_FOR=f"203.0.113.{n}").status_code
            for n in range(5)
        ]
    assert answers == [200, 200, 429, 429, 429]


@settings(max_examples=200, deadline=None)
@given(
    remote=st.one_of(st.none(), st.text(max_size=60), st.ip_addresses().map(str)),
    xff=st.one_of(st.none(), st.text(max_size=200)),
    n=st.one_of(st.none(), st.integers(min_value=0, max_value=5)),
)
def test_any_headers_give_an_address_or_none(remote: Any, xff: str | None, n: int | None) -> None:
    """Whatever a client or a proxy sends: a masked address (one ``parse_address`` reads)
    or None, never an exception."""
    found = ident(remote, xff, **proxies(n))
    assert found is None or keys.parse_address(found) is not None
    if found is not None:
        assert keys.mask_ip(found) == found


@settings(max_examples=100, deadline=None)
@given(xff=st.text(max_size=300), n=st.integers(min_value=0, max_value=3))
def test_any_forwarded_header_is_answered_never_a_500(xff: str, n: int) -> None:
    """Through a real view on local memory: a 200 or a 429, whatever the header holds."""
    forget_refusals()
    limited = type("T", (throttling.AnonRateThrottle,), {"scope": "fuzz", "rate": "1000/s"})
    with override_settings(**proxies(n)):
        answer = get(api_view(limited), ip=PROXY, HTTP_X_FORWARDED_FOR=xff)
    assert answer.status_code in (200, 429)
