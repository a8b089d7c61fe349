from __future__ import annotations

import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory, override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit_app import keys
from ratelimit_app.core import namespace

rf = RequestFactory()


def test_ip_is_remote_addr_and_ignores_spoofed_forwarded_for() -> None:
    request = rf.get("/", REMOTE_ADDR="203.0.113.7", HTTP_X_FORWARDED_FOR="1.2.3.4")
    assert keys.client_ip(request) == "203.0.113.7"


@override_settings(RATELIMIT_TRUSTED_PROXIES=["10.0.0.0/8"])
def test_forwarded_for_read_right_to_left_from_trusted_proxies() -> None:
    request = rf.get(
        "/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.9, 10.0.0.5"
    )
    # 10.0.0.5 is a trusted proxy; 198.51.100.9 is the first untrusted hop: the client.
    # 6.6.6.6 was written by the client itself and is ignored.
    assert keys.client_ip(request) == "198.51.100.9"
    untrusted_peer = rf.get("/", REMOTE_ADDR="192.0.2.1", HTTP_X_FORWARDED_FOR="6.6.6.6")
    assert keys.client_ip(untrusted_peer) == "192.0.2.1"
    garbage = rf.get("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="not-an-ip, 10.0.0.3")
    assert keys.client_ip(garbage) == "10.0.0.2"  # a broken proxy: count the proxy


@override_settings(RATELIMIT_IPV4_MASK=24, RATELIMIT_IPV6_MASK=48)
def test_masks() -> None:
    assert keys.client_ip(rf.get("/", REMOTE_ADDR="203.0.113.77")) == "203.0.113.0"
    assert keys.client_ip(rf.get("/", REMOTE_ADDR="2001:db8:1:2:3::1")) == "2001:db8:1::"
    # An IPv4-mapped IPv6 address is the IPv4 client it maps.
    assert keys.client_ip(rf.get("/", REMOTE_ADDR="::ffff:203.0.113.77")) == "203.0.113.0"


@override_settings(RATELIMIT_IP_META_KEY="HTTP_X_REAL_IP")
def test_ip_meta_key_as_django_ratelimit() -> None:
    assert keys.client_ip(rf.get("/", HTTP_X_REAL_IP="198.51.100.1")) == "198.51.100.1"


def test_missing_or_invalid_remote_addr_is_none() -> None:
    assert keys.client_ip(rf.get("/", REMOTE_ADDR="")) is None
    assert keys.client_ip(rf.get("/", REMOTE_ADDR="garbage")) is None


def test_email_normalised_from_form_and_json() -> None:
    form = rf.post("/", {"email": "  Foo@X.com "})
    assert keys.subject("email", "g", form) == ("email", "foo@x.com")
    # Fullwidth look-alikes fold to ASCII (NFKC), and case folds too.
    wide = rf.post("/", {"email": "ＦＯＯ@x.com"})
    assert keys.subject("email", "g", wide) == ("email", "foo@x.com")
    body = rf.post("/", json.dumps({"email": "FOO@x.COM"}), content_type="application/json")
    assert keys.subject("email", "g", body) == ("email", "foo@x.com")
    named = rf.post("/", {"username": "Bob@Example.org"})
    assert keys.subject("email:username", "g", named) == ("email:username", "bob@example.org")


def test_missing_values_fall_back_to_the_ip_never_a_shared_bucket() -> None:
    for spec in ("email", "header:x-api-key", "get:q", "post:name", "user"):
        request = rf.post("/", {}, REMOTE_ADDR="198.51.100.4")
        assert keys.subject(spec, "g", request) == ("ip", "198.51.100.4"), spec
    no_ip = rf.post("/", {}, REMOTE_ADDR="")
    assert keys.subject("email", "g", no_ip) is None


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("{not json", "application/json"),
        ("[1, 2]", "application/json"),
        ('{"email": 5}', "application/json"),
        ("--x\r\nbroken", "multipart/form-data; boundary=x"),
        ("\xff\xfe", "application/json"),
    ],
)
def test_malformed_bodies_fall_back_to_ip(body: str, content_type: str) -> None:
    request = rf.post("/", body, content_type=content_type, REMOTE_ADDR="198.51.100.5")
    assert keys.subject("email", "g", request) == ("ip", "198.51.100.5")


def test_huge_and_control_character_values() -> None:
    huge = rf.post("/", {"email": "a" * 10_000 + "@x.com"}, REMOTE_ADDR="198.51.100.6")
    assert keys.subject("email", "g", huge) == ("ip", "198.51.100.6")
    control = rf.post("/", {"email": "bob\x00\u200b@x.com"})
    assert keys.subject("email", "g", control) == ("email", "bob@x.com")


def test_header_get_post() -> None:
    request = rf.post("/?q=hello", {"name": "n1"}, HTTP_X_API_KEY="k-1")
    assert keys.subject("header:x-api-key", "g", request) == ("header:x-api-key", "k-1")
    assert keys.subject("get:q", "g", request) == ("get:q", "hello")
    assert keys.subject("post:name", "g", request) == ("post:name", "n1")


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) Mobile/15E148", "mobile"),
        ("Mozilla/5.0 (Linux; Android 14; Pixel 8) Mobile Safari/537.36", "mobile"),
        ("Mozilla/5.0 (iPad; CPU OS 17_0 like Mac OS X)", "tablet"),
        ("Mozilla/5.0 (Linux; Android 13; SM-X700) Safari/537.36", "tablet"),
        ("Mozilla/5.0 (X11; Linux x86_64) Chrome/120.0 Safari/537.36", "desktop"),
        ("Googlebot/2.1 (+http://www.google.com/bot.html)", "bot"),
        ("curl/8.5.0", "bot"),
        ("", "bot"),
    ],
)
def test_device(agent: str, expected: str) -> None:
    assert keys.subject("device", "g", rf.get("/", HTTP_USER_AGENT=agent)) == ("device", expected)


def test_callable_and_dotted_path_keys() -> None:
    request = rf.get("/", REMOTE_ADDR="198.51.100.7")
    assert keys.subject(lambda g, r: f"{g}-x", "grp", request)[1] == "grp-x"  # type: ignore[index]
    assert keys.subject("tests.ratelimit.test_keys.tenant", "grp", request) == (
        "tests.ratelimit.test_keys.tenant",
        "tenant-1",
    )


def tenant(group: str, request: object) -> str:
    return "tenant-1"


@pytest.mark.parametrize("spec", ["nope", "header:", "cookie:x", "no.such.module.fn", ""])
def test_bad_keys_are_configuration_errors(spec: str) -> None:
    with pytest.raises(ImproperlyConfigured):
        keys.subject(spec, "g", rf.get("/"))


def test_namespace_hides_personal_data_and_is_a_safe_memcached_key() -> None:
    ns = namespace("login", "email", "alice@example.com")
    assert "alice" not in ns and "example" not in ns
    assert ns.startswith("{") and ns.endswith("}") and len(ns) == 34
    assert namespace("login", "email", "alice@example.com") == ns
    assert namespace("login", "ip", "alice@example.com") != ns  # kinds never collide


values = st.text(alphabet=st.characters(codec="utf-8"), max_size=400) | st.sampled_from(
    ["", " ", "\x00", "a" * 10_000, "ＦＯＯ@x.com", "1.2.3.4, 5.6.7.8", "::1"]
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(values, values, values)
def test_extractors_never_raise(value: str, header: str, forwarded: str) -> None:
    request = rf.post(
        "/?q=" + value[:50].replace("&", ""),
        {"email": value, "name": value},
        HTTP_X_API_KEY=header.replace("\n", ""),
        HTTP_USER_AGENT=header.replace("\n", ""),
        HTTP_X_FORWARDED_FOR=forwarded.replace("\n", ""),
        REMOTE_ADDR="198.51.100.8",
    )
    with override_settings(RATELIMIT_TRUSTED_PROXIES=["198.51.100.0/24"]):
        for spec in ("ip", "email", "header:x-api-key", "get:q", "post:name", "device"):
            result = keys.subject(spec, "g", request)
            assert result is not None
            kind, text = result
            assert text and len(text) <= keys.MAX_VALUE_LENGTH
            assert kind in (spec, "ip")
