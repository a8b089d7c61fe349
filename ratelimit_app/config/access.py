"""Allow and deny lists (``RATELIMIT_ALLOW`` / ``RATELIMIT_DENY``): pure matching.

Entries are strings:

* an IP address or a CIDR network, IPv4 or IPv6 (``'203.0.113.7'``, ``'10.0.0.0/8'``,
  ``'2001:db8::/32'``), matched against the client IP
  (:func:`ratelimit_app.identity.addresses.client_ip`,
  before masking); IPv4-mapped IPv6 addresses and networks (``'::ffff:10.0.0.0/104'``) are
  the IPv4 ones they map, on either side;
* ``'user:<pk>'``, matched against ``request.user.pk``;
* an email address (``'alice@example.com'``, or ``'email:alice@example.com'``), matched
  against the value of rules keyed on an email (``email``, ``email:<field>``), normalised as
  those keys normalise it.

IPs and users are the client's own and are checked on every request (only when the lists hold
such entries). An email is only what a request claims: a denied one is refused, an allowed
one lifts the rules keyed on it, and the client's other limits still apply.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from ratelimit_app.identity import addresses, keys

IPNetwork = addresses.IPNetwork
logger = logging.getLogger("ratelimit_app")


@dataclass(frozen=True)
class AccessList:
    """One list, compiled: networks, user primary keys (as strings) and emails."""

    networks: tuple[IPNetwork, ...] = ()
    users: frozenset[str] = frozenset()
    emails: frozenset[str] = frozenset()
    _ips: frozenset[str] = field(default=frozenset(), repr=False)

    def __bool__(self) -> bool:
        return bool(self.networks or self.users or self.emails)

    def has_ip(self, ip: str | None) -> bool:
        if not self.networks or not ip:
            return False
        if ip in self._ips:  # the common entry, a single address: a set lookup
            return True
        # Spaces and the IPv4-mapped form (a dual-stack socket's) do not change the address.
        addr = addresses.parse_address(ip)
        if addr is None:
            return False
        return any(addr in net for net in self.networks)

    def has_user(self, request: HttpRequest) -> bool:
        if not self.users:
            return False
        user = getattr(request, "user", None)
        return bool(user is not None and user.is_authenticated and str(user.pk) in self.users)


def parse_entry(entry: object) -> tuple[str, object]:
    """``('network', IPNetwork)``, ``('user', pk)`` or ``('email', address)``; raise
    ``ImproperlyConfigured`` naming the entry when it is none of them."""
    if not isinstance(entry, str) or not entry.strip():
        raise ImproperlyConfigured(f"allow/deny entry {entry!r} is not a non-empty string.")
    text = entry.strip()
    if text.startswith("user:"):
        pk = text[5:].strip()
        if not pk:
            raise ImproperlyConfigured(f"allow/deny entry {entry!r}: 'user:' needs a user id.")
        return "user", pk
    if text.startswith("email:") or "@" in text:
        claimed = text.removeprefix("email:")
        # Normalised as the email keys normalise what a request sends (a long one to its
        # hash), so an entry matches however the client pads or disguises it.
        address = keys.normalize_email(claimed)
        if not address or "@" not in claimed:
            raise ImproperlyConfigured(f"allow/deny entry {entry!r} is not an email address.")
        return "email", address
    try:
        return "network", addresses.unmap_network(ipaddress.ip_network(text, strict=False))
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"allow/deny entry {entry!r} is not an IP, a CIDR network, 'user:<id>' or an "
            f"email address."
        ) from exc


def compile_list(entries: Iterable[object]) -> AccessList:
    """An :class:`AccessList` from entries; raise ``ImproperlyConfigured`` on a bad one."""
    if isinstance(entries, str):
        raise ImproperlyConfigured("an allow/deny list must be a list of strings, not a string.")
    networks: list[IPNetwork] = []
    users: set[str] = set()
    emails: set[str] = set()
    for entry in entries:
        kind, value = parse_entry(entry)
        if kind == "network":
            networks.append(value)  # type: ignore[arg-type]
        elif kind == "user":
            users.add(value)  # type: ignore[arg-type]
        else:
            emails.add(value)  # type: ignore[arg-type]
    single = frozenset(str(n.network_address) for n in networks if n.num_addresses == 1)
    return AccessList(tuple(networks), frozenset(users), frozenset(emails), single)


def merge(base: AccessList, entries: Iterable[str]) -> AccessList:
    """``base`` with more entries (the database's); an invalid entry is logged and skipped."""
    extra = []
    for entry in entries:
        try:
            parse_entry(entry)
        except ImproperlyConfigured as exc:
            logger.error("ratelimit: %s (entry left out)", exc)
            continue
        extra.append(entry)
    if not extra:
        return base
    more = compile_list(extra)
    return AccessList(
        base.networks + more.networks,
        base.users | more.users,
        base.emails | more.emails,
        base._ips | more._ips,
    )


EMPTY = AccessList()
