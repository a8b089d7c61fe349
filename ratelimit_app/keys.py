"""Request features ("keys"): who a limit counts. Pure functions of the request.

Every extractor returns a string or ``None`` for "missing". A missing value never puts every
client into one shared bucket: :func:`subject` falls back to the client IP, and when even that
is missing the limit is skipped and a warning is logged (see ``docs/security``).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.utils.module_loading import import_string

from ratelimit_app.conf import conf

logger = logging.getLogger("ratelimit_app")

#: Values longer than this are not features of a person but garbage: treated as missing.
MAX_VALUE_LENGTH = 320
#: JSON bodies larger than this are not parsed for a key.
MAX_JSON_BODY = 64 * 1024

KeyFunc = Callable[[str, HttpRequest], Any]
KeySpec = str | KeyFunc

#: Removed from every value: C0 and C1 controls, line and paragraph separators, and every
#: invisible format character (Unicode category Cf: zero-width and bidirectional marks, soft
#: hyphens, tags...), so values that look the same are the same.
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891"
    "\u08e2\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f]"
)


def mask_ip(ip: str) -> str | None:
    """``ip`` masked by ``RATELIMIT_IPV4_MASK`` / ``RATELIMIT_IPV6_MASK``; None if invalid."""
    return _masked(ip, conf.IPV4_MASK, conf.IPV6_MASK)


@lru_cache(maxsize=4096)
def _masked(ip: str, v4_mask: int, v6_mask: int) -> str | None:
    # Parsing an address costs microseconds; the same clients come back, so remember.
    try:
        addr = ipaddress.ip_address(ip.strip())
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    mask = v6_mask if addr.version == 6 else v4_mask
    return str(ipaddress.ip_network(f"{addr}/{mask}", strict=False).network_address)


def _trusted(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip.strip())
    except ValueError:
        return False
    return any(addr in net for net in conf.TRUSTED_PROXIES)


def client_ip(request: HttpRequest) -> str | None:
    """The client's address, masked by ``RATELIMIT_IPV4_MASK`` / ``RATELIMIT_IPV6_MASK``.

    ``RATELIMIT_IP_META_KEY`` works as in django-ratelimit (a META key, a callable or a dotted
    path). Otherwise ``REMOTE_ADDR``, and only when that peer is one of
    ``RATELIMIT_TRUSTED_PROXIES`` is ``X-Forwarded-For`` read, right to left, skipping the
    trusted proxies: the first untrusted address is the client. A client cannot spoof its way
    past a proxy that appends to the header. Returns ``None`` only when no valid address is
    known at all.
    """
    address = client_address(request)
    return mask_ip(address) if address else None


def client_address(request: HttpRequest) -> str | None:
    """The client's address as :func:`client_ip` finds it, before masking (unvalidated)."""
    meta_key = conf.IP_META_KEY
    if meta_key:
        if callable(meta_key):
            raw = meta_key(request)
        elif "." in meta_key:
            raw = import_string(meta_key)(request)
        else:
            raw = request.META.get(meta_key)
        return str(raw) if raw else None
    remote = request.META.get("REMOTE_ADDR") or ""
    if remote and conf.TRUSTED_PROXIES and _trusted(remote):
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        for hop in reversed(forwarded.split(",")[-32:]):
            if hop.strip() and not _trusted(hop):
                # A proxy appends the address it saw, which is always valid; garbage here
                # means a misconfigured proxy: count the proxy itself rather than no one.
                return hop.strip() if mask_ip(hop) else remote
    return remote or None


def _clean(value: object) -> str | None:
    if value is None:
        return None
    text = str(value)
    if not text or len(text) > MAX_VALUE_LENGTH * 4:
        return None
    if text.isascii() and text.isprintable():
        # The common case: printable ASCII is its own NFKC form and holds no control
        # character.
        text = text.strip()
    else:
        text = _CONTROL.sub("", unicodedata.normalize("NFKC", text)).strip()
    if not text or len(text) > MAX_VALUE_LENGTH:
        return None
    return text


def normalize_email(value: object) -> str | None:
    """Stripped, NFKC-normalised, case-folded: ``' Foo@X.com'`` and ``'foo@x.com'`` match."""
    text = _clean(value)
    if not text:
        return None
    folded = text.casefold()  # may grow: "ß" folds to "ss"
    return folded if len(folded) <= MAX_VALUE_LENGTH else None


def _json_body(request: HttpRequest) -> dict[str, Any] | None:
    if not request.content_type or "json" not in request.content_type:
        return None
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    if length > MAX_JSON_BODY:
        return None
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError, Exception):  # RawPostDataException, too big, ...
        return None
    return data if isinstance(data, dict) else None


def form_value(request: HttpRequest, field: str) -> str | None:
    """A field from the POST form or, for JSON requests, the JSON object; never raises."""
    body = _json_body(request)
    if body is not None:
        value = body.get(field)
        return value if isinstance(value, str) else None
    try:
        value = request.POST.get(field)
    except Exception:  # malformed multipart, too many fields, body already read
        return None
    return value


def _query_value(request: HttpRequest, field: str) -> str | None:
    """A query-string parameter; never raises (too many fields: missing)."""
    try:
        return request.GET.get(field)
    except Exception:  # TooManyFieldsSent and the like
        return None


_BOT = re.compile(
    r"bot|crawl|spider|slurp|curl|wget|python|httpclient|okhttp|go-http|java/|libwww|headless",
    re.I,
)
_TABLET = re.compile(r"ipad|tablet|kindle|silk/|playbook|nexus (7|9|10)|sm-t\d", re.I)
_MOBILE = re.compile(
    r"mobi|iphone|ipod|android|windows phone|blackberry|opera mini|iemobile", re.I
)


def device(user_agent: str) -> str:
    """``mobile``, ``tablet``, ``desktop`` or ``bot`` from a User-Agent (empty: ``bot``)."""
    if not user_agent.strip() or _BOT.search(user_agent):
        return "bot"
    if _TABLET.search(user_agent) or (
        "android" in user_agent.lower() and "mobile" not in user_agent.lower()
    ):
        return "tablet"
    if _MOBILE.search(user_agent):
        return "mobile"
    return "desktop"


def _user(request: HttpRequest) -> str | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return str(user.pk)


def _user_or_ip(request: HttpRequest) -> str | None:
    return _user(request) or client_ip(request)


SIMPLE_KEYS: dict[str, Callable[[HttpRequest], str | None]] = {
    "ip": client_ip,
    "user": _user,
    "user_or_ip": _user_or_ip,
    "email": lambda r: normalize_email(form_value(r, "email")),
    "device": lambda r: device(r.META.get("HTTP_USER_AGENT", "")[:1024]),
}

ACCESSOR_KEYS: dict[str, Callable[[HttpRequest, str], str | None]] = {
    "get": lambda r, k: _clean(_query_value(r, k)),
    "post": lambda r, k: _clean(form_value(r, k)),
    "header": lambda r, k: _clean(r.META.get("HTTP_" + k.upper().replace("-", "_"))),
    "email": lambda r, k: normalize_email(form_value(r, k)),
}


@lru_cache(maxsize=256)
def compile_key(spec: str) -> Callable[[str, HttpRequest], str | None]:
    """A function ``(group, request) -> value or None`` for a key string; validates it."""
    if spec in SIMPLE_KEYS:
        simple = SIMPLE_KEYS[spec]
        return lambda group, request: simple(request)
    if ":" in spec:
        accessor, _, name = spec.partition(":")
        if accessor not in ACCESSOR_KEYS or not name:
            raise ImproperlyConfigured(
                f"Unknown ratelimit key {spec!r}: accessors are "
                f"{', '.join(sorted(ACCESSOR_KEYS))} (e.g. 'header:x-api-key')."
            )
        accessor_fn = ACCESSOR_KEYS[accessor]
        return lambda group, request: accessor_fn(request, name)
    if "." in spec:
        try:
            fn = import_string(spec)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"Ratelimit key {spec!r} cannot be imported: {exc}"
            ) from exc
        return lambda group, request: _clean(fn(group, request))
    raise ImproperlyConfigured(
        f"Could not understand ratelimit key {spec!r}: use one of "
        f"{', '.join(sorted(SIMPLE_KEYS))}, 'get:<name>', 'post:<name>', 'header:<name>', "
        f"'email:<field>', a callable or a dotted path."
    )


def kind(spec: KeySpec) -> str:
    """The name a key's values are filed under (callables by their qualified name)."""
    if callable(spec):
        return f"{getattr(spec, '__module__', '')}.{getattr(spec, '__qualname__', repr(spec))}"
    return spec


def subject(spec: KeySpec, group: str, request: HttpRequest) -> tuple[str, str] | None:
    """``(kind, value)`` that a limit counts, with the IP as the fallback for missing values.

    Returns ``None`` (no limit applies) only when neither the key nor the client IP is known.
    """
    if not spec:
        raise ImproperlyConfigured("Ratelimit key must be specified.")
    if callable(spec):
        value = _clean(spec(group, request))
    else:
        value = compile_key(spec)(group, request)
    if value is not None:
        return (spec if isinstance(spec, str) else kind(spec)), value
    if spec != "ip":
        ip = client_ip(request)
        if ip is not None:
            return "ip", ip
    logger.warning(
        "ratelimit: no value for key %r and no client IP (REMOTE_ADDR empty?); group %r "
        "is not limited for this request.",
        kind(spec),
        group,
    )
    return None


def is_email_kind(kind: str) -> bool:
    """True for the kinds of email keys (``email``, ``email:<field>``)."""
    return kind == "email" or kind.startswith("email:")


def normalize_value(spec: KeySpec, value: str) -> str | None:
    """The stored form of a subject typed by a person (for reset and usage lookups), as the
    key stores it: IPs masked for ``ip`` (None when not an IP), emails case folded, other
    values cleaned (a header holding an address is stored as sent, unmasked)."""
    if spec == "ip":
        return mask_ip(value)
    if spec == "user_or_ip":
        return mask_ip(value) or _clean(value)
    if isinstance(spec, str) and is_email_kind(spec):
        return normalize_email(value)
    return _clean(value)
