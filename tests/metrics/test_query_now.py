"""``query.series(..., now=...)``: the tiers' ages count from the caller's time."""

from __future__ import annotations

import pytest

import metrics_app
from metrics_app import query
from metrics_app.admin import PERIODS
from metrics_app.testing import FrozenClock

pytestmark = pytest.mark.django_db


def test_a_second_ticking_between_bounds_and_query_keeps_the_step(clock: FrozenClock) -> None:
    clock.set(1_800_000_000.25)
    metrics_app.record("ticks", 3)
    metrics_app.flush()
    day = next(p for p in PERIODS if p.key == "24h")
    now = clock.t
    start, end = day.bounds(now)
    clock.advance(1.5)  # a slow request: the clock moved on since the bounds were taken
    with_now = query.series("ticks", start, end, now=now)
    assert step(with_now) == 60  # one-minute buckets, as the bounds meant
    assert sum(count for _, count in with_now) == 3
    drifted = query.series("ticks", start, end)
    assert step(drifted) == 300  # without it, the range starts in the 5-minute tier


def step(points: list[query.Point]) -> float:
    return (points[1][0] - points[0][0]).total_seconds()
