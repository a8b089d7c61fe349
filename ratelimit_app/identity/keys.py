"""Request features ("keys"): who a limit counts. Pure functions of the request.

The client's address is :mod:`ratelimit_app.identity.addresses`' job, and the hashed namespace a
subject is stored under is :mod:`ratelimit_app.identity.namespaces`'; both are importable from
here.

Every extractor returns a string or ``None`` for "missing". Values are normalised before any
rule about their length (stripped, NFKC, control and invisible characters removed), because
the view normalises too: Django's forms strip the padding a client adds, so a padded value
must count as the value it pads. A value that is still too long, or cannot be kept as text
(a lone surrogate, bytes that are not UTF-8), is a subject of its own, derived from it by a
hash: never the IP fallback, which would let a client pad its way out of an account's limit.

The work a value costs stays a few passes over it in C, whatever it holds: its padding is
stripped first, and a value still longer than ``NORMALISED_AT_MOST`` (NFKC shrinks text at
most fourfold, so it could never become short) is hashed as it is, never normalised: NFKC
turns one character into up to 18, a 2.5 MB form field into 16 million characters. A JSON
body is parsed once a request, whatever the number of keys that read it, and a JSON array
or object too long to be anyone's name is never written out as text.

Only a value that is genuinely absent (no field, an empty one, a body the view cannot read
either) makes :func:`subject` fall back to the client IP. Without a client address, that
fallback and the ``ip`` keys raise ``ImproperlyConfigured`` (as django-ratelimit does): the
server or the settings are wrong, and a limit that silently stops applying would hide it.
See ``docs/security``.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, QueryDict
from django.utils.module_loading import import_string

from ratelimit_app import request_state

# Re-exported: the client's address and the namespaces were this module's once, and
# projects' key functions import them from here.
from ratelimit_app.identity.addresses import IPAddress as IPAddress
from ratelimit_app.identity.addresses import IPNetwork as IPNetwork
from ratelimit_app.identity.addresses import client_address as client_address
from ratelimit_app.identity.addresses import client_ip as client_ip
from ratelimit_app.identity.addresses import mask_ip as mask_ip
from ratelimit_app.identity.addresses import parse_address as parse_address
from ratelimit_app.identity.addresses import trusted_proxy as trusted_proxy
from ratelimit_app.identity.addresses import unmap_network as unmap_network
from ratelimit_app.identity.namespaces import namespace as namespace
from ratelimit_app.runtime import RUNTIME

#: Values longer than this (after normalising) are kept as a hash of themselves
#: (:func:`derived`): a person's email or name is never this long.
MAX_VALUE_LENGTH = 320

KeyFunc = Callable[[str, HttpRequest], Any]
KeySpec = str | KeyFunc

#: Removed from every value: C0 and C1 controls, line and paragraph separators, and every
#: invisible format character (Unicode category Cf: zero-width and bidirectional marks, soft
#: hyphens, tags...), so values that look the same are the same.
_CONTROL_CHARS = (
    "\x00-\x1f\x7f-\x9f\u2028\u2029\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891"
    "\u08e2\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f"
)
_CONTROL = re.compile(f"[{_CONTROL_CHARS}]")
#: What ``str.strip()`` strips (``str.isspace()``), spelled out so that a run of padding is
#: matched by a table lookup per character rather than a test of each category.
_SPACES = "\t-\r\x1c- \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
#: A run of padding: white space and the characters :data:`_CONTROL` removes.
_PADDING = re.compile(f"[{_SPACES}{_CONTROL_CHARS}]*")
#: NFKC shrinks text at most 4 to 1 (the longest canonical decomposition is 4 code points),
#: so a value longer than this once its padding is stripped stays over ``MAX_VALUE_LENGTH``.
NORMALISED_AT_MOST = 4 * MAX_VALUE_LENGTH
#: Lone surrogates: Python strings may hold them (JSON's ``"\ud800"`` decodes to one), no
#: encoding can write them.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: The forms of ``Content-Type`` that Django parses into ``request.POST``.
_FORM_TYPES = frozenset(["multipart/form-data", "application/x-www-form-urlencoded"])


# --- values ---------------------------------------------------------------------------------


def derived(reason: str, data: bytes) -> str:
    """The subject of a value that cannot be kept as it is (``reason``: ``long`` or
    ``invalid``): a hash of it, so the same value is always the same subject, and a client
    varying it is no better off than one varying a short value. ASCII, bounded, and never
    the IP fallback."""
    return f"{reason}:sha256:{hashlib.sha256(data).hexdigest()}"


def _as_text(value: object) -> str:
    """``value`` as the text a view would see (bytes decoded as UTF-8, the rest by
    ``str()``); a value that has no such text is :func:`derived` from what it is."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return derived("invalid", bytes(value))
    if isinstance(value, list | dict) and not _may_be_short(value):
        # A JSON array or object whose text is longer than any name, and would cost a pass
        # over every element to write out (50 ms for 2.5 MB of small numbers): a subject
        # of its own, by its kind and size.
        shape = "array" if isinstance(value, list) else "object"
        return derived("long", f"{shape}:{len(value)}".encode())
    try:
        return str(value)
    except ValueError:
        if isinstance(value, int):  # over Python's limit of digits for str(): hex has none
            return derived("long", f"{value:x}".encode())
        raise


def _may_be_short(value: list[Any] | dict[Any, Any]) -> bool:
    """Whether ``str(value)`` may be at most ``NORMALISED_AT_MOST`` characters: every element
    writes one at least, a string as many as it holds. Reads that many elements at most."""
    budget = NORMALISED_AT_MOST
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            budget -= 2 * len(item)
            if budget < 0:
                return False
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, list):
            budget -= len(item)
            if budget < 0:
                return False
            stack += item
        elif isinstance(item, str):
            budget -= len(item)
            if budget < 0:
                return False
    return True


def _clean(value: object, fold: bool = False) -> str | None:
    """The normal form of a key value; None only when nothing is left of it."""
    if value is None:
        return None
    # Padding first: stripping is cheap, and everything NFKC turns into a space is white
    # space to strip() already, so stripping again after normalising gives the same value.
    text = (value if type(value) is str else _as_text(value)).strip()
    if len(text) > NORMALISED_AT_MOST or not (text.isascii() and text.isprintable()):
        # Short printable ASCII (the common case) is its own NFKC form and holds no control
        # character. Anything else loses its padding before any rule about its length:
        # Django strips what the client padded a value with, so the padded value is the
        # value.
        if len(text) > NORMALISED_AT_MOST:
            text = _unpadded(text)
            if len(text) > NORMALISED_AT_MOST:
                return _long(text, fold)
        text = _CONTROL.sub("", unicodedata.normalize("NFKC", text)).strip()
        if _SURROGATE.search(text):
            return derived("invalid", text.encode("utf-8", "surrogatepass"))
    if fold:
        text = text.casefold()  # may grow: "ß" folds to "ss"
    if not text:
        return None
    if len(text) > MAX_VALUE_LENGTH:
        return derived("long", text.encode())
    return text


def _unpadded(text: str) -> str:
    """``text`` without the white space and control characters at either end: the runs of
    padding are matched in C, and the rest is only copied."""
    start = _padding_end(text)
    if start == len(text):
        return ""
    end = len(text)
    if _padding_end(text, end - 1) == end:  # padded at the end too: read it backwards
        end -= _padding_end(text[::-1])
    return text[start:end]


def _padding_end(text: str, pos: int = 0) -> int:
    """Where the run of padding that starts at ``pos`` ends."""
    found = _PADDING.match(text, pos)
    return found.end() if found else pos


def _long(text: str, fold: bool) -> str:
    """The subject of a value too long to be anyone's name once unpadded: a hash of it as
    it is (case folded for emails), without normalising it, so its cost stays a few passes
    over the text in C."""
    if fold:
        text = text.casefold()
    try:
        return derived("long", text.encode())
    except UnicodeEncodeError:  # a lone surrogate
        return derived("invalid", text.encode("utf-8", "surrogatepass"))


def normalize_email(value: object) -> str | None:
    """Stripped, NFKC-normalised, case-folded: ``' Foo@X.com'`` and ``'foo@x.com'`` match.

    A value still longer than ``MAX_VALUE_LENGTH`` or that is not valid text is its
    :func:`derived` hash; None only when nothing is left of it."""
    return _clean(value, fold=True)


def _unreadable(request: HttpRequest) -> bytes | None:
    """The body, or None when the view could not read it either: over
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (Django answers 400), or the stream already read."""
    try:
        return request.body
    except Exception:  # RequestDataTooBig, RawPostDataException
        return None


#: What the request's state keeps when its body is no JSON object (the keys of every rule
#: read the body's JSON, and a big body costs its parse once).
_NO_JSON: Any = object()


def _json_body(request: HttpRequest) -> dict[str, Any] | None:
    """The body as a JSON object, as a view reads it: ``json.loads(request.body)`` (UTF-8,
    -16 or -32) or, failing that, decoded by the charset the request declares (as Django
    REST framework's parser does). None when it is no JSON object. Parsed once a request."""
    kept = request_state.state(request)
    found = None if kept is None else kept.json
    if found is None:
        found = _parse_json(request)
        if kept is not None:
            kept.json = _NO_JSON if found is None else found
    return None if found is _NO_JSON else found


def _parse_json(request: HttpRequest) -> dict[str, Any] | None:
    body = _unreadable(request)
    if not body:
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        if not request.encoding:
            return None
        try:
            data = json.loads(body.decode(request.encoding))
        except (ValueError, RecursionError, LookupError):
            return None
    return data if isinstance(data, dict) else None


#: The attributes of a Django REST framework ``Request`` that hold its parsed body (and the
#: stream it parses): put back as they were when a parse fails (see :func:`_drf_value`).
_DRF_PARSED = ("_data", "_files", "_full_data", "_stream")


def _is_drf(request: object) -> bool:
    """True for Django REST framework's ``Request``, which wraps Django's request
    (``_request``) and parses the body into ``data`` with the view's parsers. Recognised by
    its shape: this low layer imports nothing of DRF."""
    return isinstance(getattr(request, "_request", None), HttpRequest) and hasattr(
        type(request), "data"
    )


def _drf_value(request: Any, field: str) -> object:
    """``field`` as the view reads it from DRF's ``request.data`` (whatever the body: form,
    multipart, JSON), parsed by the view's own parsers, once: DRF keeps what it parsed for
    the view. A file is no value (``request.POST`` holds none). Never raises.

    The body is kept in memory first when Django allows it, so a body DRF cannot parse is
    left unparsed for the view, which meets the error itself (400, 415) as it would
    without the limit; DRF's own answer after a failed parse would be an empty form."""
    cached = _unreadable(request._request) is not None
    before = [getattr(request, name, None) for name in _DRF_PARSED]
    try:
        data = request.data
    except Exception:  # ParseError, UnsupportedMediaType, RequestDataTooBig...
        if cached:
            for name, value in zip(_DRF_PARSED, before, strict=True):
                setattr(request, name, value)
        return None
    if not isinstance(data, Mapping):  # a JSON array or scalar
        return None
    from django.core.files import File  # an upload: what DRF's views alone receive here

    value = data.get(field)
    return None if isinstance(value, File) else value


def form_value(request: HttpRequest, field: str) -> object:
    """A field as the view can read it; None when absent. Never raises.

    A form (``multipart/form-data``, ``application/x-www-form-urlencoded``) is read as
    ``request.POST`` reads it; any other body (JSON whatever its ``Content-Type`` says, as
    views that call ``json.loads(request.body)`` read it), and a URL-encoded form without
    the field, as a JSON object. A JSON value that is not a string is the text a form field
    would make of it (``5`` is ``"5"``); ``null`` is absent. A body that cannot be read (too
    many fields, over ``DATA_UPLOAD_MAX_MEMORY_SIZE``, malformed multipart) gives None: the
    view cannot read it either. Inside a Django REST framework view (``@api_view``, an
    ``APIView`` method) the request is DRF's, and the field is what ``request.data`` holds.
    """
    if not isinstance(request, HttpRequest) and _is_drf(request):
        return _drf_value(request, field)
    content_type = request.content_type or ""
    if content_type in _FORM_TYPES:
        try:
            form = request.POST
        except Exception:  # malformed multipart, too many fields, too big, read already
            return None
        if type(form) is QueryDict:
            # form.get(field), without its two Python calls: a QueryDict is a dict of each
            # field's list of values, and get() answers the last of them.
            values = dict.get(form, field)
            value = values[-1] if values else None
        else:  # a request whose POST was replaced (a test, a middleware)
            value = form.get(field)
        if value is not None or content_type == "multipart/form-data":
            return value
    body = _json_body(request)
    return body.get(field) if body is not None else None


def _query_value(request: HttpRequest, field: str) -> str | None:
    """A query-string parameter; never raises (too many fields: missing, and Django
    refuses ``request.GET`` to the view too)."""
    try:
        return request.GET.get(field)
    except Exception:  # TooManyFieldsSent and the like
        return None


def get_header(request: HttpRequest, header: str) -> str:
    """The value of an HTTP request header, ``''`` when it is absent (django-ratelimit's
    ``get_header``): ``'x-api-key'`` reads ``request.META['HTTP_X_API_KEY']``."""
    return request.META.get("HTTP_" + header.replace("-", "_").upper(), "")


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


def user_or_ip(request: HttpRequest) -> str:
    """The signed-in user's primary key, else the masked client IP (django-ratelimit's
    ``user_or_ip``). Raises ``ImproperlyConfigured`` for an anonymous request without a
    client address (see :func:`client_address`). A request without ``request.user`` (no
    authentication middleware) counts as anonymous rather than raising."""
    return _user(request) or client_ip(request)


SIMPLE_KEYS: Mapping[str, Callable[[HttpRequest], str | None]] = MappingProxyType(
    {
        "ip": client_ip,
        "user": _user,
        "user_or_ip": user_or_ip,
        "email": lambda r: _clean(form_value(r, "email"), True),  # normalize_email, one call less
        "device": lambda r: device(r.META.get("HTTP_USER_AGENT", "")[:1024]),
    }
)

ACCESSOR_KEYS: Mapping[str, Callable[[HttpRequest, str], str | None]] = MappingProxyType(
    {
        "get": lambda r, k: _clean(_query_value(r, k)),
        "post": lambda r, k: _clean(form_value(r, k)),
        "header": lambda r, k: _clean(get_header(r, k)),
        "email": lambda r, k: normalize_email(form_value(r, k)),
    }
)


def compile_key(spec: str) -> Callable[[str, HttpRequest], str | None]:
    """A function ``(group, request) -> value or None`` for a key string; validates it.
    Made once per key string (kept in the runtime's ``compiled``)."""
    return RUNTIME.compile(("key", spec), _compile_key, spec)


def _compile_key(spec: str) -> Callable[[str, HttpRequest], str | None]:
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


def subject(spec: KeySpec, group: str, request: HttpRequest) -> tuple[str, str]:
    """``(kind, value)`` that a limit counts, with the client IP as the fallback for a value
    that is absent (see the module docstring).

    Raises ``ImproperlyConfigured`` when the IP is needed and the request has none
    (:func:`client_address`), or when ``spec`` is no key.
    """
    return reader(spec)(group, request)


#: What :func:`reader` makes: ``(group, request) -> (kind, value)``.
Reader = Callable[[str, HttpRequest], tuple[str, str]]


def reader(spec: KeySpec) -> Reader:
    """The function that finds ``spec``'s subject in a request, as :func:`subject` does:
    made once by a limit (its key validated then), so that a check only reads the request.
    Raises ``ImproperlyConfigured`` when ``spec`` is no key."""
    if not spec:
        raise ImproperlyConfigured("Ratelimit key must be specified.")
    if callable(spec):
        fn, name = spec, kind(spec)

        def read_callable(group: str, request: HttpRequest) -> tuple[str, str]:
            value = _clean(fn(group, request))
            return ("ip", client_ip(request)) if value is None else (name, value)

        return read_callable
    found = compile_key(spec)

    def read(group: str, request: HttpRequest) -> tuple[str, str]:
        value = found(group, request)
        return ("ip", client_ip(request)) if value is None else (spec, value)

    return read


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


def ignores_group(spec: KeySpec) -> bool:
    """True when a key's value does not depend on the group it is counted in (the built-in
    kinds and accessors; not a function, which is passed the group): one request's rules may
    share the value."""
    return type(spec) is str and (spec in SIMPLE_KEYS or ":" in spec)


def _throttle_ident_prefix(cache_format: str, scope: str | None) -> str | None:
    """What a key of ``cache_format`` holds before its ident (None: the ident is not last,
    or the format is not DRF's kind); made once per format and scope."""
    return RUNTIME.compile(
        ("ident-prefix", cache_format, scope), _ident_prefix, cache_format, scope
    )


def _ident_prefix(cache_format: str, scope: str | None) -> str | None:
    if not cache_format.endswith("%(ident)s"):
        return None
    try:
        return cache_format % {"scope": scope, "ident": ""}
    except (KeyError, ValueError, TypeError):
        return None


def throttle_subject(key: str, cache_format: str, scope: str | None) -> str:
    """The value a throttle's counters are filed under: the ident of a key in the
    throttle's own format (so a person finds it by a user id or an IP), else the key; filed
    under the ``user_or_ip`` kind."""
    prefix = _throttle_ident_prefix(cache_format, scope)
    if prefix is not None and key.startswith(prefix):
        key = key[len(prefix) :]
    return normalize_value("user_or_ip", key) or key
