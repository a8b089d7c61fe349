# ruff: noqa: PT017  (the property is "this error, or a valid result": asserted in except)
"""Hostile configuration and names, under hypothesis.

The rate parser, the retention parser, rule dicts and metric series names: each input ends
in a clear error (``ImproperlyConfigured`` or ``ValueError`` whose message shows the input)
or in a documented safe result, never in another exception. Key extractors and cache keys
are fuzzed in ``tests/ratelimit/test_hostile.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from metrics_app import buffer
from metrics_app.retention import parse_retention
from ratelimit_app.algorithms import rates
from ratelimit_app.config.rules import RuleError, parse_rule

#: Text that looks like configuration: digits, units, separators, and anything else.
config_text = st.one_of(
    st.text(),
    st.text(alphabet="0123456789smhdwyM/;:,. -x\t\n٣", max_size=30),
    st.from_regex(r"\A\d{1,12}/\d{0,4}[smhdwy]?(;\d{1,4}/\d?[smhd])?\Z"),
)
anything = st.one_of(
    config_text,
    st.none(),
    st.integers(),
    st.floats(),
    st.binary(max_size=20),
    st.tuples(st.integers(), st.integers()),
    st.tuples(st.text(max_size=3), st.integers()),
    st.lists(st.text(max_size=5), max_size=3),
)


@given(anything)
@example("10/M")
@example("3/1.5m")
@example("10 / m")
@example("5/0s")
@example("10/minute")
@example("10/5min;1000/days")
@example("10/Minute")
@example("10/mins")
@example("10/ms")
def test_rate_parser(value: Any) -> None:
    try:
        # parse() takes strings; normalize() is the entry point for any configured value.
        parsed = rates.normalize(value)
    except ImproperlyConfigured as exc:
        assert repr(value)[:40] in str(exc)[:200] or str(value)[:40] in str(exc)
        return
    assert parsed and all(isinstance(r, rates.Rate) for r in parsed)
    for rate in parsed:
        assert 0 <= rate.count <= rates.MAX_COUNT and rate.seconds > 0


def test_rate_with_a_huge_count() -> None:
    with pytest.raises(ImproperlyConfigured, match="the count must be"):
        rates.parse("1" * 5000 + "/s")
    with pytest.raises(ImproperlyConfigured, match="the period must be"):
        rates.parse("1/" + "9" * 5000 + "s")


@given(anything)
@example("1m:1d,5m:2d,1h:31d,1w:1y")
@example("1m:1d,1m:2d")
@example("7s:1d,1m:2d")
@example("1m:0d")
@example("99999999999999y:1y")
def test_retention_parser(value: Any) -> None:
    try:
        retention = parse_retention(value)
    except ValueError as exc:
        assert str(exc)
        return
    assert retention.tiers and all(t.precision > 0 for t in retention.tiers)


rule_fields = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.text(max_size=10), st.integers(), st.none()),
        "path": st.one_of(st.text(max_size=10), st.lists(st.text(max_size=5), max_size=2)),
        "url_name": st.one_of(st.text(max_size=8), st.integers()),
        "methods": st.one_of(st.text(max_size=6), st.lists(st.text(max_size=6), max_size=2)),
        "key": st.one_of(
            st.sampled_from(["ip", "user", "email", "header:x-api-key", "get:q", "device"]),
            st.text(max_size=12),
            st.integers(),
        ),
        "rate": anything,
        "count": st.one_of(st.sampled_from(["all", "failures"]), st.text(max_size=5)),
        "block": st.one_of(st.booleans(), st.integers(), st.text(max_size=3)),
        "fail_open": st.one_of(st.booleans(), st.none()),
        "algorithm": st.one_of(
            st.sampled_from(["sliding_window", "leaky_bucket"]), st.text(max_size=5)
        ),
        "burst": st.one_of(st.integers(), st.floats(), st.text(max_size=3), st.none()),
        "extra": st.integers(),
    },
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(rule_fields, anything))
@example({"name": "x", "path": "/", "key": "ip", "rate": "5/m"})
@example({"name": "x", "path": "/", "key": "ip", "rate": "5/m", "burst": True})
@example({"name": "x", "path": "/", "key": "nonsense", "rate": "5/m"})
@example({"name": "x", "path": "/", "key": "ip", "rate": "no.such.module.rate"})
def test_rule_dicts(raw: Any) -> None:
    try:
        rule = parse_rule(raw)
    except RuleError as exc:  # an ImproperlyConfigured naming the rule and the field
        assert isinstance(exc, ImproperlyConfigured)
        assert exc.field in str(exc) and str(exc).startswith("RATELIMIT_RULES rule ")
        return
    assert isinstance(raw, dict) and rule.name == raw["name"]


names = st.one_of(
    st.text(max_size=250),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=195, max_size=205),
    st.binary(max_size=10),
    st.integers(),
    st.none(),
)


@given(names)
@example("")
@example("x" * 200)
@example("x" * 201)
@example("shorturl:\u202eabc")
@example("nul\x00")
@example("\ud800")
def test_series_names_are_accepted_or_refused_clearly(name: Any) -> None:
    buffer.reset()
    try:
        buffer.record(name, at=1_700_000_000)
    except ValueError as exc:
        if "NUL or lone surrogates" in str(exc):
            assert "\x00" in name or any(0xD800 <= ord(c) <= 0xDFFF for c in name)
        else:
            assert "metric names are strings of 1 to 200 characters" in str(exc)
            assert not (type(name) is str and 0 < len(name) <= buffer.MAX_NAME_LENGTH)
        return
    finally:
        buffer.reset()
    assert type(name) is str and 0 < len(name) <= buffer.MAX_NAME_LENGTH
    assert "\x00" not in name and not any(0xD800 <= ord(c) <= 0xDFFF for c in name)


@pytest.mark.django_db
@pytest.mark.db_matrix
@pytest.mark.parametrize("name", ["nul\x00in the name", "\ud800 lone surrogate"])
def test_a_name_the_database_refuses_never_blocks_the_buffer(name: str) -> None:
    """A name no database can store (NUL on PostgreSQL, lone surrogates everywhere) would fail
    its flush batch, which is retried before all others: record() refuses it instead."""
    from metrics_app.models import Series

    buffer.reset()
    try:
        # Refused where it is recorded, so it never reaches (and never blocks) a flush.
        with pytest.raises(ValueError, match="NUL or lone surrogates"):
            buffer.record(name, at=1_700_000_000)
        buffer.record("after:the-bad-name", at=1_700_000_000)
        buffer.flush(raise_errors=False)
        assert Series.objects.filter(name="after:the-bad-name").exists()
    finally:
        buffer.reset()
