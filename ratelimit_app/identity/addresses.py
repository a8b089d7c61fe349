"""The client's address: ``REMOTE_ADDR`` or ``RATELIMIT_IP_META_KEY``, ``X-Forwarded-For``
read right to left past ``RATELIMIT_TRUSTED_PROXIES``, IPv4-mapped addresses as IPv4, and
masks (a client holds a whole IPv6 /64). Pure functions of the request and the settings.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.utils.module_loading import import_string

from ratelimit_app.conf import conf
from ratelimit_app.runtime import RUNTIME

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_address(text: str) -> IPAddress | None:
    """The address ``text`` holds (surrounding spaces ignored), an IPv4-mapped IPv6 address
    (``::ffff:192.0.2.1``, what a dual-stack socket reports for an IPv4 peer) as its IPv4
    address; None when it holds none. Every comparison of addresses goes through it."""
    if len(text) > MAX_ADDRESS_LENGTH:
        text = text.strip()
        if len(text) > MAX_ADDRESS_LENGTH:  # no address; not remembered (a client's text)
            return None
    return _parse_address(text)


def _parse_address(text: str) -> IPAddress | None:
    # Parsing an address costs microseconds; the same clients come back, so the runtime
    # remembers (``RUNTIME.addresses``, at most ADDRESS_MEMO texts of at most 64 characters).
    memo = RUNTIME.addresses
    found = memo.get(text, _MISSING)
    if found is _MISSING:
        found = _parsed(text)
        if len(text) <= MAX_ADDRESS_LENGTH:  # (a longer text is no address: not kept)
            if len(memo) >= ADDRESS_MEMO:
                memo.clear()
            memo[text] = found
    return found


def _parsed(text: str) -> IPAddress | None:
    try:
        addr = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def unmap_network(network: IPNetwork) -> IPNetwork:
    """An IPv4-mapped IPv6 network (``::ffff:10.0.0.0/104``) as the IPv4 network it maps
    (``10.0.0.0/8``), so it matches the addresses :func:`parse_address` gives; other networks
    unchanged."""
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96:
        mapped = network.network_address.ipv4_mapped
        if mapped is not None:
            return ipaddress.IPv4Network((mapped, network.prefixlen - 96))
    return network


def mask_ip(ip: str) -> str | None:
    """``ip`` masked by ``RATELIMIT_IPV4_MASK`` / ``RATELIMIT_IPV6_MASK``; None if invalid."""
    if len(ip) > MAX_ADDRESS_LENGTH:
        ip = ip.strip()
        if len(ip) > MAX_ADDRESS_LENGTH:  # no address; not remembered (a client's text)
            return None
    return _mask(ip)


def _mask(ip: str) -> str | None:
    """``ip`` masked by the settings' masks, remembered in the runtime (``RUNTIME.masked``,
    at most ADDRESS_MEMO texts of at most 64 characters)."""
    memo = RUNTIME.masked
    found = memo.get(ip, _MISSING)
    if found is _MISSING:
        found = _masked(ip, conf.IPV4_MASK, conf.IPV6_MASK)
        if len(ip) <= MAX_ADDRESS_LENGTH:
            if len(memo) >= ADDRESS_MEMO:
                memo.clear()
            memo[ip] = found
    return found


def _masked(ip: str, v4_mask: int, v6_mask: int) -> str | None:
    if v4_mask == 32 and ipv4_number(ip) is not None:
        # A plain IPv4 address, unmasked, is its own answer (no ipaddress object).
        return ip
    addr = _parse_address(ip)
    if addr is None:
        return None
    bits = addr.max_prefixlen
    drop = bits - (v6_mask if bits == 128 else v4_mask)
    if drop <= 0:  # the usual IPv4 mask, 32: the address itself
        return str(addr)
    # The network address by integer masking: a new client's first request costs half as
    # much as building an ip_network (the quiet subjects of a flood are all new).
    return str(type(addr)(int(addr) >> drop << drop))


#: Texts each memo of addresses in the runtime holds (``RUNTIME.addresses``, ``masked``,
#: ``trusted``); each starts over when full.
ADDRESS_MEMO = 4096
_MISSING: Any = object()
#: Longer than any IP address in text (an IPv6 address with a zone is at most 63).
MAX_ADDRESS_LENGTH = 64


def ipv4_number(text: str) -> int | None:
    """The IPv4 address ``text`` holds, as a number, when it is one written as ipaddress
    prints it (``192.0.2.1``), by the C parser: 0.7 us instead of ipaddress's 5 us, for the
    first request of every new client. None for anything else (then ipaddress decides).
    inet_pton rejects what ipaddress rejects (leading zeros, short forms, spaces); printing
    it back equal means the text is already the canonical form."""
    try:
        packed = socket.inet_pton(socket.AF_INET, text)
        if socket.inet_ntop(socket.AF_INET, packed) != text:
            return None
    except (OSError, ValueError):  # not IPv4 (ValueError: an embedded NUL)
        return None
    return int.from_bytes(packed, "big")


def _trusted_v4() -> tuple[tuple[int, int], ...]:
    """The IPv4 networks of ``RATELIMIT_TRUSTED_PROXIES`` (IPv4-mapped ones included), as
    (network, mask) numbers: built once (a part of the runtime)."""
    found = []
    for net in conf.TRUSTED_PROXIES:
        net = unmap_network(net)
        if isinstance(net, ipaddress.IPv4Network):
            found.append((int(net.network_address), int(net.netmask)))
    return tuple(found)


def trusted_proxy(ip: str) -> bool:
    """True when ``ip`` is one of ``RATELIMIT_TRUSTED_PROXIES``."""
    return _judged(ip.strip()) is True


def _judged(ip: str) -> bool | None:
    """Whether ``ip`` (stripped) is one of ``RATELIMIT_TRUSTED_PROXIES`` (True), another
    address (False) or no address at all (None), remembered in the runtime: a new client's
    hop in ``X-Forwarded-For`` is parsed once to know both that it is not a proxy and that
    it is an address."""
    if len(ip) > MAX_ADDRESS_LENGTH:  # no address: not remembered (a header is the client's)
        return None
    memo = RUNTIME.trusted
    found = memo.get(ip, _MISSING)
    if found is _MISSING:
        number = ipv4_number(ip)
        if number is not None:  # (every new IPv4 client: no ipaddress object)
            found = False
            for net, mask in RUNTIME.part(_trusted_v4):
                if number & mask == net:
                    found = True
                    break
        else:
            addr = _parse_address(ip)
            found = (
                None
                if addr is None
                else any(addr in unmap_network(net) for net in conf.TRUSTED_PROXIES)
            )
        if len(memo) >= ADDRESS_MEMO:
            memo.clear()
        memo[ip] = found
    return found


def client_ip(request: HttpRequest) -> str:
    """The client's address, masked by ``RATELIMIT_IPV4_MASK`` / ``RATELIMIT_IPV6_MASK``.

    ``RATELIMIT_IP_META_KEY`` works as in django-ratelimit (a META key, a callable or a dotted
    path). Otherwise ``REMOTE_ADDR``, and only when that peer is one of
    ``RATELIMIT_TRUSTED_PROXIES`` is ``X-Forwarded-For`` read, right to left, skipping the
    trusted proxies: the first untrusted address is the client. A client cannot spoof its way
    past a proxy that appends to the header. IPv4-mapped IPv6 addresses are their IPv4
    address. Raises ``ImproperlyConfigured`` when no valid address is found (see
    :func:`client_address`).
    """
    address = _address(request)
    masked = RUNTIME.masked.get(address, _MISSING)  # (a known client: no call)
    if masked is _MISSING:
        masked = _mask(address)
    if masked is None:
        raise ImproperlyConfigured(_no_address(request))
    return masked


def client_address(request: HttpRequest) -> str:
    """The client's address as :func:`client_ip` finds it, before masking.

    Raises ``ImproperlyConfigured`` when there is none or it is not an IP address: the
    server gives no ``REMOTE_ADDR`` (a Unix socket), or ``RATELIMIT_IP_META_KEY`` finds
    nothing valid. django-ratelimit raises here too; counting such requests in one shared
    bucket would let one client lock out everyone, and not limiting them at all would let
    every client through.
    """
    address = _address(request)
    if _parse_address(address) is None:
        raise ImproperlyConfigured(_no_address(request))
    return address


def _source(request: HttpRequest) -> tuple[str, object]:
    """Where the address comes from (for messages) and what it holds, unvalidated."""
    meta_key = conf.IP_META_KEY
    if not meta_key:
        return "REMOTE_ADDR", request.META.get("REMOTE_ADDR")
    if callable(meta_key):
        raw = meta_key(request)
    elif "." in meta_key:
        raw = import_string(meta_key)(request)
    else:
        raw = request.META.get(meta_key)
    return f"RATELIMIT_IP_META_KEY ({meta_key!r})", raw


def _address(request: HttpRequest) -> str:
    """The client's address, unvalidated (``''`` when there is none). Text a client may
    have written (a header named by ``RATELIMIT_IP_META_KEY``, an ``X-Forwarded-For`` hop)
    longer than any address is none: the address memos never keep it."""
    raw = _source(request)[1]
    text = raw.strip() if isinstance(raw, str) else ""
    if conf.IP_META_KEY:
        return text if len(text) <= MAX_ADDRESS_LENGTH else ""
    if not conf.TRUSTED_PROXIES:
        return text
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
    if not forwarded or not trusted_proxy(text):  # (no header: nothing to read, whoever sent)
        return text
    for hop in reversed(forwarded.split(",")[-32:]):
        hop = hop.strip()
        if not hop:
            continue
        judged = _judged(hop)
        if judged is not True:
            # A proxy appends the address it saw, which is always valid; garbage here
            # (None: no address) means a misconfigured proxy: count the proxy itself
            # rather than no one.
            return hop if judged is False else text
    return text


def _no_address(request: HttpRequest) -> str:
    source, raw = _source(request)
    found = "nothing" if not raw else f"{str(raw)[:60]!r}, not an IP address"
    return (
        f"ratelimit: no client IP address: {source} gave {found}. A limit keyed on the IP "
        f"(or falling back to it for a missing value) cannot count this request. Set "
        f"RATELIMIT_IP_META_KEY to the header your proxy sets (behind a proxy that "
        f"reaches Django over a Unix socket), or serve Django over TCP so that the server "
        f"fills REMOTE_ADDR, and list your proxies in RATELIMIT_TRUSTED_PROXIES. See "
        f"https://django-bucketry.readthedocs.io/en/latest/security.html"
    )


#: The networks an address is shown in where only part of it may be (the admin's *Refused
#: lately* and ban list, by ``RATELIMIT_REFUSED_SUBJECTS = "masked"``).
SHOWN_IPV4_PREFIX, SHOWN_IPV6_PREFIX = 24, 64


def shown_network(value: str) -> str | None:
    """The /24 (IPv4) or /64 (IPv6) network of an address as the key stores it, or None."""
    if SHOWN_IPV4_PREFIX == 24 and ipv4_number(value) is not None:
        # (a crowd's every refusal: an IPv4 address as printed, masked without ipaddress,
        # whose parse no memo keeps for a crowd's new addresses)
        return value[: value.rindex(".")] + ".0/24"
    addr = parse_address(value)
    if addr is None:
        return None
    if addr.version == 4 and SHOWN_IPV4_PREFIX == 24:  # (a crowd's every refusal: no network)
        text = str(addr)
        return text[: text.rindex(".")] + ".0/24"
    prefix = SHOWN_IPV4_PREFIX if addr.version == 4 else SHOWN_IPV6_PREFIX
    return str(ipaddress.ip_network((addr, prefix), strict=False))


def drf_forwarded(meta: Any, num_proxies: int) -> str:
    """The client's address by DRF's ``NUM_PROXIES`` rule (``0``: ``REMOTE_ADDR``; ``n``:
    the n-th address from the right of ``X-Forwarded-For``), with our guards: a peer that is
    not one of ``RATELIMIT_TRUSTED_PROXIES`` (when set) counts itself, and a hop that is no
    address counts the proxy that sent it (the DRF throttles' ``get_ident``)."""
    problem = num_proxies_problem(num_proxies)
    if problem:
        raise ImproperlyConfigured(problem)
    remote = meta.get("REMOTE_ADDR") or ""
    xff = meta.get("HTTP_X_FORWARDED_FOR")
    if num_proxies == 0 or xff is None:
        return remote
    if conf.TRUSTED_PROXIES and parse_address(remote) and not trusted_proxy(remote):
        return remote
    hops = xff.split(",")
    hop = hops[-min(num_proxies, len(hops))]
    return hop if parse_address(hop) else remote


def drf_ident(request: HttpRequest, num_proxies: int | None) -> str | None:
    """The client's address a DRF throttle counts (``get_ident``), masked; None when the
    request has none. ``NUM_PROXIES`` None (DRF's default, which would take the whole
    ``X-Forwarded-For``): our own rule (:func:`client_ip`); else DRF's (:func:`drf_forwarded`)."""
    if num_proxies is None:
        try:
            return client_ip(request)
        except ImproperlyConfigured:
            return None
    return mask_ip(drf_forwarded(request.META, num_proxies))


#: A DRF throttle's error for a request without an address (``%s``: the throttle's class).
NO_DRF_IDENT = (
    "ratelimit: %s: the request has no client IP address (REMOTE_ADDR, or the "
    "X-Forwarded-For hop NUM_PROXIES names): counting it would put every such client in one "
    "bucket. Serve Django over TCP so that the server fills REMOTE_ADDR, or set "
    "RATELIMIT_IP_META_KEY, and list your proxies in RATELIMIT_TRUSTED_PROXIES (see "
    "docs/drf.rst)."
)


def num_proxies_problem(value: object) -> str | None:
    """What is wrong with a ``NUM_PROXIES`` (None: nothing)."""
    if value is None or (type(value) is int and value >= 0):
        return None
    return (
        f"REST_FRAMEWORK['NUM_PROXIES'] must be None or a whole number of proxies, 0 or "
        f"more; got {value!r}."
    )
