"""Retention parsing and alignment: pure, no database."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metrics_app.retention import (
    DEFAULT_RETENTION,
    Tier,
    align,
    parse_retention,
)


def test_default_retention_tiers() -> None:
    r = parse_retention(DEFAULT_RETENTION)
    assert r.tiers == (
        Tier(60, 1440),
        Tier(300, 576),
        Tier(3600, 744),
        Tier(604800, 52),  # whisper: points = 1y // 1w
    )
    assert str(r) == "1m:1d,5m:2d,1h:31d,1w:52w"


@pytest.mark.parametrize(
    ("text", "precisions"),
    [
        ("60:1440", (60,)),  # bare numbers: seconds and points
        ("1min:1d", (60,)),
        ("1minutes:2h,1hours:2d", (60, 3600)),
        (" 1h:31d , 1m:1d ", (60, 3600)),  # sorted like whisper
        ("1m:1d,1d:1y", (60, 86400)),
    ],
)
def test_parse_valid(text: str, precisions: tuple[int, ...]) -> None:
    assert parse_retention(text).precisions == precisions


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "non-empty"),
        ("1m", "expected 'precision:age'"),
        ("1x:1d", "invalid unit 'x'"),
        ("1mo:1d", "invalid unit 'mo'"),
        ("1.5m:1d", "invalid precision"),
        ("1m:1.5d", "invalid retention"),
        ("1m:30s", "holds no point"),
        ("0:10", "positive"),
        ("1m:1d,1m:2d", "same precision"),
        ("2m:1d,3m:2d", "divide"),
        ("1m:1d,5m:1d", "longer time"),
        ("1m:30m,1h:2d", "30 points, fewer than the 60"),
        ("30s:1d,1m:2d", "whole number of minutes"),
    ],
)
def test_parse_invalid(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_retention(text)


def test_week_buckets_start_monday_midnight_utc() -> None:
    wednesday = datetime(2024, 3, 6, 12, 0, tzinfo=UTC).timestamp()
    start = datetime.fromtimestamp(align(wednesday, 604800), tz=UTC)
    assert start == datetime(2024, 3, 4, tzinfo=UTC)
    assert start.weekday() == 0


def test_fold_cutoff_keeps_a_tier_for_at_least_its_age() -> None:
    r = parse_retention(DEFAULT_RETENTION)
    now = datetime(2024, 3, 6, 12, 2, 30, tzinfo=UTC).timestamp()
    cutoff = r.fold_cutoff(0, now)  # minute buckets fold into 5-minute ones
    # Each minute bucket folds as soon as it ended a day ago, not when its 5 minutes did.
    assert cutoff <= now - 86400 < cutoff + 60
    assert cutoff % 60 == 0
    assert cutoff % 300 != 0  # so this 5-minute period is split
    hour = r.fold_cutoff(2, now)  # hours fold into weeks one by one
    assert hour <= now - 31 * 86400 < hour + 3600
    # What a coarse row holds ends where the finer tier's folds end.
    assert r.content_end(60, now) is None
    assert r.content_end(300, now) == cutoff
    assert r.content_end(604800, now) == hour
    assert r.content_end(7, now) is None  # not a tier (an old retention's rows)
    assert r.expected_step(now - 3600, now) == 60
    assert r.expected_step(now - 40 * 86400, now) == 604800


@given(
    t=st.integers(min_value=0, max_value=4_000_000_000),
    precisions=st.sampled_from([(60, 300, 3600, 604800), (60, 3600, 86400), (120, 86400 * 7)]),
)
def test_alignment_nests(t: int, precisions: tuple[int, ...]) -> None:
    for fine, coarse in itertools.pairwise(precisions):
        f, c = align(t, fine), align(t, coarse)
        assert f <= t < f + fine
        assert c <= f
        assert f + fine <= c + coarse
        assert align(f, coarse) == c
