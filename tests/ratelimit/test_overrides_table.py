"""The compiled table of overrides (issue 35): networks looked up by prefix length, whatever
their number; user names matched as Django's authentication matches them; and the table
changed in place one override at a time (``put`` / ``drop``), each change bumping its
version. Pure: no database, no server."""

from __future__ import annotations

import ipaddress
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_app.algorithms.rates import Rate
from ratelimit_app.identity.addresses import mask_ip
from ratelimit_app.overrides import table as overrides
from ratelimit_app.overrides.table import UNLIMITED

R1, R2, R3 = (Rate(1, 60),), (Rate(2, 60),), (Rate(3, 60),)


def rule(limit: str, subject: str, rate: str) -> overrides.Override:
    return overrides.parse(limit, subject, rate)


def ask(
    table: overrides.Table, limit: str, kind: str, value: str, username: str | None = None
) -> Any:
    return table.lookup(limit, kind, value, lambda: username, lambda: ("premium",))[0]


def subject(text: str) -> overrides.Subject:
    return overrides.parse_subject(text)


# -- item 5: networks by prefix length -------------------------------------------------------


def test_a_thousand_networks_are_not_scanned() -> None:
    """An address no override names costs one dictionary look-up per prefix length, not a
    containment test per network."""
    rows = [rule("login", f"10.{i // 256}.{i % 256}.0/24", "50/m") for i in range(1000)]
    rows.append(rule("login", "10.0.0.0/8", "5/m"))
    table = overrides.compile_table(rows, mask_ip)
    contains = mock.patch.object(
        ipaddress.IPv4Network, "__contains__", side_effect=AssertionError("scanned")
    )
    with contains:
        assert ask(table, "login", "ip", "198.51.100.7") is None
        assert ask(table, "login", "ip", "10.3.231.9") == (Rate(50, 60),)
        assert ask(table, "login", "ip", "10.200.0.1") == (Rate(5, 60),)
        assert ask(table, "login", "ip", "::ffff:10.3.231.9") == (Rate(50, 60),)
    assert len(table.by_limit["login"].networks[32]) == 2  # two prefix lengths: two probes


def _brute(rows: list[tuple[str, Any]], value: str) -> Any:
    """The longest network holding ``value``, by containment (what the index must equal)."""
    address = ipaddress.ip_address(value)
    holding = [(net, r) for net, r in rows if address in ipaddress.ip_network(net)]
    return (
        max(holding, key=lambda item: ipaddress.ip_network(item[0]).prefixlen)[1]
        if holding
        else None
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 31)), max_size=12),
    st.integers(0, 2**32 - 1),
)
def test_the_longest_prefix_wins_as_containment_says(
    networks: list[tuple[int, int]], number: int
) -> None:
    rows = []
    for i, (base, prefix) in enumerate(networks):
        net = ipaddress.IPv4Network((base, prefix), strict=False)
        rows.append((str(net), (Rate(i + 1, 60),)))
    wanted = {net: r for net, r in rows}  # later ones replace earlier ones
    table = overrides.Table()
    for net, r in rows:
        table.put(overrides.Override("x", subject(net), r), mask_ip)
    value = str(ipaddress.IPv4Address(number))
    assert ask(table, "x", "ip", value) == _brute(list(wanted.items()), value)


def test_ipv6_networks_and_hosts() -> None:
    table = overrides.compile_table(
        [
            rule("x", "2001:db8::/32", "1/m"),
            rule("x", "2001:db8:ab::/48", "2/m"),
            rule("x", "2001:db8:ab:cd::/64", "3/m"),  # the IP keys' mask: a host
            rule("x", "0.0.0.0/0", "unlimited"),
        ],
        mask_ip,
    )
    assert ask(table, "x", "ip", "2001:db8:ab:cd::") == R3
    assert ask(table, "x", "ip", "2001:db8:ab:ce::") == R2
    assert ask(table, "x", "ip", "2001:db8:ff::") == R1
    assert ask(table, "x", "ip", "2001:db9::") is None  # an IPv4 network holds no IPv6 one
    assert ask(table, "x", "ip", "192.0.2.1") == UNLIMITED


# -- item 8: user names are matched as Django's authentication matches them -------------------


def test_a_username_is_matched_exactly_emails_ignore_case() -> None:
    table = overrides.compile_table(
        [rule("api", "partner", "10000/h"), rule("signup", "Partner@Example.com", "9/m")],
        mask_ip,
    )
    assert ask(table, "api", "user", "3", "partner") == (Rate(10000, 3600),)
    assert ask(table, "api", "user", "4", "PARTNER") is None
    assert ask(table, "api", "user_or_ip", "4", "Partner") is None
    assert ask(table, "api", "user", "5", " partner\u200b") == (Rate(10000, 3600),)  # cleaned
    assert ask(table, "signup", "email", "partner@example.com") == (Rate(9, 60),)


# -- item 10: put and drop -------------------------------------------------------------------


def test_put_adds_and_replaces_and_bumps_the_version() -> None:
    table = overrides.Table()
    assert not table and table.version == 0
    table.put(rule("api", "partner", "1/m"), mask_ip)
    assert table and table.version == 1
    assert ask(table, "api", "user", "3", "partner") == R1
    table.put(rule("api", " partner ", "2/m"), mask_ip)
    assert ask(table, "api", "user", "3", "partner") == R2
    assert table.version == 2
    assert list(table.by_limit["api"].values) == ["partner"]


def test_drop_removes_one_and_the_empty_limit() -> None:
    table = overrides.compile_table(
        [rule("api", "partner", "1/m"), rule("api", "group:premium", "2/m")], mask_ip
    )
    version = table.version
    assert table.drop("api", subject("partner"))
    assert table.version == version + 1
    assert ask(table, "api", "user", "3", "partner") == R2  # the group's, now
    assert not table.drop("api", subject("partner"))  # no more: nothing changes
    assert not table.drop("other", subject("partner"))
    assert table.version == version + 1
    assert table.drop("api", subject("group:premium"))
    assert "api" not in table.by_limit and not table


def test_networks_come_and_go_with_their_prefix_length() -> None:
    table = overrides.compile_table(
        [rule("x", "10.0.0.0/8", "1/m"), rule("x", "10.1.0.0/16", "2/m")], mask_ip
    )
    assert ask(table, "x", "ip", "10.1.2.3") == R2
    assert table.drop("x", subject("10.1.0.0/16"))
    assert ask(table, "x", "ip", "10.1.2.3") == R1
    assert len(table.by_limit["x"].networks[32]) == 1
    assert not table.drop("x", subject("10.2.0.0/16"))  # a length present, no such network
    table.put(rule("x", "10.1.2.0/24", "3/m"), mask_ip)
    assert ask(table, "x", "ip", "10.1.2.3") == R3
    assert table.drop("x", subject("10.0.0.0/8")) and table.drop("x", subject("10.1.2.0/24"))
    assert not table


def test_hosts_shared_by_two_subjects() -> None:
    # Two subjects inside one /64 name the one masked address: the last put applies, and
    # dropping it brings back the other's.
    table = overrides.Table()
    table.put(rule("x", "2001:db8::1", "1/m"), mask_ip)
    table.put(rule("x", "2001:db8::/96", "2/m"), mask_ip)
    assert ask(table, "x", "ip", "2001:db8::") == R2
    assert table.drop("x", subject("2001:db8::/96"))
    assert ask(table, "x", "ip", "2001:db8::") == R1
    table.put(rule("x", "2001:db8::/96", "3/m"), mask_ip)
    table.put(rule("x", "2001:db8::1", "1/m"), mask_ip)  # put again: the last again
    assert ask(table, "x", "ip", "2001:db8::") == R1
    assert table.drop("x", subject("2001:db8::1"))
    assert ask(table, "x", "ip", "2001:db8::") == R3
    assert table.drop("x", subject("2001:db8::/96"))
    assert ask(table, "x", "ip", "2001:db8::") is None and not table


def test_values_and_their_folded_form() -> None:
    table = overrides.Table()
    table.put(rule("signup", "Alice@Example.com", "1/m"), mask_ip)
    table.put(rule("signup", "alice@example.com", "2/m"), mask_ip)
    assert ask(table, "signup", "email", "alice@example.com") == R2
    assert ask(table, "signup", "header:x-key", "Alice@Example.com") == R1
    assert table.drop("signup", subject("alice@example.com"))
    assert ask(table, "signup", "email", "alice@example.com") == R1  # the other's, folded
    assert ask(table, "signup", "header:x-key", "alice@example.com") is None
    assert table.drop("signup", subject("Alice@Example.com"))
    assert ask(table, "signup", "email", "alice@example.com") is None and not table


def test_groups() -> None:
    table = overrides.Table()
    table.put(rule("api", "group:premium", "1/m"), mask_ip)
    assert ask(table, "api", "user", "3", "bob") == R1
    table.put(rule("api", "group:premium", "unlimited"), mask_ip)
    assert ask(table, "api", "user", "3", "bob") == UNLIMITED
    assert table.drop("api", subject("group: premium"))
    assert ask(table, "api", "user", "3", "bob") is None


def test_compile_table_is_puts_in_order() -> None:
    rows = [rule("x", "10.0.0.0/8", "1/m"), rule("x", "10.0.0.0/8", "2/m"), rule("x", "a", "3/m")]
    compiled = overrides.compile_table(rows, mask_ip)
    assert ask(compiled, "x", "ip", "10.9.9.9") == R2
    assert ask(compiled, "x", "header:h", "a") == R3


def test_a_network_put_again_under_another_mask_moves() -> None:
    """A host under one IPv6 mask is a wider network under a finer one: put again, it is
    looked up where the new mask puts it, and found nowhere else."""

    def exact(ip: str) -> str | None:  # a mask of /128: every address its own subject
        return str(ipaddress.ip_address(ip))

    table = overrides.Table()
    table.put(rule("x", "2001:db8::/96", "1/m"), mask_ip)
    assert ask(table, "x", "ip", "2001:db8::") == R1
    table.put(rule("x", "2001:db8::/96", "2/m"), exact)
    assert ask(table, "x", "ip", "2001:db8::5") == R2
    assert "2001:db8::" not in table.by_limit["x"].hosts
    table.put(rule("x", "2001:db8::/96", "3/m"), mask_ip)
    assert ask(table, "x", "ip", "2001:db8::") == R3 and not table.by_limit["x"].networks
    assert table.drop("x", subject("2001:db8::/96")) and not table


# -- item 4: a request whose subjects no override names passes by the table ----------------


def _recount(table: overrides.Table) -> dict[str, int]:
    """What :attr:`Table.known` must hold: every key of every limit's exact tables, with the
    number of tables holding it."""
    found: dict[str, int] = {}
    for limit in table.by_limit.values():
        for exact in (limit.values, limit.folded, limit.hosts):
            for key in exact:
                found[key] = found.get(key, 0) + 1
    return found


_SUBJECTS = [
    "partner",
    "Alice@Example.org",
    "alice@example.org",
    "192.0.2.7",
    "2001:db8::1",
    "2001:db8::2",  # the same masked host as ::1 (one /64)
    "2001:db8::/64",
    "198.51.100.0/24",
    "10.0.0.0/8",
    "group:premium",
]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.sampled_from(["a", "b"]), st.sampled_from(_SUBJECTS)),
        max_size=30,
    )
)
def test_known_counts_every_exact_key_through_puts_and_drops(
    changes: list[tuple[bool, str, str]],
) -> None:
    """Whatever puts and drops (subjects sharing a key, the same network twice, drops of
    what is not there), :attr:`Table.known` holds exactly the keys of the exact tables, and
    :attr:`Table.asks` holds ``ip`` exactly while some limit has a wider network."""
    table = overrides.Table()
    for put, limit, text in changes:
        if put:
            table.put(rule(limit, text, "5/m"), mask_ip)
        else:
            table.drop(limit, subject(text))
        assert table.known == _recount(table)
        wide = any(found.networks for found in table.by_limit.values())
        assert ("ip" in table.asks) is wide
        assert table.asks >= overrides.USER_KINDS


def test_a_value_no_override_names_is_not_known() -> None:
    table = overrides.compile_table(
        [rule("x", "192.0.2.7", "1/m"), rule("y", "Alice@Example.org", "1/m")], mask_ip
    )
    assert "192.0.2.7" in table.known and "alice@example.org" in table.known
    assert "192.0.2.8" not in table.known and "ip" not in table.asks
