"""Hostile input for the key extractors and ``RatelimitMiddleware``.

Unicode look-alikes, control and invisible characters, padding, 10 kB values, lone
surrogates, malformed JSON and multipart bodies, spoofed ``X-Forwarded-For``, missing
``REMOTE_ADDR``: each must end in the documented result (``docs/security.rst``, "Hostile
input"): a clean value, a subject derived from a value too long or invalid to keep, the client
IP as the fallback for an absent value, or, without any client IP where one is needed,
``ImproperlyConfigured`` (a server or settings problem). Never another exception, never one
bucket shared by everyone, never raw personal data in the cache.

Property tests (hypothesis) cover the extractors; the middleware runs end to end with the
Django test client on every backend (``backend_kind``), and under hypothesis on local memory.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import socket
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from django.urls import path
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from ratelimit_app.identity import keys
from ratelimit_app.identity.keys import namespace
from ratelimit_app.middleware import RatelimitMiddleware
from ratelimit_app.signals import ratelimited
from tests.ratelimit.conftest import MIDDLEWARE

rf = RequestFactory()
_ids = itertools.count()

CLIENT_IP = "198.51.100.8"
MAX = keys.MAX_VALUE_LENGTH
#: What the documentation promises to remove ("control characters (C0, DEL, C1), zero-width
#: characters, bidirectional marks, word joiners and byte-order marks").
REMOVED = frozenset(
    [chr(c) for c in range(0x20)]
    + [chr(c) for c in range(0x7F, 0xA0)]
    + list("\u200b\u200c\u200d\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e")
    + list("\u2060\u2061\u2062\u2063\u2064\ufeff")
)
#: Invisible: a value differing only by these must be the same subject (documented).
ZERO_WIDTH = "\u200b\u200c\u200d\u200e\u200f\u2060\ufeff"
SPECIAL = (
    "\x00\x01\x08\t\n\r\x0b\x1b\x1f\x7f\x80\x85\x9f\xa0\xad"
    "\u200b\u200c\u200d\u200e\u200f\u2028\u2029\u202a\u202e\u2060\u2063\ufeff\u3000"
    "ＡＢｘ＠．ßİΐﬃ①@. ,;:%&=+\"'<>\\/"
)
TRUSTED = ("10.0.0.0/8", "2001:db8:ffff::/48")
DEVICES = {"mobile", "tablet", "desktop", "bot"}


# --- strategies ---------------------------------------------------------------------------


def _repeat(chunk_and_size: tuple[str, int]) -> str:
    chunk, size = chunk_and_size
    return (chunk * (size // len(chunk) + 1))[:size]


any_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=80)  # no surrogates
special_text = st.text(alphabet=st.sampled_from(SPECIAL) | st.characters(codec="ascii"))
#: Up to 10 kB of a repeated chunk (hypothesis cannot draw 10 kB of random text).
huge_text = st.tuples(
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=6),
    st.integers(min_value=MAX - 5, max_value=10_240),
).map(_repeat)
corner_cases = st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "\x00" * 10_240,
        "\u200b\ufeff\u200d",
        "a" * 10_000 + "@x.com",
        "ß" * 200,
        "ＦＯＯ@ｘ.com",
        "Foo@X.com\u200b",
        "1.2.3.4, 5.6.7.8",
        "::1",
        "null",
        '{"email": "x@y.z"}',
    ]
)
hostile_text = st.one_of(any_text, special_text, huge_text, corner_cases)


def _fullwidth(char: str) -> str:
    return chr(ord(char) + 0xFEE0) if "!" <= char <= "~" else char


@st.composite
def look_alikes(draw: st.DrawFn, base: str) -> str:
    """``base`` (ASCII) disguised as it looks the same: case, full-width forms, surrounding
    white space, zero-width characters."""
    chars = [
        draw(st.sampled_from([c, c.upper(), c.lower(), _fullwidth(c), _fullwidth(c.upper())]))
        for c in base
    ]
    for _ in range(draw(st.integers(0, 3))):
        chars.insert(draw(st.integers(0, len(chars))), draw(st.sampled_from(ZERO_WIDTH)))
    space = st.text(alphabet=" \t\n\r\xa0\u3000\u2003\u200b", max_size=3)
    return draw(space) + "".join(chars) + draw(space)


ip_strings = st.ip_addresses().map(str)
remote_addrs = st.one_of(
    ip_strings,
    ip_strings.map(lambda ip: f" {ip} "),
    st.sampled_from(["", "garbage", "1.2.3.4:80", "[::1]", "fe80::1%eth0", "01.2.3.4", "::"]),
    any_text,
    st.none(),  # no REMOTE_ADDR at all
)
forwarded_values = st.one_of(
    hostile_text,
    st.lists(st.one_of(ip_strings, any_text, st.sampled_from(TRUSTED)), max_size=40).map(
        ", ".join
    ),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    hostile_text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
json_objects = st.one_of(
    json_values,
    st.builds(
        lambda extra, email: {**extra, "email": email},
        st.dictionaries(st.text(max_size=6), json_values, max_size=3),
        st.one_of(hostile_text, json_values),
    ),
)


# --- helpers ------------------------------------------------------------------------------


def assert_clean(value: str | None, limit: int = MAX) -> None:
    """None, or a non-empty stripped string of bounded length without control characters."""
    if value is None:
        return
    assert isinstance(value, str) and value
    assert len(value) <= limit, len(value)
    assert value == value.strip()
    assert not [c for c in value if unicodedata.category(c) == "Cc" or c in REMOVED], value


def valid_address(remote: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``remote`` holds, IPv4-mapped IPv6 as its IPv4 address; None if invalid."""
    try:
        addr = ipaddress.ip_address((remote or "").strip())
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def is_trusted(remote: str | None, networks: tuple[str, ...]) -> bool:
    try:
        addr = ipaddress.ip_address((remote or "").strip())
    except ValueError:
        return False
    return any(addr in ipaddress.ip_network(n) for n in networks)


def with_remote(request: HttpRequest, remote: str | None) -> HttpRequest:
    if remote is None:
        del request.META["REMOTE_ADDR"]
    else:
        request.META["REMOTE_ADDR"] = remote
    return request


def post(transport: str, fields: dict[str, str], **extra: Any) -> HttpRequest:
    """A POST to /login/ carrying ``fields`` as a form (two encodings) or a JSON object."""
    if transport == "multipart":
        return rf.post("/login/", fields, **extra)
    if transport == "urlencoded":
        body = urllib.parse.urlencode(fields)
        return rf.post("/login/", body, content_type="application/x-www-form-urlencoded", **extra)
    assert transport == "json"
    return rf.post("/login/", json.dumps(fields), content_type="application/json", **extra)


def raw_post(body: bytes, content_type: str, **extra: Any) -> HttpRequest:
    """A POST to /login/ with exactly ``body`` and ``content_type`` (the factory would
    re-encode the body for a charset parameter)."""
    return rf.post(
        "/login/",
        body,
        content_type="application/octet-stream",
        CONTENT_TYPE=content_type,
        **extra,
    )


def value_of(spec: str, request: HttpRequest) -> str | None:
    return keys.compile_key(spec)("g", request)


def subject_or_error(spec: str, request: HttpRequest) -> tuple[str, str] | str:
    """The subject, or ``"ImproperlyConfigured"`` when the request has no client address
    and the key needs one."""
    try:
        return keys.subject(spec, "g", request)
    except ImproperlyConfigured:
        return "ImproperlyConfigured"


#: White space a form strips (and NFKC turns into a space), in the quantities that used to
#: push a value over the old cut-off (1,280 characters before stripping).
PADDINGS = st.sampled_from([" " * 2000, "\t" * 1500, "\u3000" * 1300, " \u200b" * 700, ""])


# --- 1. property tests of the extractors -------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=hostile_text)
@example(value="a" * 10_000 + "@x.com")
@example(value="\x00" * 10_240)
@example(value="bob\x00\x1b[2J\u202e\u200b@x.com\r\n")
def test_values_are_clean_bounded_and_the_same_whatever_the_transport(value: str) -> None:
    """Form (multipart, urlencoded), JSON, query string and header give one clean value."""
    fields = {"email": value, "name": value}
    requests = [post(t, fields, REMOTE_ADDR=CLIENT_IP) for t in ("multipart", "urlencoded")]
    requests.append(post("json", fields, REMOTE_ADDR=CLIENT_IP))
    header = value_of("header:x-api-key", rf.get("/", HTTP_X_API_KEY=value))
    assert_clean(header)
    assert value_of("get:q", rf.get("/", {"q": value})) == header
    email = keys.normalize_email(value)
    assert_clean(email)
    if email is not None:
        assert email == email.casefold()
    if header is not None and header != value.strip():
        # Changed by normalising: never longer than the limit; too long, a hash of itself.
        assert len(header) <= MAX
    for request in requests:
        assert value_of("post:name", request) == header
        assert value_of("email", request) == email
        expected = ("email", email) if email is not None else ("ip", CLIENT_IP)
        assert keys.subject("email", "g", request) == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=hostile_text,
    pad=PADDINGS,
    after=PADDINGS,
    spec=st.sampled_from(["email", "email:username", "post:name", "get:q", "header:x-api-key"]),
)
@example(value="alice@example.com", pad=" " * 2000, after="", spec="email")
@example(value="x" * (MAX + 1), pad=" " * 2000, after=" " * 2000, spec="post:name")
def test_a_padded_value_and_its_stripped_form_are_one_subject(
    value: str, pad: str, after: str, spec: str
) -> None:
    """Django's forms strip what a client pads a value with and act on the account it
    names: so must the limit, however long the padding (a padded value once fell back to
    the client IP: 20 addresses, 20 fresh attempts on a locked account)."""

    def request(text: str) -> HttpRequest:
        fields = {"email": text, "username": text, "name": text}
        query = urllib.parse.urlencode({"q": text})
        return rf.post(f"/login/?{query}", fields, HTTP_X_API_KEY=text, REMOTE_ADDR=CLIENT_IP)

    plain = keys.subject(spec, "g", request(value))
    assert keys.subject(spec, "g", request(pad + value + after)) == plain
    if plain[0] == "ip":  # nothing is left of the value: absent
        assert not value.strip() or keys.normalize_email(value) is None


surrogate_text = st.text(
    alphabet=st.characters(codec="utf-8") | st.characters(categories=["Cs"]), max_size=60
)
any_value = st.one_of(
    hostile_text,
    surrogate_text,
    st.binary(max_size=60),
    st.integers(),
    st.integers(min_value=10**4400, max_value=10**4500),
    st.floats(),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=any_value, pad=PADDINGS)
@example(value="\ud800", pad="")
@example(value=" \udfff ", pad=" " * 2000)
@example(value=b"\xff" * 2000, pad="")
@example(value=10**4400, pad="")
def test_no_value_ever_makes_namespace_raise(value: object, pad: str) -> None:
    """Whatever a JSON body, a header or a key function gives, the subject is short
    encodable text (a lone surrogate once made ``namespace()`` raise: a 500)."""
    if isinstance(value, str):
        value = pad + value
    request = rf.get(
        "/", REMOTE_ADDR=CLIENT_IP, HTTP_X_API_KEY=value if isinstance(value, str) else ""
    )
    found = [keys.subject(lambda g, r: value, "g", request)]
    found.append(keys.subject("header:x-api-key", "g", request))
    try:
        body = json.dumps({"email": value, "username": value})
    except (TypeError, ValueError):  # bytes, or a float JSON cannot write
        body = None
    if body is not None:
        as_json = rf.post("/login/", body, content_type="application/json", REMOTE_ADDR=CLIENT_IP)
        found += [
            keys.subject(s, "g", as_json) for s in ("email", "email:username", "post:username")
        ]
    for kind, text in found:
        text.encode()  # raised UnicodeEncodeError for a lone surrogate
        assert 0 < len(text) <= MAX
        assert text == text.strip()
        namespace("g", kind, text)


SUBJECT_SPECS = (
    "ip",
    "email",
    "email:username",
    "header:x-api-key",
    "get:q",
    "post:name",
    "device",
    "user",
    "user_or_ip",
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=hostile_text,
    agent=hostile_text,
    remote=remote_addrs,
    spec=st.sampled_from(SUBJECT_SPECS),
)
@example(value="", agent="", remote=None, spec="email")
@example(value="", agent="", remote="", spec="ip")
@example(value="x@y.z", agent="", remote="", spec="email")
def test_subject_is_the_value_or_the_ip_fallback_or_an_error_without_an_ip(
    value: str, agent: str, remote: str | None, spec: str
) -> None:
    query = urllib.parse.urlencode({"q": value[:2000]})
    request = rf.post(
        f"/login/?{query}",
        {"email": value, "username": value, "name": value},
        HTTP_X_API_KEY=value,
        HTTP_USER_AGENT=agent,
    )
    with_remote(request, remote)
    # A configuration error exactly when REMOTE_ADDR holds no valid address; else a network
    # holding it.
    addr = valid_address(remote)
    ip = subject_or_error("ip", request)
    assert (ip == "ImproperlyConfigured") == (addr is None)
    if addr is not None:
        assert isinstance(ip, tuple)
        masked = ipaddress.ip_address(ip[1])
        assert str(masked) == ip[1]
        mask = 32 if masked.version == 4 else 64
        assert addr in ipaddress.ip_network(f"{ip[1]}/{mask}")
    if spec in ("ip", "user_or_ip"):  # anonymous: the address is the value
        expected = (spec, ip[1]) if isinstance(ip, tuple) else ip
        assert subject_or_error(spec, request) == expected
        return
    own = value_of(spec, request)
    subject = subject_or_error(spec, request)
    if own is not None:
        assert subject == (spec, own)
        if spec == "device":
            assert own in DEVICES
        else:
            assert_clean(own)
    else:
        assert subject == ip


@settings(max_examples=50, deadline=None)
@given(base=st.emails(), data=st.data(), transport=st.sampled_from(["multipart", "json"]))
def test_visually_identical_emails_are_one_subject(
    base: str, data: st.DataObject, transport: str
) -> None:
    variants = [base, base.upper(), f"  {base}\t", *[data.draw(look_alikes(base)) for _ in "xyz"]]
    for n, variant in enumerate(variants):
        request = post(transport, {"email": variant}, REMOTE_ADDR=f"192.0.2.{n + 1}")
        assert keys.subject("email", "g", request) == ("email", base.lower()), variant


@pytest.mark.parametrize("trusted", [(), TRUSTED], ids=["no-trusted-proxies", "untrusted-peer"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forwarded=forwarded_values, remote=remote_addrs, email=hostile_text)
@example(forwarded="198.51.100.99", remote="203.0.113.5", email="")
@example(forwarded="10.0.0.1, 198.51.100.99", remote="", email="")
def test_untrusted_peer_forwarded_for_never_changes_the_subject(
    trusted: tuple[str, ...], forwarded: str, remote: str | None, email: str
) -> None:
    assume(not is_trusted(remote, trusted))
    with override_settings(RATELIMIT_TRUSTED_PROXIES=list(trusted)):
        plain = with_remote(post("multipart", {"email": email}), remote)
        spoofed = with_remote(
            post("multipart", {"email": email}, HTTP_X_FORWARDED_FOR=forwarded), remote
        )
        for spec in ("ip", "email", "user_or_ip"):
            assert subject_or_error(spec, spoofed) == subject_or_error(spec, plain)


untrusted_ips = ip_strings.filter(lambda ip: not is_trusted(ip, TRUSTED))
trusted_ips = st.one_of(
    st.ip_addresses(network="10.0.0.0/8"), st.ip_addresses(network="2001:db8:ffff::/48")
).map(str)


@settings(max_examples=100, deadline=None)
@given(
    prefix=forwarded_values,
    client=untrusted_ips,
    proxies=st.lists(trusted_ips, max_size=3),
    peer=trusted_ips,
)
def test_client_behind_trusted_proxies_cannot_choose_its_address(
    prefix: str, client: str, proxies: list[str], peer: str
) -> None:
    """Whatever the client writes to the left of what the first proxy appended is ignored."""
    forwarded = ", ".join([prefix, client, *proxies])
    with override_settings(RATELIMIT_TRUSTED_PROXIES=list(TRUSTED)):
        request = rf.post("/login/", {}, REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded)
        assert keys.client_ip(request) == keys.mask_ip(client)
        assert keys.subject("email", "g", request) == ("ip", keys.mask_ip(client))


def _expected_email(data: object) -> str | None:
    """The email a view reading the JSON object finds: a string, or the text a form field
    makes of another value (``null`` is no value)."""
    if isinstance(data, dict) and data.get("email") is not None:
        return keys.normalize_email(data["email"])
    return None


JSON_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "application/json; charset=bogus",
    "application/vnd.api+json",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=json_objects, content_type=st.sampled_from(JSON_TYPES), ascii_only=st.booleans())
@example(data={"email": "x" * 10_240}, content_type="application/json", ascii_only=True)
@example(data={"email": "😀" * 6_000}, content_type="application/json", ascii_only=True)
@example(data={"email": ["a@b.c"]}, content_type="application/json", ascii_only=True)
@example(data={"email": None}, content_type="application/json", ascii_only=True)
def test_json_bodies(data: Any, content_type: str, ascii_only: bool) -> None:
    body = json.dumps(data, ensure_ascii=ascii_only).encode()
    request = raw_post(body, content_type, REMOTE_ADDR=CLIENT_IP)
    email = _expected_email(data)  # read whole, up to DATA_UPLOAD_MAX_MEMORY_SIZE
    expected = ("email", email) if email is not None else ("ip", CLIENT_IP)
    assert keys.subject("email", "g", request) == expected
    assert keys.subject("email:email", "g", request) == (
        ("email:email", email) if email is not None else ("ip", CLIENT_IP)
    )


def _truncations(document: str) -> st.SearchStrategy[bytes]:
    return st.integers(0, len(document)).map(lambda n: document[:n].encode())


near_json = st.one_of(
    st.binary(max_size=300),
    hostile_text.map(lambda t: t.encode("utf-8")),
    hostile_text.map(lambda t: t.encode("utf-16")),
    hostile_text.flatmap(lambda t: _truncations(json.dumps({"email": t[:100]}))),
    st.integers(1, 50_000).map(lambda n: b"[" * n),  # deep nesting: RecursionError
    st.sampled_from(
        [b"", b"{", b"null", b"[1, 2]", b'{"email": 5}', b"\xff\xfe", b'{"email": "a@b.c"']
    ),
    st.just(b'{"email": "' + b"9" * 5000 + b'"}'),
    st.just(b'{"email": ' + b"9" * 5000 + b"}"),  # over Python's int digit limit
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=near_json, content_type=st.sampled_from(JSON_TYPES))
def test_arbitrary_bodies_declared_json(body: bytes, content_type: str) -> None:
    request = raw_post(body, content_type, REMOTE_ADDR=CLIENT_IP)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        try:  # then in the charset the request declares (the only real one here: UTF-8)
            data = json.loads(body.decode("utf-8")) if "utf-8" in content_type else None
        except (ValueError, RecursionError):
            data = None
    email = _expected_email(data)
    expected = ("email", email) if email is not None else ("ip", CLIENT_IP)
    assert keys.subject("email", "g", request) == expected


def _corrupt(body: bytes, cut: int | None, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(body if cut is None else body[: cut % (len(body) + 1)])
    for position, byte in flips:
        if out:
            out[position % len(out)] = byte
    return bytes(out)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=hostile_text,
    cut=st.none() | st.integers(0, 50_000),
    flips=st.lists(st.tuples(st.integers(0, 50_000), st.integers(0, 255)), max_size=4),
    content_type=st.one_of(
        st.just(MULTIPART_CONTENT),
        st.sampled_from(
            [
                "multipart/form-data",
                "multipart/form-data; boundary=",
                "multipart/form-data; boundary=other",
                "multipart/form-data; boundary=" + "b" * 300,
                "multipart/form-data; boundary=\x00\r\n",
                "multipart/mixed; boundary=" + BOUNDARY,
            ]
        ),
        any_text.map(lambda b: f"multipart/form-data; boundary={b}"),
    ),
)
def test_malformed_multipart_bodies(
    value: str, cut: int | None, flips: list[tuple[int, int]], content_type: str
) -> None:
    body = encode_multipart(BOUNDARY, {"email": value, "other": "x"})
    corrupted = _corrupt(body, cut, flips)
    request = raw_post(corrupted, content_type, REMOTE_ADDR=CLIENT_IP)
    subject = keys.subject("email", "g", request)
    assert subject is not None
    if subject[0] == "ip":
        assert subject == ("ip", CLIENT_IP)
    else:
        assert subject[0] == "email"
        assert_clean(subject[1])
    if corrupted == body and content_type == MULTIPART_CONTENT:
        email = keys.normalize_email(value)
        assert subject == (("email", email) if email is not None else ("ip", CLIENT_IP))


def test_too_many_form_fields_and_parts_fall_back_to_the_ip() -> None:
    many = "&".join(f"f{i}=1" for i in range(2000)) + "&email=a@b.c"
    form = rf.post(
        "/login/", many, content_type="application/x-www-form-urlencoded", REMOTE_ADDR=CLIENT_IP
    )
    assert keys.subject("email", "g", form) == ("ip", CLIENT_IP)
    parts = {f"f{i}": "1" for i in range(1200)} | {"email": "a@b.c"}
    multipart = rf.post("/login/", parts, REMOTE_ADDR=CLIENT_IP)
    assert keys.subject("email", "g", multipart) == ("ip", CLIENT_IP)


def test_too_many_query_parameters_fall_back_to_the_ip() -> None:
    query = "&".join(f"f{i}=1" for i in range(1100)) + "&q=hello"
    request = rf.get("/", QUERY_STRING=query, REMOTE_ADDR=CLIENT_IP)
    assert keys.subject("get:q", "g", request) == ("ip", CLIENT_IP)


def test_case_folding_does_not_exceed_the_maximum_length() -> None:
    value = keys.normalize_email("ß" * MAX)
    assert value is None or len(value) <= MAX


@pytest.mark.parametrize("invisible", ["\u2066", "\u2067", "\u2068", "\u2069", "\u061c"])
def test_every_bidirectional_control_is_removed(invisible: str) -> None:
    assert keys.normalize_email(f"bob{invisible}@x.com") == "bob@x.com"


def test_every_invisible_format_character_is_removed() -> None:
    """Every character of Unicode category Cf this Python knows (soft hyphen, tags, ...)."""
    import sys
    import unicodedata

    invisible = [c for c in map(chr, range(sys.maxunicode + 1)) if unicodedata.category(c) == "Cf"]
    assert len(invisible) > 150
    survivors = [f"U+{ord(c):04X}" for c in invisible if keys.normalize_email(f"a{c}b") != "ab"]
    assert survivors == []


# --- the work a value costs ---------------------------------------------------------------

#: Characters enough to see what grows with a value (the bench, ``bench.claims.big_bodies``,
#: measures bodies of 2.5 MB).
BIG = 100_000
#: Every character a value's padding may hold: white space, controls, invisible format
#: characters (tags among them).
PAD_CHARS = sorted(
    {chr(c) for c in range(0x3001) if chr(c).isspace()}
    | {c for c in REMOVED}
    | set("\u00ad\u180e\u2066\u2069\U000110bd\U0001d173\U000e0001\U000e0020\U000e007f")
)


@pytest.mark.parametrize(
    "value",
    [
        "\ufdfa" * BIG,  # 18 characters each once normalised
        "\u200b" * BIG + "Alice@Example.com",
        "Alice@Example.com" + " \U000e007f" * BIG,
        "a\x00" * BIG,
        "\u0041\u030a" * BIG,  # NFKC composes each pair: half as long
    ],
    ids=["fdfa", "zero-width-padding", "tag-padding", "controls-inside", "composing"],
)
def test_normalising_reads_a_bounded_number_of_characters(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """NFKC once ran over the whole value before its length rule: a form field of 2.6 MB of
    U+FDFA became 16 million characters and over a second of CPU a request. Only a value
    that could still be short once normalised is normalised."""
    lengths: list[int] = []
    normalize = unicodedata.normalize

    def recording(form: Any, text: str) -> str:
        lengths.append(len(text))
        return normalize(form, text)

    fields = {"email": value, "name": value}
    requests = [post(t, fields, REMOTE_ADDR=CLIENT_IP) for t in ("multipart", "json")]
    header = rf.get("/", HTTP_X_API_KEY=value, REMOTE_ADDR=CLIENT_IP)
    monkeypatch.setattr(unicodedata, "normalize", recording)
    found = {keys.subject(spec, "g", r) for spec in ("email", "post:name") for r in requests}
    found.add(keys.subject("header:x-api-key", "g", header))
    found.add(keys.subject(lambda g, r: value, "g", header))
    assert max(lengths, default=0) <= keys.NORMALISED_AT_MOST
    for _, subject in found:
        assert_clean(subject)


def test_a_huge_padded_value_is_the_value_it_pads() -> None:
    """Padding is stripped at either end however much there is: it is read in C, a table
    lookup a character, and the value it pads is normalised as any other."""
    for pad in ("\u200b" * BIG, "\U000e007f" * BIG, " \x00\u3000" * BIG):
        for padded in (pad + "Ａlice@Example.com", "Alice@Example.com" + pad):
            assert keys.normalize_email(padded) == "alice@example.com"
        assert keys.normalize_email(pad) is None  # padding alone: absent
    long_value = "\ufdfa" * BIG
    derived = keys.normalize_email(long_value)
    assert derived is not None and derived.startswith("long:sha256:")
    assert keys.normalize_email("\u200b \x00" + long_value + "\U000e007f\t") == derived
    assert keys.normalize_email(long_value + "x") != derived
    folded = keys.normalize_email("Ä" * BIG)
    assert folded is not None and folded == keys.normalize_email("ä" * BIG)
    invalid = keys.normalize_email("\ud800" + long_value)
    assert invalid is not None and invalid.startswith("invalid:sha256:")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    core=st.one_of(hostile_text, huge_text),
    before=st.tuples(st.text(st.sampled_from(PAD_CHARS), max_size=8), st.integers(0, 3000)),
    after=st.tuples(st.text(st.sampled_from(PAD_CHARS), max_size=8), st.integers(0, 3000)),
    fold=st.booleans(),
)
@example(core="x" * 1000, before=("\u200b", 1000), after=("", 0), fold=False)
@example(core="\ufdfa" * 300, before=("\x00", 2000), after=(" ", 2000), fold=True)
def test_padding_of_any_length_never_changes_the_subject(
    core: str, before: tuple[str, int], after: tuple[str, int], fold: bool
) -> None:
    """Around the length beyond which a value is hashed unnormalised too: padding,
    however long, and the value it pads are one subject."""

    def padding(chunk_and_size: tuple[str, int]) -> str:
        return _repeat(chunk_and_size) if chunk_and_size[0] else ""

    padded = padding(before) + core + padding(after)
    assert keys._clean(padded, fold) == keys._clean(core, fold)


class _Written(list[Any]):
    """A list that counts how often it is written out as text."""

    writes = 0

    def __repr__(self) -> str:
        type(self).writes += 1
        return super().__repr__()


def test_a_huge_json_array_is_never_written_out() -> None:
    """A field holding a JSON array is the text ``str()`` makes of it, as a form field
    would: for 2.5 MB of small numbers that took 50 ms a key. An array or object whose text
    would be over the length any value is normalised at is a subject of its own without
    being written out; a small one is still its text."""
    request = rf.get("/", REMOTE_ADDR=CLIENT_IP)
    _Written.writes = 0
    huge = _Written([0] * BIG)
    found = keys.subject(lambda g, r: huge, "g", request)
    assert _Written.writes == 0
    assert found[1].startswith("long:sha256:")
    assert found == keys.subject(lambda g, r: [1] * BIG, "g", request)  # by kind and size
    assert found != keys.subject(lambda g, r: [1] * (BIG + 1), "g", request)
    nested = {"email": [[0] * BIG], "name": {"a": "x" * BIG}}
    body = post("json", nested, REMOTE_ADDR=CLIENT_IP)
    for spec in ("email", "post:email", "post:name"):
        kind, value = keys.subject(spec, "g", body)
        assert kind == spec and value.startswith("long:sha256:")
    small = _Written(["a@b.c"])
    assert keys.subject(lambda g, r: small, "g", request)[1] == "['a@b.c']"
    assert _Written.writes == 1


def test_the_padding_pattern_strips_what_str_strip_strips() -> None:
    spaces = {chr(c) for c in range(0x110000) if chr(c).isspace()}
    assert {c for c in spaces if keys._PADDING.fullmatch(c)} == spaces
    assert not keys._PADDING.fullmatch("a\u3000")


@settings(max_examples=100, deadline=None)
@given(agent=hostile_text)
def test_device_is_one_of_four(agent: str) -> None:
    assert keys.device(agent) in DEVICES
    request = rf.get("/", HTTP_USER_AGENT=agent)
    assert keys.subject("device", "g", request) in {("device", d) for d in DEVICES}


# --- 2. end to end through the middleware ------------------------------------------------


def login(request: HttpRequest) -> HttpResponse:
    # A JSON API view reads the body after the middleware did: it must still be there.
    if "json" in (request.content_type or ""):
        return HttpResponse(str(len(request.body)))
    return HttpResponse("ok")


urlpatterns = [path("login/", login), path("search/", login)]


@contextlib.contextmanager
def one_rule(key: str = "email", rate: str = "3/m", **extra: Any) -> Iterator[str]:
    """A fresh rule on POST /login/ (its name is yielded) behind the middleware."""
    name = f"hostile-{next(_ids)}"
    rule = {"name": name, "path": "/login/", "methods": ["POST"], "key": key, "rate": rate}
    with override_settings(
        ROOT_URLCONF=__name__, MIDDLEWARE=MIDDLEWARE, RATELIMIT_RULES=[rule], **extra
    ):
        yield name


LOCMEM_CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "rl": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "hostile"},
}


Send = Callable[..., int]


def sender(client: Client) -> Send:
    def send(remote: str = CLIENT_IP, **kwargs: Any) -> int:
        kwargs.setdefault("REMOTE_ADDR", remote)
        response = client.post("/login/", **kwargs)
        assert response.status_code in {200, 429}, response.status_code
        return response.status_code

    return send


#: Request arguments whose email is absent (nothing left after cleaning, or a body the view
#: cannot read either): the client IP counts them.
GARBAGE: list[dict[str, Any]] = [
    {"data": {"email": "\x00\x01\x1b\u200b\u202e\ufeff"}},
    {"data": {}},
    {"data": {"email": ""}},
    {"data": "{not json", "content_type": "application/json"},
    {"data": b"\xff\xfe\x00", "content_type": "application/json"},
    {"data": "[" * 50_000, "content_type": "application/json"},
    {"data": json.dumps({"email": None}), "content_type": "application/json"},
    {"data": b"--x\r\nbroken", "content_type": "multipart/form-data; boundary=x"},
    {"data": b"garbage", "content_type": "multipart/form-data"},
    {
        "data": encode_multipart(BOUNDARY, {"email": "a@b.c"})[:60],
        "content_type": "application/octet-stream",
        "CONTENT_TYPE": MULTIPART_CONTENT,
    },
    {
        "data": "&".join(f"f{i}=1" for i in range(2000)) + "&email=a@b.c",
        "content_type": "application/x-www-form-urlencoded",
    },
]


#: Request arguments whose email is there but too long or not a string: each is a subject of
#: its own (the view sees it), never the client IP.
OWN_SUBJECTS: list[dict[str, Any]] = [
    {"data": {"email": "a" * 10_000 + "@x.com"}},
    {"data": json.dumps({"email": ["a@b.c"]}), "content_type": "application/json"},
    {"data": json.dumps({"email": "x" * 10_240}), "content_type": "application/json"},
    {"data": json.dumps({"email": 5}), "content_type": "application/json"},
    {"data": json.dumps({"email": "\ud800"}), "content_type": "application/json"},
]


def test_hostile_posts_fall_back_to_the_client_ip_never_one_shared_bucket(
    backend_kind: str,
) -> None:
    with one_rule():
        send = sender(Client())
        # One client varying its garbage is one subject: no free pass.
        codes = [send("203.0.113.10", **kwargs) for kwargs in GARBAGE]
        assert codes == [200, 200, 200] + [429] * (len(GARBAGE) - 3)
        # Another client sending the same garbage has its own bucket: nothing is shared.
        other = [send("203.0.113.11", **kwargs) for kwargs in GARBAGE[:4]]
        assert other == [200, 200, 200, 429]
        # A real email from the limited client is counted by the email, not by its IP.
        assert send("203.0.113.10", data={"email": "someone@example.org"}) == 200
        # Too long or not a string: counted as itself from any address, never by the IP.
        for n, kwargs in enumerate(OWN_SUBJECTS):
            codes = [send(f"192.0.2.{10 * n + i}", **kwargs) for i in range(4)]
            assert codes == [200, 200, 200, 429], kwargs


def test_the_view_still_reads_a_json_body_the_middleware_parsed(backend_kind: str) -> None:
    with one_rule():
        client = Client()
        for body in ("{not json", json.dumps({"email": "a@b.c"})):
            response = client.post("/login/", body, content_type="application/json")
            assert response.status_code == 200
            assert response.content == str(len(body)).encode()


def test_disguised_copies_of_one_email_share_its_bucket(backend_kind: str) -> None:
    """Control characters, zero-width characters, full-width forms, case and spaces, from
    different IPs: one email, one subject."""
    disguises = [
        "victim@example.org",
        " Victim@Example.ORG\r\n",
        "vic\x00tim@exa\u200bmple.org",
        "ＶＩＣＴＩＭ＠ＥＸＡＭＰＬＥ．ＯＲＧ",
        "\ufeffvictim@example.org\u202e",
    ]
    with one_rule():
        send = sender(Client())
        codes = [send(f"192.0.2.{n}", data={"email": e}) for n, e in enumerate(disguises, 1)]
        assert codes == [200, 200, 200, 429, 429]
        body = json.dumps({"email": "VICTIM@example.org"})
        assert send("192.0.2.99", data=body, content_type="application/json") == 429


@pytest.mark.parametrize("remote", ["", "not-an-ip"])
def test_no_client_ip_where_one_is_needed_is_a_configuration_error(
    backend_kind: str, remote: str
) -> None:
    """As django-ratelimit: a server that gives no client address cannot be limited by it,
    and saying so beats skipping the limit (every client through) or one shared bucket
    (one client locks out all). The message names what to fix, never the value."""
    with one_rule():
        send = sender(Client())
        garbage = "\x00\x01\u200b" * 100  # nothing left after cleaning: absent
        for _ in range(3):
            with pytest.raises(ImproperlyConfigured) as caught:
                send(remote, data={"email": garbage})
            assert "RATELIMIT_IP_META_KEY" in str(caught.value)
        # A value needs no address: a known email is still limited.
        known = [send(remote, data={"email": "known@example.org"}) for _ in range(4)]
        assert known == [200, 200, 200, 429]


def test_missing_remote_addr_through_the_middleware() -> None:
    """No REMOTE_ADDR key at all (the test client cannot leave it out; Django's ASGI
    handler does, for a Unix socket)."""
    middleware = RatelimitMiddleware(lambda request: HttpResponse("ok"))
    with one_rule(CACHES=LOCMEM_CACHES, RATELIMIT_USE_CACHE="rl"):
        request = with_remote(rf.post("/login/", {"email": "\x00"}), None)
        with pytest.raises(ImproperlyConfigured, match="REMOTE_ADDR"):
            middleware(request)
        for code in (200, 200, 200, 429):
            request = with_remote(rf.post("/login/", {"email": "k@example.org"}), None)
            assert middleware(request).status_code == code


def test_too_many_query_parameters_through_the_middleware() -> None:
    rule = {"name": "hostile-get", "path": "/search/", "key": "get:q", "rate": "3/m"}
    query = "&".join(f"f{i}=1" for i in range(1100)) + "&q=hello"
    with override_settings(
        ROOT_URLCONF=__name__,
        MIDDLEWARE=MIDDLEWARE,
        RATELIMIT_RULES=[rule],
        CACHES=LOCMEM_CACHES,
        RATELIMIT_USE_CACHE="rl",
    ):
        assert Client().get(f"/search/?{query}").status_code in {200, 429}


SPOOFS = [
    "1.2.3.4",
    "",
    "garbage",
    "10.0.0.1",
    "198.51.100.1, 198.51.100.2",
    ", ".join(f"192.0.2.{n}" for n in range(200)),
    "\x00" * 1000,
    "2001:db8::1",
]


@pytest.mark.parametrize("trusted", [[], list(TRUSTED)], ids=["none", "peer-not-trusted"])
def test_spoofed_forwarded_for_does_not_escape_the_ip_limit(
    backend_kind: str, trusted: list[str]
) -> None:
    with one_rule(key="ip", RATELIMIT_TRUSTED_PROXIES=trusted):
        send = sender(Client())
        codes = [send("203.0.113.9", HTTP_X_FORWARDED_FOR=spoof) for spoof in SPOOFS]
        assert codes == [200, 200, 200] + [429] * (len(SPOOFS) - 3)
        assert send("203.0.113.10", HTTP_X_FORWARDED_FOR="203.0.113.9") == 200


def test_spoofed_prefix_behind_a_trusted_proxy_does_not_escape_the_ip_limit(
    backend_kind: str,
) -> None:
    with one_rule(key="ip", RATELIMIT_TRUSTED_PROXIES=list(TRUSTED)):
        send = sender(Client())
        codes = [
            send("10.0.0.2", HTTP_X_FORWARDED_FOR=f"{spoof}, 198.51.100.20, 10.0.0.3")
            for spoof in SPOOFS
        ]
        assert codes == [200, 200, 200] + [429] * (len(SPOOFS) - 3)
        assert send("10.0.0.2", HTTP_X_FORWARDED_FOR="1.2.3.4, 198.51.100.21") == 200


TRANSPORTS = ["multipart", "urlencoded", "json", "json-raw", "multipart-broken"]


def build(remote: str | None, value: str, transport: str) -> HttpRequest:
    request: HttpRequest
    if transport == "json-raw":
        request = rf.post("/login/", value.encode(), content_type="application/json")
    elif transport == "multipart-broken":
        body = encode_multipart(BOUNDARY, {"email": value})
        request = raw_post(body[: len(body) // 2], MULTIPART_CONTENT)
    else:
        request = post(transport, {"email": value})
    return with_remote(request, remote)


email_values = st.one_of(
    hostile_text,
    look_alikes("alice@example.org"),
    look_alikes("bob@example.org"),
)
hypothesis_remotes = st.sampled_from(
    [
        "198.51.100.1",
        "198.51.100.2",
        "2001:db8::1",
        "2001:db8::2:1",  # the same /64 as 2001:db8::1: one client
        "::ffff:198.51.100.1",  # the same client as 198.51.100.1
        "",
        "garbage",
        None,
    ]
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(hypothesis_remotes, email_values, st.sampled_from(TRANSPORTS)),
        min_size=1,
        max_size=8,
    )
)
def test_middleware_under_hypothesis(sequence: list[tuple[str | None, str, str]]) -> None:
    """Never a 500; each subject is limited after three admitted requests, independently."""
    middleware = RatelimitMiddleware(lambda request: HttpResponse("ok"))
    with one_rule(CACHES=LOCMEM_CACHES, RATELIMIT_USE_CACHE="rl"):
        caches["rl"].clear()
        admitted: dict[tuple[str, str], int] = {}
        for remote, value, transport in sequence:
            subject = subject_or_error("email", build(remote, value, transport))
            if subject == "ImproperlyConfigured":
                with pytest.raises(ImproperlyConfigured):
                    middleware(build(remote, value, transport))
                continue
            status = middleware(build(remote, value, transport)).status_code
            expected = 429 if admitted.get(subject, 0) >= 3 else 200
            assert status == expected, (subject, admitted)
            if status == 200:
                admitted[subject] = admitted.get(subject, 0) + 1


# --- 3. no personal data reaches the cache -----------------------------------------------


def memcached_keys(location: str) -> list[str]:
    host, port = location.rsplit(":", 1)
    data = b""
    with socket.create_connection((host, int(port)), timeout=2) as sock:
        sock.sendall(b"lru_crawler metadump all\r\n")
        while not data.endswith((b"END\r\n", b"ERROR\r\n")):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    assert not data.startswith(b"ERROR"), data[:200]
    return [
        urllib.parse.unquote(line.split(b" ")[0][4:].decode())
        for line in data.splitlines()
        if line.startswith(b"key=")
    ]


def stored_keys(kind: str) -> list[str]:
    if kind == "redis":
        from django_redis import get_redis_connection

        raw = get_redis_connection("rl").keys("*")
        return [k.decode() if isinstance(k, bytes) else str(k) for k in raw]
    if kind == "memcached":
        return memcached_keys(django_settings.CACHES["rl"]["LOCATION"])
    return [str(k) for k in caches["rl"]._cache]  # type: ignore[attr-defined]


def test_no_email_or_ip_reaches_the_cache_or_the_signal(backend_kind: str) -> None:
    email, ip, ip6 = "Victim.Hostile@Example.org", "198.51.100.77", "2001:db8:77::1"
    sent: list[Any] = []

    def receiver(**kwargs: Any) -> None:
        sent.append(kwargs["subject"])

    ratelimited.connect(receiver, dispatch_uid="test_hostile")
    try:
        with one_rule():
            send = sender(Client())
            for remote in (ip, ip6):
                for disguise in (email, f" {email.upper()}\u200b", "\x00" * 500):
                    for _ in range(2):
                        send(remote, data={"email": disguise})
                body = json.dumps({"email": email})
                send(remote, data=body, content_type="application/json")
                send(remote, data="{broken", content_type="application/json")
    finally:
        ratelimited.disconnect(dispatch_uid="test_hostile")
    stored = stored_keys(backend_kind)
    assert stored, "nothing was stored: the check below would prove nothing"
    assert sent, "nothing was limited: the signal check below would prove nothing"
    forbidden = [
        "victim",
        "hostile",
        "example",
        ip,
        "2001:db8:77",
        "198-51-100-77",
        "198_51_100_77",
    ]
    for key in stored + [str(s) for s in sent]:
        lowered = key.lower()
        assert not [f for f in forbidden if f in lowered], key
        assert key.isascii() and key.isprintable() and " " not in key, key
        assert len(key.encode()) < 250, key
