"""Downsampling and queries against a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.cache import cache

import metrics_app
from metrics_app import query, rollup, tasks
from metrics_app.models import Bucket, Series
from metrics_app.testing import FrozenClock

pytestmark = [pytest.mark.db_matrix, pytest.mark.django_db]

DAY = 86400


def stored() -> dict[int, int]:
    """Total count per resolution."""
    out: dict[int, int] = {}
    for res, count in Bucket.objects.values_list("resolution", "count"):
        out[res] = out.get(res, 0) + count
    return out


def test_downsample_conserves_sums_and_is_idempotent(clock: FrozenClock) -> None:
    # Three days of minutes, every 7 minutes, count = minute index % 5 + 1.
    expected = 0
    for k in range(0, 3 * 24 * 60, 7):
        metrics_app.record("a", k % 5 + 1, at=clock.t - k * 60)
        expected += k % 5 + 1
    metrics_app.flush()
    first = rollup.downsample(batch_size=50)
    assert first.folded > 0
    assert first.batches > 2
    assert sum(stored().values()) == expected == query.total("a")
    assert set(stored()) == {60, 300, 3600}  # today, yesterday, older
    again = rollup.downsample()
    assert (again.folded, again.expired) == (0, 0)
    # Everything a day old or more is gone from the minute tier.
    minute_starts = Bucket.objects.filter(resolution=60).values_list("start", flat=True)
    assert min(minute_starts) >= clock.t - DAY - 300


def test_catches_up_after_downtime_and_expires_past_the_last_tier(clock: FrozenClock) -> None:
    metrics_app.record("a", 3, at=clock.t - 400 * DAY)  # past the last tier
    metrics_app.record("a", 5, at=clock.t - 100 * DAY)
    metrics_app.record("a", 7, at=clock.t - 10 * DAY)
    metrics_app.flush()
    assert set(stored()) == {60}
    result = rollup.downsample()  # one run: minute -> 5m -> hour -> week, and expiry
    assert result.expired == 1
    assert stored() == {3600: 7, 604800: 5}
    assert query.total("a") == 15  # the all-time total never shrinks
    week = Bucket.objects.get(resolution=604800)
    assert week.start_datetime.weekday() == 0
    assert week.start_datetime.time() == datetime.min.time()


def test_late_writes_are_folded_next_run(clock: FrozenClock) -> None:
    old = clock.t - 3 * DAY
    metrics_app.record("a", 2, at=old)
    metrics_app.flush()
    rollup.downsample()
    metrics_app.record("a", 5, at=old)  # arrives after its hour was folded
    metrics_app.flush()
    assert stored() == {3600: 2, 60: 5}
    rollup.downsample()
    assert stored() == {3600: 7}
    assert Bucket.objects.count() == 1


def test_one_run_at_a_time(clock: FrozenClock) -> None:
    metrics_app.record("a", at=clock.t - 3 * DAY)
    metrics_app.flush()
    cache.add(rollup.LOCK_KEY, "someone-else", 60)
    try:
        assert rollup.downsample().skipped
        assert stored() == {60: 1}
    finally:
        cache.delete(rollup.LOCK_KEY)
    assert rollup.downsample().folded == 2  # minute -> 5 minutes -> hour
    assert stored() == {3600: 1}
    assert cache.get(rollup.LOCK_KEY) is None  # released


def test_downsample_one_series(clock: FrozenClock) -> None:
    for name in ("a", "b"):
        metrics_app.record(name, at=clock.t - 3 * DAY)
    metrics_app.flush()
    rollup.downsample(series_names=["a"])
    assert dict(Bucket.objects.values_list("series__name", "resolution")) == {
        "a": 3600,
        "b": 60,
    }


def test_series_zero_fills_and_picks_the_finest_step(clock: FrozenClock) -> None:
    now = datetime.fromtimestamp(clock.t, tz=UTC)
    metrics_app.record("a", 2, at=now - timedelta(minutes=3))
    metrics_app.record("a", 1, at=now - timedelta(minutes=1))
    metrics_app.flush()
    points = query.series("a", now - timedelta(minutes=5), now)
    assert points == [
        (now - timedelta(minutes=5), 0),
        (now - timedelta(minutes=4), 0),
        (now - timedelta(minutes=3), 2),
        (now - timedelta(minutes=2), 0),
        (now - timedelta(minutes=1), 1),
    ]
    assert query.series("a", now - timedelta(hours=1), now, step=3600) == [
        (now - timedelta(hours=1), 3),
    ]
    assert query.series("a", now - timedelta(hours=1), now + timedelta(hours=1), step=3600)[1] == (
        now,
        0,
    )
    assert query.series("unknown", now - timedelta(minutes=2), now) == [
        (now - timedelta(minutes=2), 0),
        (now - timedelta(minutes=1), 0),
    ]
    assert query.series("a", now, now) == []


def test_series_stitches_tiers_and_refuses_finer_steps(clock: FrozenClock) -> None:
    now = datetime.fromtimestamp(clock.t, tz=UTC)
    metrics_app.record("a", 4, at=now - timedelta(days=10))  # hour tier after downsampling
    metrics_app.record("a", 1, at=now - timedelta(minutes=10))  # minute tier
    metrics_app.flush()
    rollup.downsample()
    points = query.series("a", now - timedelta(days=11), now)
    assert {p[1] for p in points} == {0, 4, 1}
    assert points[1][0] - points[0][0] == timedelta(hours=1)  # default: finest stored
    assert sum(c for _, c in points) == 5
    with pytest.raises(ValueError, match="finer than the 3600s buckets"):
        query.series("a", now - timedelta(days=11), now, step=60)
    with pytest.raises(ValueError, match="multiple of the finest precision"):
        query.series("a", now - timedelta(days=1), now, step=90)
    # The minute tier alone can be read by the minute.
    assert sum(c for _, c in query.series("a", now - timedelta(hours=1), now, step=60)) == 1
    with pytest.raises(ValueError, match="aware"):
        query.series("a", datetime(2024, 1, 1), now)


def test_total_and_top(clock: FrozenClock) -> None:
    now = datetime.fromtimestamp(clock.t, tz=UTC)
    metrics_app.record("a", 5, at=now - timedelta(days=3))
    metrics_app.record("b", 2)
    metrics_app.record("c", 3)
    metrics_app.flush()
    assert query.total("a") == 5
    assert query.total("nope") == 0
    assert query.top(2) == [("a", 5), ("c", 3)]
    assert query.top(5, since=now - timedelta(hours=1)) == [("c", 3), ("b", 2)]


def test_a_query_that_finds_stale_fine_buckets_downsamples_the_series(
    clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, tuple[object, ...]]] = []

    def send(task: Any, args: tuple[object, ...]) -> bool:
        """The publisher and a worker at once: the task runs here, now."""
        sent.append((task.name, args))
        task(*args)
        return True

    monkeypatch.setattr(query, "DOWNSAMPLE_ON_READ", True)  # (the tests' default is off)
    monkeypatch.setattr(tasks.publisher, "send", send)
    now = datetime.fromtimestamp(clock.t, tz=UTC)
    metrics_app.record("a", 3, at=now - timedelta(days=5))
    metrics_app.record("b", 3, at=now - timedelta(days=5))
    metrics_app.flush()
    cache.clear()
    points = query.series("a", now - timedelta(days=6), now, step=3600)
    assert sum(c for _, c in points) == 3
    assert sent == [("metrics_app.downsample_series", ("a",))]
    assert set(Bucket.objects.filter(series__name="a").values_list("resolution", flat=True)) == {
        3600
    }
    assert set(Bucket.objects.filter(series__name="b").values_list("resolution", flat=True)) == {
        60
    }
    assert Series.objects.get(name="a").total == 3


def test_a_period_split_between_a_coarse_row_and_fine_rows(clock: FrozenClock) -> None:
    """Fine buckets fold one by one: a week may be part week row, part hour rows."""
    hour, week = 3600, 7 * DAY

    def at(text: str) -> datetime:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)

    # T0 is Wed 2024-03-06 12:00: hours ending by Sun 2024-02-04 12:00 (31 days ago) fold
    # into the week of Mon 2024-01-29; the 12 hours after it stay hourly.
    monday, split, sunday_end = at("2024-01-29"), at("2024-02-04 12:00"), at("2024-02-05")
    events = {}
    for k in range(7 * 24):
        t = monday + timedelta(hours=k, minutes=30)
        events[t] = k % 3 + 1
        metrics_app.record("a", k % 3 + 1, at=t)
    metrics_app.flush()
    rollup.downsample()
    older = sum(c for t, c in events.items() if t < split)
    younger = {t - timedelta(minutes=30): c for t, c in events.items() if t >= split}
    assert dict(Bucket.objects.filter(resolution=week).values_list("start", "count")) == {
        int(monday.timestamp()): older
    }
    assert {
        datetime.fromtimestamp(s, tz=UTC): c
        for s, c in Bucket.objects.filter(resolution=hour).values_list("start", "count")
    } == younger
    # The week step sums both parts.
    total = sum(events.values())
    assert query.series("a", monday, sunday_end, step=week) == [(monday, total)]
    # Inside the hour tier's age the hour step is exact (the hour rows are all there)...
    now = datetime.fromtimestamp(clock.t, tz=UTC)
    assert query.series("a", now - timedelta(days=31), sunday_end, step=hour) == [
        (split + timedelta(hours=k), younger[split + timedelta(hours=k)]) for k in range(12)
    ]
    # ... and so is the default step there.
    assert query.series("a", now - timedelta(days=31), sunday_end) == query.series(
        "a", now - timedelta(days=31), sunday_end, step=hour
    )
    # Reaching into the folded part at the hour step is refused, not guessed.
    with pytest.raises(ValueError, match="finer than the 604800s buckets"):
        query.series("a", split - timedelta(hours=1), sunday_end, step=hour)
    assert query.series("a", split - timedelta(hours=1), sunday_end)[0] == (monday, total)
    # A late write into the folded part is folded into the week row by the next run.
    metrics_app.record("a", 10, at=split - timedelta(hours=2))
    metrics_app.flush()
    rollup.downsample()
    assert query.series("a", monday, sunday_end, step=week) == [(monday, total + 10)]
    # Six hours later six more hour rows have joined the week row: sums are conserved.
    clock.advance(6 * hour)
    assert rollup.downsample().folded == 6
    assert Bucket.objects.filter(resolution=hour).count() == 6
    assert query.series("a", monday, sunday_end, step=week) == [(monday, total + 10)]
    assert rollup.downsample().folded == 0  # idempotent


def test_a_five_minute_period_split_between_minutes(clock: FrozenClock) -> None:
    clock.advance(120)  # now 12:02: minutes ending by yesterday 12:02 are due
    now = datetime.fromtimestamp(clock.t, tz=UTC)
    five = now - timedelta(days=1, minutes=2)  # yesterday 12:00, a 5-minute boundary
    for k in range(5):
        metrics_app.record("a", k + 1, at=five + timedelta(minutes=k))
    metrics_app.flush()
    assert rollup.downsample().folded == 2
    assert dict(Bucket.objects.values_list("start", "resolution")) == {
        int(five.timestamp()): 300,
        int(five.timestamp()) + 120: 60,
        int(five.timestamp()) + 180: 60,
        int(five.timestamp()) + 240: 60,
    }
    assert query.series("a", five, five + timedelta(minutes=5), step=300) == [(five, 15)]
    assert query.series("a", now - timedelta(days=1), five + timedelta(minutes=5)) == [
        (five + timedelta(minutes=k), k + 1) for k in (2, 3, 4)
    ]
    with pytest.raises(ValueError, match="finer than the 300s buckets"):
        query.series("a", five, five + timedelta(minutes=5), step=60)
