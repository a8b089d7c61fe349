"""Per-subject overrides: one subject of one limit gets other rates, or none.

An override names a limit (a rule's name, a decorator's group or ``drf:<scope>``), a subject
and the rates that subject gets instead (``"10000/h"``, ``"5/m;100/d"``) or ``unlimited``.
The subject is what the limit's key reads, typed by a person:

* a value (a username, an email, a header's value), normalised as the keys normalise
  (:func:`ratelimit_app.identity.keys.normalize_value`): padding, invisible characters and an
  email's case do not matter;
* an IP address or a CIDR network, IPv4 or IPv6 (an IPv4-mapped network is the IPv4 one);
  matched only against IP subjects;
* ``group:<name>``: the members of a Django group; matched only against user subjects
  (``user``, and ``user_or_ip`` when it counted a user).

The most specific override wins: an exact value, then the network with the longest
prefix, then a group. A user in several groups with overrides gets the most generous of
them: ``unlimited``, else the rates whose tightest rate allows the most in the long run.

A username matches exactly, as Django's authentication compares it (``PARTNER`` is not
``partner``); only the email keys fold case.

Pure logic: validation and a table compiled per configuration snapshot
(:mod:`ratelimit_app.store`) and changed in place one override at a time
(:meth:`Table.put`, :meth:`Table.drop`); answering for a subject costs dictionary lookups,
for a network one per prefix length the limit's networks have.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app.algorithms import calendar, rates
from ratelimit_app.config.limits import Mistake, collect, raise_all
from ratelimit_app.identity import addresses, keys
from ratelimit_app.runtime import RUNTIME

__all__ = [
    "UNLIMITED",
    "LimitOverrides",
    "Override",
    "OverrideError",
    "Subject",
    "Table",
    "by_address",
    "compile_table",
    "parse",
    "parse_subject",
]

Rates = tuple[rates.Rate, ...]
#: The rates of an ``unlimited`` override: none (the limit does not apply to the subject).
UNLIMITED: Rates = ()
UNLIMITED_TEXT = "unlimited"
GROUP_PREFIX = "group:"
#: The longest limit name, rate text and group name (the model's columns and
#: ``auth.Group.name``); a subject is at most :data:`ratelimit_app.identity.keys.MAX_VALUE_LENGTH`.
MAX_LIMIT_LENGTH = 200
MAX_RATE_LENGTH = 200
MAX_GROUP_LENGTH = 150
#: The kinds whose subject may be a signed-in user, and whose overrides may name groups.
USER_KINDS = frozenset(["user", "user_or_ip"])
#: Text that can only be meant as an IP address (dotted quad, or hex and colons): when it
#: is not a valid one, a typo, not a username.
_LOOKS_LIKE_IP = re.compile(r"\d+(\.\d+){3}|[0-9a-fA-F:.]*::[0-9a-fA-F:.]*|([0-9a-fA-F]*:){7}\w*")


class OverrideError(Mistake):
    """An override that cannot be used; ``field`` names the part that is wrong (``limit``,
    ``subject`` or ``rate``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class Subject(NamedTuple):
    """A parsed subject: ``kind`` is ``value``, ``network`` or ``group``."""

    kind: str
    value: str
    network: addresses.IPNetwork | None = None


class Override(NamedTuple):
    """One validated override."""

    limit: str
    subject: Subject
    rates: Rates


def parse(limit: object, subject: object, rate: object) -> Override:
    """Validate an override; raise :class:`OverrideError` naming the part that is wrong
    (its ``errors`` name every part that is wrong)."""
    errors: list[OverrideError] = []
    name = collect(errors, OverrideError, parse_limit, limit)
    who = collect(errors, OverrideError, parse_subject, subject)
    found = collect(errors, OverrideError, parse_rate, rate)
    if errors:
        raise_all(errors)
    assert name is not None
    assert who is not None
    assert found is not None
    return Override(name, who, found)


def _text(field: str, value: object, longest: int) -> str:
    """``value`` stripped; an error naming ``field`` when it is no text, empty, too long or
    holds control or invisible characters (which no key value keeps either)."""
    if not isinstance(value, str) or not value.strip():
        raise OverrideError(field, f"The {field} must be non-empty text.")
    text = value.strip()
    if len(text) > longest:
        raise OverrideError(field, f"The {field} is longer than {longest} characters.")
    if not text.isprintable():  # (a lone surrogate is not printable either)
        raise OverrideError(
            field, f"The {field} {text[:60]!r} holds invisible or control characters."
        )
    return text


def parse_limit(value: object) -> str:
    """A limit's name: non-empty text without spaces (a decorator's group is any such text:
    decorators are not registered anywhere, so it cannot be checked further here)."""
    text = _text("limit", value, MAX_LIMIT_LENGTH)
    if any(c.isspace() for c in text):
        raise OverrideError("limit", f"The limit {text[:60]!r} holds a space: names have none.")
    return text


def parse_rate(value: object) -> Rates:
    """``unlimited`` (:data:`UNLIMITED`) or literal rates such as ``'10000/h'``."""
    text = _text("rate", value, MAX_RATE_LENGTH)
    if text.lower() == UNLIMITED_TEXT:
        return UNLIMITED
    try:
        # One tuple per rate text, shared by the overrides that give it (ten thousand
        # overrides of "10/m" hold one): kept with what the runtime compiles.
        return RUNTIME.compile(("rates", text), _rates_and_quotas, text)
    except ImproperlyConfigured as exc:
        raise OverrideError("rate", f"{exc} Or 'unlimited'.") from None


def _rates_and_quotas(text: str) -> Rates:
    """The rates of ``text``, and its quotas on the calendar (``"1000000/month"``: docs/
    quotas), in the zone of the limit they are given to when applied; at most one."""
    rest, quotas = calendar.split(text)
    if len(quotas) > 1:
        raise ImproperlyConfigured(f"Rate {text!r:.80}: at most one quota (day, week or month).")
    return (rates.parse(rest) if rest.strip() else ()) + quotas


def parse_subject(value: object) -> Subject:
    """A subject as :data:`Subject` keeps it, normalised as the keys store values."""
    text = _text("subject", value, keys.MAX_VALUE_LENGTH)
    if text.startswith(GROUP_PREFIX):
        name = text[len(GROUP_PREFIX) :].strip()
        if not name:
            raise OverrideError("subject", "'group:' needs a group name, e.g. 'group:premium'.")
        if len(name) > MAX_GROUP_LENGTH:
            raise OverrideError(
                "subject", f"A group name is at most {MAX_GROUP_LENGTH} characters."
            )
        return Subject("group", name)
    network = _network(text)
    if network is not None:
        return Subject("network", str(network), network)
    if _LOOKS_LIKE_IP.fullmatch(text):
        raise OverrideError("subject", f"{text!r} is not a valid IP address or network.")
    cleaned = keys.normalize_value("", text)
    if cleaned is None or cleaned.startswith("long:"):  # NFKC may lengthen it
        raise OverrideError(
            "subject", f"The subject is longer than {keys.MAX_VALUE_LENGTH} characters."
        )
    return Subject("value", cleaned)


def _network(text: str) -> addresses.IPNetwork | None:
    """The network an IP address or CIDR network names (IPv4-mapped: the IPv4 one), None
    for text that is neither; an error for a network with host bits set."""
    address = addresses.parse_address(text)
    if address is not None:
        return ipaddress.ip_network(address)
    if "/" not in text:
        return None
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        if _LOOKS_LIKE_IP.fullmatch(text.partition("/")[0]):
            raise OverrideError("subject", f"{text!r} is not a valid CIDR network.") from None
        return None  # not a network: some other value with a slash
    try:
        ipaddress.ip_network(text)
    except ValueError:
        raise OverrideError(
            "subject",
            f"{text!r} has host bits set: the network is {network} (or name one address "
            "without a prefix).",
        ) from None
    return addresses.unmap_network(network)


def generosity(found: Rates) -> float:
    """How much ``found`` lets through in the long run: its tightest rate's requests per
    second (``unlimited``: infinite)."""
    if found == UNLIMITED:
        return float("inf")
    return min(r.count / r.seconds for r in found)


#: Each prefix length's netmask as an integer, by address size in bits (IPv4 32, IPv6 128).
_NETMASKS = MappingProxyType(
    {
        bits: tuple(((1 << bits) - 1) ^ ((1 << (bits - p)) - 1) for p in range(bits + 1))
        for bits in (32, 128)
    }
)
#: The networks of one prefix length: the network address as an integer -> its rates.
Networks = dict[int, Rates]


@dataclass(slots=True)
class LimitOverrides:
    """One limit's overrides, by what they match.

    Several subjects may name one key of :attr:`folded` (``Alice@x.org`` and ``alice@x.org``)
    or of :attr:`hosts` (two IPv6 addresses of one /64): the one put last applies, and
    dropping it brings back the one put before (:attr:`sharers` remembers them).
    """

    #: Values as :func:`ratelimit_app.identity.keys.normalize_value` cleans them, and case folded
    #: (for the email keys, which fold case).
    values: dict[str, Rates] = field(default_factory=dict)
    folded: dict[str, Rates] = field(default_factory=dict)
    #: Networks as the IP keys store an address (masked): a network within one mask is the
    #: masked address its clients are counted under.
    hosts: dict[str, Rates] = field(default_factory=dict)
    #: Wider networks, by address size in bits: for each prefix length present, longest
    #: first, its netmask and its networks. A look-up masks the address once per prefix
    #: length (33 for IPv4, 129 for IPv6 at most), whatever the number of networks.
    networks: dict[int, tuple[tuple[int, Networks], ...]] = field(default_factory=dict)
    groups: dict[str, Rates] = field(default_factory=dict)
    #: (bits, prefix length) -> the networks of :attr:`networks` of that length.
    by_prefix: dict[tuple[int, int], Networks] = field(default_factory=dict)
    #: (``folded`` or ``hosts``, key) -> {subject text: rates} of the subjects naming the
    #: key, in the order they were put.
    sharers: dict[tuple[str, str], dict[str, Rates]] = field(default_factory=dict)
    #: A network subject's text -> the key of :attr:`hosts` it was put under.
    hosted: dict[str, str] = field(default_factory=dict)
    #: The table's :attr:`Table.known` (every key of every limit's exact tables).
    known: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.values or self.hosts or self.networks or self.groups)


#: The user's group names, asked for only when a group override could apply.
GroupNames = Callable[[], Iterable[str]]
#: The signed-in user's username (None: anonymous), asked for user subjects only.
Username = Callable[[], str | None]
#: How the IP keys store an address (:func:`ratelimit_app.identity.addresses.mask_ip`).
Mask = Callable[[str], str | None]


@dataclass(slots=True)
class Table:
    """The overrides in force, compiled: answers for a limit and a subject.

    Changed in place one override at a time (:meth:`put`, :meth:`drop`: constant time,
    whatever the number of overrides); each change bumps :attr:`version`, so whoever
    remembers answers knows when to forget them. A change is a few dictionary assignments
    a look-up in another thread sees before or after, never half made; changes themselves
    are made by one thread at a time (the caller's lock).
    """

    by_limit: dict[str, LimitOverrides] = field(default_factory=dict)
    #: Bumped by every :meth:`put` and :meth:`drop` (after the change is made).
    version: int = 0
    #: Every key of every limit's :attr:`~LimitOverrides.values`,
    #: :attr:`~LimitOverrides.folded` and :attr:`~LimitOverrides.hosts`, with the number of
    #: those tables holding it: a subject whose value is not here has no exact override
    #: under any limit (one look-up per subject, however many limits have overrides).
    known: dict[str, int] = field(default_factory=dict)
    #: The key kinds whose subjects must be asked about under their limit even when their
    #: value is not :attr:`known`: the user kinds (an override names a username or a
    #: group), and ``ip`` while a limit has networks wider than one masked address.
    asks: frozenset[str] = USER_KINDS

    def __bool__(self) -> bool:
        return bool(self.by_limit)

    def lookup(
        self, limit: str, kind: str, value: str, username: Username, groups: GroupNames
    ) -> tuple[Rates | None, bool]:
        """The rates ``value`` (of key kind ``kind``) gets under ``limit``
        (:data:`UNLIMITED`: none), or None for no override; and whether the answer depends
        on the user's groups (so a caller remembering it knows when to ask again)."""
        found = self.by_limit.get(limit)
        if found is None:
            return None, False
        ip = kind == "ip" or (kind in USER_KINDS and addresses.parse_address(value) is not None)
        if ip:
            return by_address(found, value), False
        if kind in USER_KINDS:
            return _by_user(found, username, groups)
        table = found.folded if keys.is_email_kind(kind) else found.values
        return table.get(value), False

    def put(self, override: Override, mask: Mask) -> None:
        """Add ``override``, or replace the one of its limit and subject (in place: a
        look-up meanwhile finds the old rates or the new)."""
        found = self.by_limit.get(override.limit)
        if found is None:
            found = LimitOverrides(known=self.known)
        _add(found, override, mask)
        self.by_limit[override.limit] = found
        self._changed()

    def drop(self, limit: str, subject: Subject) -> bool:
        """Remove the override of ``limit`` for ``subject`` (:func:`parse_subject` of its
        text); False when there was none."""
        found = self.by_limit.get(limit)
        if found is None or not _remove(found, subject):
            return False
        if not found:
            del self.by_limit[limit]
        self._changed()
        return True

    def _changed(self) -> None:
        networked = any(found.networks for found in self.by_limit.values())
        self.asks = (USER_KINDS | {"ip"}) if networked else USER_KINDS
        self.version += 1


def by_address(found: LimitOverrides, value: str) -> Rates | None:
    """The rates ``found`` gives the address ``value`` (as the IP keys store it): its own,
    else its network's of the longest prefix; None for none."""
    exact = found.hosts.get(value)
    if exact is not None or not found.networks:
        return exact
    located = _number(value)
    if located is None:
        return None
    bits, number = located
    wide = found.networks.get(bits)
    if wide is None:
        return None
    for netmask, networks in wide:  # longest prefix first
        rates_ = networks.get(number & netmask)
        if rates_ is not None:
            return rates_
    return None


def _number(value: str) -> tuple[int, int] | None:
    """``(bits, number)`` of an address as the IP keys store it (32 or 128 bits), or None.
    The C parser first (a new client's every request asks: ``ipaddress`` costs several
    thousand instructions more); anything it refuses goes through ``ipaddress``."""
    try:
        if ":" in value:
            number = int.from_bytes(socket.inet_pton(socket.AF_INET6, value), "big")
            if number >> 32 == 0xFFFF:  # IPv4-mapped: the IPv4 address
                return 32, number & 0xFFFFFFFF
            return 128, number
        return 32, int.from_bytes(socket.inet_pton(socket.AF_INET, value), "big")
    except (OSError, ValueError):
        address = addresses.parse_address(value)
        return None if address is None else (address.max_prefixlen, int(address))


def _by_user(
    found: LimitOverrides, username: Username, groups: GroupNames
) -> tuple[Rates | None, bool]:
    # A username matches as Django's authentication compares it: exactly (after the
    # normalisation every key value gets), never case folded: ``PARTNER`` is not ``partner``.
    name = username() if found.values else None
    if name is not None:
        exact = found.values.get(keys.normalize_value("", name) or "")
        if exact is not None:
            return exact, False
    if not found.groups:
        return None, False
    matched = [found.groups[g] for g in groups() if g in found.groups]
    return (max(matched, key=generosity) if matched else None), True


def compile_table(overrides: Iterable[Override], mask: Mask) -> Table:
    """A :class:`Table` of ``overrides`` (later ones replace earlier ones of the same limit
    and subject). ``mask``: how the IP keys store an address
    (:func:`ratelimit_app.identity.addresses.mask_ip`)."""
    table = Table()
    for o in overrides:
        table.put(o, mask)
    return table


def _add(found: LimitOverrides, o: Override, mask: Mask) -> None:
    """Put ``o`` into ``found``, replacing the override of its subject there."""
    kind, value, network = o.subject
    if kind == "group":
        found.groups[value] = o.rates
    elif kind == "value":
        if value not in found.values:
            _enter(found.known, value)
        found.values[value] = o.rates
        folded = keys.normalize_email(value)
        if folded is not None:
            _share(found, found.folded, ("folded", folded), value, o.rates)
    elif network is not None:
        # A network the IP mask covers whole is one subject (its masked address); a wider
        # one is matched by its prefix.
        masked = mask(str(network.network_address))
        before = found.hosted.get(value)
        if masked is not None and masked == mask(str(network.broadcast_address)):
            if before is None:  # (it was a wider network under another mask, or new)
                _drop_network(found, network)
            elif before != masked:
                _unshare(found, found.hosts, ("hosts", before), value)
            found.hosted[value] = masked
            _share(found, found.hosts, ("hosts", masked), value, o.rates)
        else:
            if before is not None:
                del found.hosted[value]
                _unshare(found, found.hosts, ("hosts", before), value)
            _add_network(found, network, o.rates)


def _remove(found: LimitOverrides, subject: Subject) -> bool:
    """Take the override of ``subject`` out of ``found``; False when it holds none."""
    kind, value, network = subject
    if kind == "group":
        return found.groups.pop(value, None) is not None
    if kind == "value":
        if found.values.pop(value, None) is None:
            return False
        _leave(found.known, value)
        folded = keys.normalize_email(value)
        if folded is not None:
            _unshare(found, found.folded, ("folded", folded), value)
        return True
    masked = found.hosted.pop(value, None)
    if masked is not None:
        _unshare(found, found.hosts, ("hosts", masked), value)
        return True
    return network is not None and _drop_network(found, network)


def _share(
    found: LimitOverrides, table: dict[str, Rates], key: tuple[str, str], name: str, r: Rates
) -> None:
    """``table[key]`` is ``r``, put by subject ``name`` (now the last to name it)."""
    names = found.sharers.setdefault(key, {})
    names.pop(name, None)
    names[name] = r
    if key[1] not in table:
        _enter(found.known, key[1])
    table[key[1]] = r


def _unshare(
    found: LimitOverrides, table: dict[str, Rates], key: tuple[str, str], name: str
) -> None:
    """Subject ``name`` no longer names ``table[key]``: the subject put before it does, or
    none."""
    names = found.sharers.get(key)
    if names is None or names.pop(name, None) is None:
        return
    if names:
        table[key[1]] = names[next(reversed(names))]
    else:
        del found.sharers[key]
        del table[key[1]]
        _leave(found.known, key[1])


def _enter(known: dict[str, int], key: str) -> None:
    """One table more holds ``key`` (:attr:`Table.known`)."""
    known[key] = known.get(key, 0) + 1


def _leave(known: dict[str, int], key: str) -> None:
    """One table fewer holds ``key``."""
    left = known.get(key, 1) - 1
    if left > 0:
        known[key] = left
    else:  # (never absent meanwhile while another table holds it)
        known.pop(key, None)


def _add_network(found: LimitOverrides, network: addresses.IPNetwork, r: Rates) -> None:
    bits, prefix = network.max_prefixlen, network.prefixlen
    networks = found.by_prefix.get((bits, prefix))
    if networks is None:
        networks = found.by_prefix[(bits, prefix)] = {}
        _reorder(found, bits)  # a prefix length more: at most 129 of them
    networks[int(network.network_address)] = r


def _drop_network(found: LimitOverrides, network: addresses.IPNetwork) -> bool:
    bits, prefix = network.max_prefixlen, network.prefixlen
    networks = found.by_prefix.get((bits, prefix))
    if networks is None or networks.pop(int(network.network_address), None) is None:
        return False
    if not networks:
        del found.by_prefix[(bits, prefix)]
        _reorder(found, bits)
    return True


def _reorder(found: LimitOverrides, bits: int) -> None:
    """Make the look-up order of ``bits``-bit networks again (a new tuple, so a look-up
    under way goes on with the old one)."""
    order = tuple(
        (_NETMASKS[bits][p], found.by_prefix[(b, p)])
        for b, p in sorted(found.by_prefix, key=lambda bp: -bp[1])
        if b == bits
    )
    if order:
        found.networks[bits] = order
    else:
        found.networks.pop(bits, None)
