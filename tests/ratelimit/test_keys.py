from __future__ import annotations

import ipaddress
import json
import tracemalloc
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.test import RequestFactory, override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit_app.identity import addresses, keys, namespaces
from ratelimit_app.identity.keys import namespace
from ratelimit_app.runtime import RUNTIME

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


@pytest.mark.parametrize("remote", ["", "garbage", "unix:", None])
def test_missing_or_invalid_remote_addr_is_a_configuration_error(remote: str | None) -> None:
    request = rf.get("/", REMOTE_ADDR=remote)
    if remote is None:
        del request.META["REMOTE_ADDR"]  # what Django's ASGI handler leaves on a Unix socket
    with pytest.raises(ImproperlyConfigured) as caught:
        keys.client_ip(request)
    message = str(caught.value)
    for setting in ("REMOTE_ADDR", "RATELIMIT_IP_META_KEY", "RATELIMIT_TRUSTED_PROXIES"):
        assert setting in message


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
    with pytest.raises(ImproperlyConfigured):
        keys.subject("email", "g", no_ip)
    # A value needs no address.
    known = rf.post("/", {"email": "k@example.org"}, REMOTE_ADDR="")
    assert keys.subject("email", "g", known) == ("email", "k@example.org")


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("{not json", "application/json"),
        ("[1, 2]", "application/json"),
        ("--x\r\nbroken", "multipart/form-data; boundary=x"),
        ("\xff\xfe", "application/json"),
    ],
)
def test_malformed_bodies_fall_back_to_ip(body: str, content_type: str) -> None:
    request = rf.post("/", body, content_type=content_type, REMOTE_ADDR="198.51.100.5")
    assert keys.subject("email", "g", request) == ("ip", "198.51.100.5")


def test_huge_and_control_character_values() -> None:
    huge = rf.post("/", {"email": "a" * 10_000 + "@x.com"}, REMOTE_ADDR="198.51.100.6")
    kind, value = keys.subject("email", "g", huge)
    # Its own subject, a hash of the value: never the IP, never the raw 10 kB.
    assert kind == "email" and value.startswith("long:sha256:") and len(value) < 80
    again = rf.post("/", {"email": "A" * 10_000 + "@X.com "}, REMOTE_ADDR="198.51.100.7")
    assert keys.subject("email", "g", again) == (kind, value)
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


# --- padding, long and invalid values -------------------------------------------------------

#: More padding than the old 1,280-character cut-off, which dropped the value before
#: stripping it (and fell back to the client IP, while Django's forms strip the padding).
PAD = " " * 2000


def _subjects_of(value: str) -> dict[str, tuple[str, str]]:
    """The subject of ``value`` through every accessor that reads a client-sent value."""
    query = urllib.parse.urlencode({"q": value})
    form = rf.post(f"/?{query}", {"email": value, "name": value, "username": value})
    body = json.dumps({"email": value, "name": value, "username": value})
    as_json = rf.post("/", body, content_type="application/json")
    header = rf.get("/", HTTP_X_API_KEY=value)
    return {
        "get:q": keys.subject("get:q", "g", form),
        "post:name": keys.subject("post:name", "g", form),
        "post:name json": keys.subject("post:name", "g", as_json),
        "email": keys.subject("email", "g", form),
        "email json": keys.subject("email", "g", as_json),
        "email:username": keys.subject("email:username", "g", form),
        "header:x-api-key": keys.subject("header:x-api-key", "g", header),
        "callable": keys.subject(lambda g, r: value, "g", header),
    }


@pytest.mark.parametrize("pad", [PAD, "\t\r\n" * 700, "\u3000" * 1500, "\u200b" * 1500])
def test_a_padded_value_is_the_value_it_pads_in_every_accessor(pad: str) -> None:
    plain = _subjects_of("Alice@Example.com")
    for padded in (pad + "Alice@Example.com", "Alice@Example.com" + pad):
        assert _subjects_of(padded) == plain
    assert all(value.lower() == "alice@example.com" for _, value in plain.values())


def test_a_value_still_too_long_is_a_subject_of_its_own_never_the_ip() -> None:
    long_value = "x" * (keys.MAX_VALUE_LENGTH + 1)
    subjects = _subjects_of(long_value)
    assert {kind for kind, _ in subjects.values()} != {"ip"}
    for name, (kind, value) in subjects.items():
        assert kind != "ip", name
        assert value == keys.derived("long", long_value.encode()), name
    # Padded, it is the same subject; another long value is another subject.
    assert _subjects_of(PAD + long_value + PAD) == subjects
    assert _subjects_of(long_value + "y")["email"] != subjects["email"]


def test_lone_surrogates_are_an_invalid_value_of_their_own() -> None:
    """``"\\ud800"`` from a JSON body is no text any encoding can write: ``namespace``
    encoded it and raised (a 500)."""
    body = json.dumps({"email": "\ud800", "username": "a\udfffb"})
    request = rf.post("/", body, content_type="application/json")
    for spec, kind in (("email", "email"), ("email:username", "email:username")):
        found = keys.subject(spec, "g", request)
        assert found[0] == kind and found[1].startswith("invalid:sha256:")
        namespace("g", *found)  # raised UnicodeEncodeError
    padded = rf.post("/", json.dumps({"email": "  \ud800\u200b "}), content_type="text/json")
    assert keys.subject("email", "g", padded) == keys.subject("email", "g", request)
    other = rf.post("/", json.dumps({"email": "\ud801"}), content_type="application/json")
    assert keys.subject("email", "g", other) != keys.subject("email", "g", request)


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (b"tenant-1", "tenant-1"),
        (b"  tenant-1\x00 ", "tenant-1"),
        (b"\xff\xfe", keys.derived("invalid", b"\xff\xfe")),
        (10**5000, keys.derived("long", f"{10**5000:x}".encode())),
        ("t" * 10_000, keys.derived("long", b"t" * 10_000)),
        ("\ud800", keys.derived("invalid", "\ud800".encode("utf-8", "surrogatepass"))),
    ],
    ids=["bytes", "padded-bytes", "bad-utf8", "huge-int", "huge-str", "lone"],
)
def test_callable_keys_returning_other_types(returned: object, expected: str) -> None:
    request = rf.get("/", REMOTE_ADDR="198.51.100.7")
    found = keys.subject(lambda g, r: returned, "g", request)
    assert found[1] == expected
    namespace("g", *found)


def test_callable_keys_returning_nothing_fall_back_to_the_ip() -> None:
    request = rf.get("/", REMOTE_ADDR="198.51.100.7")
    for nothing in (None, "", b"", "  \u200b "):
        assert keys.subject(lambda g, r, v=nothing: v, "g", request) == ("ip", "198.51.100.7")


def test_json_values_that_are_not_strings_are_the_text_a_form_would_make() -> None:
    """A view passing ``data["username"]`` to the ORM or a form finds user ``"12345"`` for
    ``12345``: the value is not missing."""
    for sent, expected in ((12345, "12345"), (1.5, "1.5"), (["a@b.c"], "['a@b.c']")):
        request = rf.post("/", json.dumps({"email": sent}), content_type="application/json")
        assert keys.subject("email", "g", request) == ("email", expected)
    null = rf.post("/", '{"email": null}', content_type="application/json", REMOTE_ADDR="::1")
    assert keys.subject("email", "g", null) == ("ip", "::")


# --- bodies -------------------------------------------------------------------------------


def _big_json(email: str, size: int) -> str:
    return json.dumps({"email": email, "filler": "f" * size})


def test_json_bodies_are_read_up_to_djangos_limit_not_64_kib() -> None:
    body = _big_json("Alice@Example.com", 100_000)  # over the old 64 KiB cut-off
    request = rf.post("/", body, content_type="application/json", REMOTE_ADDR="192.0.2.1")
    assert keys.subject("email", "g", request) == ("email", "alice@example.com")


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=None)
def test_json_bodies_without_a_limit_are_read_whole() -> None:
    body = _big_json("alice@example.com", 3_000_000)
    request = rf.post("/", body, content_type="application/json", REMOTE_ADDR="192.0.2.1")
    assert keys.subject("email", "g", request) == ("email", "alice@example.com")


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_a_body_over_djangos_limit_counts_by_the_ip_as_the_view_cannot_read_it() -> None:
    from django.core.exceptions import RequestDataTooBig

    body = _big_json("alice@example.com", 2000)
    request = rf.post("/", body, content_type="application/json", REMOTE_ADDR="192.0.2.1")
    assert keys.subject("email", "g", request) == ("ip", "192.0.2.1")
    with pytest.raises(RequestDataTooBig):  # what the view gets: Django answers 400
        request.body  # noqa: B018


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain;charset=UTF-8", ""])
def test_json_sent_as_plain_text_is_read(content_type: str) -> None:
    """``fetch(url, {method: "POST", body: JSON.stringify(...)})`` sends text/plain; a view
    that calls ``json.loads(request.body)`` reads it all the same."""
    body = json.dumps({"email": "Alice@Example.com"})
    request = rf.post("/", body, content_type=content_type, REMOTE_ADDR="192.0.2.1")
    assert keys.subject("email", "g", request) == ("email", "alice@example.com")


def test_json_sent_as_a_url_encoded_form_is_read_when_the_form_lacks_the_field() -> None:
    """``curl -d '{"email": ...}'`` declares a URL-encoded form."""
    body = json.dumps({"email": "Alice@Example.com"})
    request = rf.post(
        "/", body, content_type="application/x-www-form-urlencoded", REMOTE_ADDR="192.0.2.1"
    )
    assert keys.subject("email", "g", request) == ("email", "alice@example.com")
    both = rf.post("/", "email=bob@example.com", content_type="application/x-www-form-urlencoded")
    assert keys.subject("email", "g", both) == ("email", "bob@example.com")


def test_json_in_its_declared_charset() -> None:
    """Not UTF-8 but what the request declares, as Django REST framework decodes it."""
    body = '{"email": "alice@example.com", "x": "é"}'  # the factory encodes it in Latin-1
    request = rf.post(
        "/", body, content_type="application/json; charset=latin-1", REMOTE_ADDR="192.0.2.1"
    )
    assert keys.subject("email", "g", request) == ("email", "alice@example.com")


# --- addresses ------------------------------------------------------------------------------


@override_settings(RATELIMIT_TRUSTED_PROXIES=["127.0.0.1"])
def test_a_trusted_proxy_on_a_dual_stack_socket_is_still_trusted() -> None:
    """gunicorn ``-b [::]:8000`` reports the IPv4 proxy as ``::ffff:127.0.0.1``."""
    first = rf.get("/", REMOTE_ADDR="::ffff:127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.1")
    second = rf.get("/", REMOTE_ADDR="::ffff:127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.2")
    assert keys.client_ip(first) == "198.51.100.1"
    assert keys.client_ip(second) == "198.51.100.2"


@override_settings(RATELIMIT_TRUSTED_PROXIES=["10.0.0.0/8"])
def test_a_mapped_hop_of_a_trusted_network_is_skipped() -> None:
    request = rf.get(
        "/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="198.51.100.9, ::ffff:10.0.0.5"
    )
    assert keys.client_ip(request) == "198.51.100.9"


@override_settings(RATELIMIT_TRUSTED_PROXIES=["::ffff:127.0.0.1", "::ffff:10.0.0.0/104"])
def test_trusted_proxies_configured_in_mapped_form() -> None:
    request = rf.get("/", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.9, 10.1.2.3")
    assert keys.client_ip(request) == "198.51.100.9"


def test_unmap_network() -> None:
    import ipaddress

    assert keys.unmap_network(ipaddress.ip_network("::ffff:10.0.0.0/104")) == (
        ipaddress.ip_network("10.0.0.0/8")
    )
    assert keys.unmap_network(ipaddress.ip_network("::ffff:0:0/96")) == (
        ipaddress.ip_network("0.0.0.0/0")
    )
    assert keys.unmap_network(ipaddress.ip_network("2001:db8::/32")) == (
        ipaddress.ip_network("2001:db8::/32")
    )


# --- django-ratelimit's helpers and its two address tests ------------------------------------


def test_empty_ip() -> None:
    """django-ratelimit's ``IpMetaTests.test_empty_ip``, on ours."""
    req = rf.get("/")
    req.META["REMOTE_ADDR"] = ""
    with pytest.raises(ImproperlyConfigured):
        keys.client_ip(req)


@override_settings(RATELIMIT_IP_META_KEY="fake")
def test_bad_config() -> None:
    """django-ratelimit's ``IpMetaTests.test_bad_config``, on ours: the META key finds
    nothing."""
    req = rf.get("/")
    req.META["REMOTE_ADDR"] = "1.2.3.4"
    with pytest.raises(ImproperlyConfigured, match="RATELIMIT_IP_META_KEY"):
        keys.client_ip(req)


@pytest.mark.parametrize("meta_key", [lambda r: None, lambda r: "", lambda r: "unknown"])
def test_an_ip_meta_key_callable_that_finds_nothing(meta_key: object) -> None:
    with (
        override_settings(RATELIMIT_IP_META_KEY=meta_key),
        pytest.raises(ImproperlyConfigured, match="RATELIMIT_IP_META_KEY"),
    ):
        keys.subject("email", "g", rf.post("/", {}))


def test_get_header_as_django_ratelimit() -> None:
    from django_ratelimit.core import get_header as theirs

    request = rf.get("/", HTTP_X_API_KEY=" k-1 ", HTTP_USER_AGENT="agent")
    for header in ("x-api-key", "X-Api-Key", "X_API_KEY", "user-agent", "x-missing"):
        assert keys.get_header(request, header) == theirs(request, header), header
    assert keys.get_header(request, "x-missing") == ""


def test_user_or_ip_as_django_ratelimit() -> None:
    from django.contrib.auth.models import AnonymousUser
    from django_ratelimit.core import user_or_ip as theirs

    class Member:
        pk = 7
        is_authenticated = True

    anonymous = rf.get("/", REMOTE_ADDR="203.0.113.7")
    anonymous.user = AnonymousUser()
    member = rf.get("/", REMOTE_ADDR="203.0.113.7")
    member.user = Member()  # type: ignore[assignment]
    for request in (anonymous, member):
        assert keys.user_or_ip(request) == theirs(request)
    nowhere = rf.get("/", REMOTE_ADDR="")
    nowhere.user = AnonymousUser()
    with pytest.raises(ImproperlyConfigured):
        theirs(nowhere)
    with pytest.raises(ImproperlyConfigured):
        keys.user_or_ip(nowhere)


# --- what a person types in the admin --------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "typed", "sent"),
    [
        ("email", PAD + "Alice@Example.com\u200b" + PAD, "alice@example.com"),
        ("email:username", "\t" * 1500 + "ALICE@example.com", " alice@example.com"),
        ("post:name", PAD + "n1", "n1"),
        ("post:name", PAD + "z" * 400, "z" * 400),
    ],
)
def test_typed_padded_subjects_find_the_counters_requests_fill(
    spec: str, typed: str, sent: str
) -> None:
    field = spec.partition(":")[2] or "email"
    request = rf.post("/", {field: sent}, REMOTE_ADDR="198.51.100.1")
    assert keys.normalize_value(spec, typed) == keys.subject(spec, "g", request)[1]


@given(
    st.one_of(
        st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
        st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address),
    ),
    st.integers(0, 32),
    st.integers(0, 128),
)
def test_masking_is_the_network_address_of_the_mask(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, v4_mask: int, v6_mask: int
) -> None:
    """The integer masking a new client's first request takes gives what ip_network does."""
    addr = keys.parse_address(str(address))
    assert addr is not None
    mask = v4_mask if addr.version == 4 else v6_mask
    expected = ipaddress.ip_network(f"{addr}/{mask}", strict=False).network_address
    assert addresses._masked(str(address), v4_mask, v6_mask) == str(expected)


def _masked_slowly(ip: str) -> str | None:
    """What :func:`addresses._masked` answers for an unmasked address, by ``ipaddress``."""
    addr = addresses._parse_address(ip)
    return None if addr is None else str(addr)


TRICKY_IPV4 = [
    "10.1.2.3", "0.0.0.0", "255.255.255.255", "01.2.3.4", "1.2.3.04", "1.2.3", "1.2.3.4.5",
    "256.1.1.1", "0x1.2.3.4", " 1.2.3.4", "1.2.3.4 ", "1.2.3.4\x00", "1.2.3.4\udc80",
    "１.2.3.4", "::ffff:1.2.3.4", "::ffff:0102:0304", "2001:db8::1", "", "1.2.3.-4", "+1.2.3.4",
]  # fmt: skip


@pytest.mark.parametrize("ip", TRICKY_IPV4)
def test_the_ipv4_fast_path_answers_as_ipaddress_does(ip: str) -> None:
    assert addresses._masked(ip, 32, 128) == _masked_slowly(ip)


@given(st.ip_addresses(v=4).map(str) | st.text(alphabet="0123456789.x: ", max_size=18))
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_ipv4_fast_path_agrees_on_any_text(ip: str) -> None:
    assert addresses._masked(ip, 32, 128) == _masked_slowly(ip)


def _shown_slowly(value: str) -> str | None:
    """The /24 or /64 of an address by ipaddress alone (the reference of ``shown_network``)."""
    addr = addresses._parsed(value)
    if addr is None:
        return None
    prefix = 24 if addr.version == 4 else 64
    return str(ipaddress.ip_network((addr, prefix), strict=False))


@given(
    st.ip_addresses(v=4).map(str)
    | st.ip_addresses(v=6).map(str)
    | st.sampled_from(["::ffff:203.0.113.9", " 203.0.113.9", "203.0.113.009", "1.2.3"])
    | st.text(alphabet="0123456789.x: ", max_size=18)
)
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_shown_network_of_an_address_agrees_with_ipaddress(value: str) -> None:
    """*Refused lately*'s masked address (its IPv4 fast path by text) is ipaddress's /24,
    and /64 for IPv6, on any text."""
    assert addresses.shown_network(value) == _shown_slowly(value)


def _trusted_slowly(ip: str, networks: list[str]) -> bool:
    """Whether ``ip`` is in one of ``networks``, by ipaddress alone (the reference)."""
    addr = addresses._parsed(ip.strip())
    return addr is not None and any(
        addr in addresses.unmap_network(ipaddress.ip_network(n)) for n in networks
    )


TRUSTED = ["10.0.0.0/8", "192.0.2.7/32", "::ffff:198.51.100.0/120", "2001:db8::/32"]


@given(
    st.ip_addresses(v=4).map(str)
    | st.sampled_from(["10.0.0.1", "10.255.255.255", "11.0.0.0", "192.0.2.7", "192.0.2.8"])
    | st.sampled_from(["198.51.100.9", "198.51.101.0", "::ffff:10.0.0.1", "2001:db8::1"])
    | st.text(alphabet="0123456789.x: ", max_size=18)
)
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_trusted_proxy_is_judged_as_ipaddress_judges_it(ip: str) -> None:
    """The IPv4 fast path (a number against each network's number and mask) agrees with
    ipaddress on every address and on text that is none, IPv4-mapped networks included."""
    with override_settings(RATELIMIT_TRUSTED_PROXIES=TRUSTED):
        assert keys.trusted_proxy(ip) == _trusted_slowly(ip, TRUSTED)


def test_trusted_proxies_are_read_again_when_the_setting_changes() -> None:
    with override_settings(RATELIMIT_TRUSTED_PROXIES=["10.0.0.0/8"]):
        assert keys.trusted_proxy("10.1.2.3")
        assert not keys.trusted_proxy("192.0.2.1")
    with override_settings(RATELIMIT_TRUSTED_PROXIES=["192.0.2.0/24"]):
        assert not keys.trusted_proxy("10.1.2.3")  # remembered under the old setting
        assert keys.trusted_proxy("192.0.2.1")
        assert keys.trusted_proxy("::ffff:192.0.2.1")  # IPv4-mapped: the same address


def test_rules_keyed_alike_read_the_value_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two rules on the IP and one on a header: the address is found once per request."""
    from ratelimit_app.engine import matched

    calls: list[str] = []
    reader = keys.reader

    def counting(spec: keys.KeySpec) -> keys.Reader:
        read = reader(spec)

        def counted(group: str, request: HttpRequest) -> tuple[str, str]:
            calls.append(str(spec))
            return read(group, request)

        return counted

    monkeypatch.setattr(keys, "reader", counting)  # (each limit makes its reader when built)
    rules = [
        {"name": "a", "path": "/", "key": "ip", "rate": "100/m"},
        {"name": "b", "path": "/", "key": "ip", "rate": "1000/d"},
        {"name": "c", "path": "/", "key": "header:x-api-key", "rate": "100/m"},
        {"name": "d", "path": "/", "key": "header:x-api-key", "rate": "1000/d"},
    ]
    with override_settings(RATELIMIT_RULES=rules):
        from ratelimit_app import store

        request = RequestFactory().get("/", HTTP_X_API_KEY="k1")
        pending = matched.before(request, store.current().rules.match(request))
    assert pending is not None
    assert sorted(calls) == ["header:x-api-key", "ip"]
    assert set(request.ratelimit_usage) == {"a", "b", "c", "d"}  # type: ignore[attr-defined]


def test_trusted_proxy_memo_holds_no_long_strings() -> None:
    """X-Forwarded-For hops are the client's text: a padded address is still the address,
    and a string longer than any address is no proxy and is not remembered."""
    with override_settings(RATELIMIT_TRUSTED_PROXIES=["10.0.0.0/8"]):
        assert keys.trusted_proxy(" " * 100 + "10.0.0.1 ")
        assert not keys.trusted_proxy("10.0.0.1" + "0" * 100)
        assert all(len(ip) <= addresses.MAX_ADDRESS_LENGTH for ip in RUNTIME.trusted)


def test_a_json_body_is_parsed_once_whatever_the_number_of_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every rule whose key reads the body once parsed it again: a 2.5 MB JSON body of many
    members costs tens of milliseconds a parse."""
    calls: list[int] = []
    loads = json.loads

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return loads(*args, **kwargs)

    good = rf.post("/", json.dumps({"email": "A@x.com", "username": "Bob"}), "application/json")
    bad = rf.post("/", "{not json", "application/json", REMOTE_ADDR="192.0.2.40")
    monkeypatch.setattr(json, "loads", counting)
    specs = ("email", "post:username", "email:username", "post:missing")
    assert [keys.subject(spec, "g", good) for spec in specs] == [
        ("email", "a@x.com"),
        ("post:username", "Bob"),
        ("email:username", "bob"),
        ("ip", "127.0.0.1"),  # absent: the client IP
    ]
    assert len(calls) == 1
    assert {keys.subject(spec, "g", bad) for spec in specs} == {("ip", "192.0.2.40")}
    assert len(calls) == 2


# --- what the process memos keep ------------------------------------------------------------


def _retained(call: Callable[[int], object], n: int = 300) -> int:
    """Bytes still allocated after ``call(i)`` for each ``i < n``: what memos kept (emptied
    first, so that none is full and forgets as much as it keeps)."""
    for memo in (RUNTIME.addresses, RUNTIME.masked, RUNTIME.namespaces):
        memo.clear()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            call(i)
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def _request(**meta: str) -> HttpRequest:
    request = HttpRequest()
    request.META = dict(meta)
    return request


@override_settings(RATELIMIT_TRUSTED_PROXIES=["10.0.0.0/8"])
def test_forwarded_for_hops_longer_than_an_address_are_not_remembered() -> None:
    """A client writes what it likes in X-Forwarded-For before the proxy appends to it:
    8 kB hops, each new, once filled the address memo (4,096 of them: 32 MB a process)."""

    def send(i: int) -> None:
        hops = f"{i:05d}{'1' * 8000}, 198.51.100.{i % 200}x{'2' * 8000}"
        request = _request(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=hops)
        assert keys.client_ip(request) == "10.0.0.1"  # garbage: the proxy is counted

    assert _retained(send) < 300_000
    padded = _request(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=" " * 500 + "192.0.2.7 ")
    assert keys.client_ip(padded) == "192.0.2.7"


@override_settings(RATELIMIT_IP_META_KEY="HTTP_X_REAL_IP")
def test_an_address_header_longer_than_an_address_is_not_remembered() -> None:
    def send(i: int) -> None:
        with pytest.raises(ImproperlyConfigured):
            keys.client_ip(_request(HTTP_X_REAL_IP=f"{i:05d}{'1' * 8000}"))

    assert _retained(send) < 300_000
    assert keys.client_ip(_request(HTTP_X_REAL_IP=" " * 500 + "192.0.2.8")) == "192.0.2.8"


def test_the_address_helpers_remember_no_long_text() -> None:
    """``parse_address`` and ``mask_ip`` read X-Forwarded-For hops for the DRF throttles."""

    def call(i: int) -> None:
        text = f"{i:05d}{'1' * 8000}"
        assert keys.parse_address(text) is None
        assert keys.mask_ip(text) is None

    assert _retained(call) < 300_000
    assert keys.parse_address(" " * 500 + "10.0.0.1 ") == ipaddress.ip_address("10.0.0.1")
    assert keys.mask_ip(" " * 500 + "::ffff:10.0.0.1") == "10.0.0.1"


def test_the_namespace_memo_remembers_no_long_values() -> None:
    """A subject is the client's text (up to 320 characters): 8,192 of them, in characters
    of four bytes, once kept 12 MB a process."""

    def call(i: int) -> None:
        keys.namespace("g", "post:name", f"{i:05d}" + "\U0001f600" * 300)

    assert _retained(call, 1000) < 300_000
    long_value = "v" * (namespaces.NAMESPACE_MEMO_VALUE + 1)
    assert keys.namespace("g", "k", long_value) == keys.namespace("g", "k", long_value)
    assert ("g", "k", long_value) not in RUNTIME.namespaces
    derived = keys.derived("long", b"x")
    keys.namespace("g", "k", derived)
    assert ("g", "k", derived) in RUNTIME.namespaces  # derived subjects are remembered


def test_a_group_named_with_a_lone_surrogate_is_counted_not_a_500() -> None:
    """A decorator's group is the developer's text, and may hold a lone surrogate (a name
    built from bytes decoded with ``surrogateescape``): its counters are hashed as they are,
    apart from the same name without it."""
    from django.test import RequestFactory

    from ratelimit_app.core import get_usage

    request = RequestFactory().get("/", REMOTE_ADDR="198.51.100.7")
    odd, plain = "group-\udcff", "group-"
    counts = [
        get_usage(request, group=odd, key="ip", rate="5/m", increment=True)["count"]  # type: ignore[index]
        for _ in range(2)
    ]
    other = get_usage(request, group=plain, key="ip", rate="5/m", increment=True)
    assert counts == [1, 2]
    assert other is not None and other["count"] == 1
