"""Per-subject overrides: one subject of one limit gets other rates, or none.

An override names a limit (a rule's name, a decorator's group or ``drf:<scope>``), a subject
and the rates that subject gets instead (``"10000/h"``, ``"5/m;100/d"``) or ``unlimited``.
The subject is what the limit's key reads, typed by a person:

* a value (a username, an email, a header's value), normalised as the keys normalise
  (:func:`ratelimit_app.keys.normalize_value`): padding, invisible characters and an
  email's case do not matter;
* an IP address or a CIDR network, IPv4 or IPv6 (an IPv4-mapped network is the IPv4 one);
  matched only against IP subjects;
* ``group:<name>``: the members of a Django group; matched only against user subjects
  (``user``, and ``user_or_ip`` when it counted a user).

The most specific override wins: an exact value, then the network with the longest
prefix, then a group. A user in several groups with overrides gets the most generous of
them: ``unlimited``, else the rates whose tightest rate allows the most in the long run.

Pure logic: validation and a table compiled once per configuration snapshot
(:mod:`ratelimit_app.store`); answering for a subject costs dictionary lookups.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app import keys
from ratelimit_app.algorithms import rates
from ratelimit_app.config.limits import Mistake, collect, raise_all
from ratelimit_app.identity import addresses

__all__ = [
    "UNLIMITED",
    "Override",
    "OverrideError",
    "Table",
    "compile_table",
    "parse",
]

Rates = tuple[rates.Rate, ...]
#: The rates of an ``unlimited`` override: none (the limit does not apply to the subject).
UNLIMITED: Rates = ()
UNLIMITED_TEXT = "unlimited"
GROUP_PREFIX = "group:"
#: The longest limit name, rate text and group name (the model's columns and
#: ``auth.Group.name``); a subject is at most :data:`ratelimit_app.keys.MAX_VALUE_LENGTH`.
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
        return rates.parse(text)
    except ImproperlyConfigured as exc:
        raise OverrideError("rate", f"{exc} Or 'unlimited'.") from None


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


@dataclass(slots=True)
class LimitOverrides:
    """One limit's overrides, by what they match."""

    #: Values as :func:`ratelimit_app.keys.normalize_value` cleans them, and case folded
    #: (for the email keys, which fold case).
    values: dict[str, Rates] = field(default_factory=dict)
    folded: dict[str, Rates] = field(default_factory=dict)
    #: Networks as the IP keys store an address (masked): a network within one mask is the
    #: masked address its clients are counted under.
    hosts: dict[str, Rates] = field(default_factory=dict)
    #: Wider networks, longest prefix first.
    networks: list[tuple[addresses.IPNetwork, Rates]] = field(default_factory=list)
    groups: dict[str, Rates] = field(default_factory=dict)


#: The user's group names, asked for only when a group override could apply.
GroupNames = Callable[[], Iterable[str]]
#: The signed-in user's username (None: anonymous), asked for user subjects only.
Username = Callable[[], str | None]


@dataclass(slots=True)
class Table:
    """The overrides in force, compiled: answers for a limit and a subject."""

    by_limit: dict[str, LimitOverrides] = field(default_factory=dict)

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
            return _by_address(found, value), False
        if kind in USER_KINDS:
            return _by_user(found, username, groups)
        table = found.folded if keys.is_email_kind(kind) else found.values
        return table.get(value), False


def _by_address(found: LimitOverrides, value: str) -> Rates | None:
    exact = found.hosts.get(value)
    if exact is not None or not found.networks:
        return exact
    address = addresses.parse_address(value)
    for network, rates_ in found.networks:
        if address is not None and address in network:
            return rates_
    return None


def _by_user(
    found: LimitOverrides, username: Username, groups: GroupNames
) -> tuple[Rates | None, bool]:
    name = username() if found.values or found.folded else None
    if name is not None:
        exact = found.values.get(keys.normalize_value("", name) or "")
        if exact is None:
            exact = found.folded.get(keys.normalize_email(name) or "")
        if exact is not None:
            return exact, False
    if not found.groups:
        return None, False
    matched = [found.groups[g] for g in groups() if g in found.groups]
    return (max(matched, key=generosity) if matched else None), True


def compile_table(overrides: Iterable[Override], mask: Callable[[str], str | None]) -> Table:
    """A :class:`Table` of ``overrides`` (later ones replace earlier ones of the same limit
    and subject). ``mask``: how the IP keys store an address
    (:func:`ratelimit_app.identity.addresses.mask_ip`)."""
    table = Table()
    for o in overrides:
        found = table.by_limit.setdefault(o.limit, LimitOverrides())
        kind, value, network = o.subject
        if kind == "group":
            found.groups[value] = o.rates
        elif kind == "value":
            found.values[value] = o.rates
            folded = keys.normalize_email(value)
            if folded is not None:
                found.folded[folded] = o.rates
        elif network is not None:
            _add_network(found, network, o.rates, mask)
    for found in table.by_limit.values():
        found.networks.sort(key=lambda item: -item[0].prefixlen)
    return table


def _add_network(
    found: LimitOverrides,
    network: addresses.IPNetwork,
    rates_: Rates,
    mask: Callable[[str], str | None],
) -> None:
    """A network the IP mask covers whole is one subject (its masked address); a wider one
    is matched by containment."""
    masked = mask(str(network.network_address))
    if masked is not None and masked == mask(str(network.broadcast_address)):
        found.hosts[masked] = rates_
    else:
        found.networks.append((network, rates_))
