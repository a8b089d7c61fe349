"""``manage.py demo_seed``: a year of visits through record/flush/downsample, once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db.models import Sum
from django.test import Client

from demo_site.shortener import seed
from demo_site.shortener.models import Link
from metrics_app import query
from metrics_app.conf import conf
from metrics_app.models import Bucket, Series
from metrics_app.testing import frozen_clock

#: A Sunday afternoon, UTC.
NOW = datetime(2026, 11, 22, 13, 5, 30, tzinfo=UTC)
KEYS = [link.key for link in seed.LINKS]


def run_seed() -> str:
    out = StringIO()
    call_command("demo_seed", stdout=out)
    return out.getvalue()


@pytest.fixture
def seeded() -> str:
    with frozen_clock(NOW):
        return run_seed()


def test_every_link_has_every_tier(seeded: str) -> None:
    assert f"Seeded {len(KEYS)} links" in seeded
    assert "Downsampled:" in seeded
    assert list(Link.objects.filter(seeded=True).order_by("id").values_list("key", flat=True)) == (
        KEYS
    )
    precisions = set(conf.RETENTION.precisions)
    assert precisions == {60, 300, 3600, 604800}
    for key in KEYS:
        stored = set(
            Bucket.objects.filter(series__name=f"shorturl:{key}").values_list(
                "resolution", flat=True
            )
        )
        assert stored == precisions, key


def test_nothing_is_left_to_fold_and_sums_are_whole(seeded: str) -> None:
    now = NOW.timestamp()
    retention = conf.RETENTION
    for i, tier in enumerate(retention.tiers[:-1]):
        cutoff = retention.fold_cutoff(i, now)
        assert not Bucket.objects.filter(resolution=tier.precision, start__lt=cutoff).exists()
    for series in Series.objects.all():
        in_buckets = Bucket.objects.filter(series=series).aggregate(n=Sum("count"))["n"]
        assert in_buckets == series.total > 0


def test_the_traffic_has_daily_and_weekly_rhythms(seeded: str) -> None:
    """docs: busy weekday afternoons, quiet nights and weekends."""
    with frozen_clock(NOW):
        hours = query.series("shorturl:docs", NOW - timedelta(days=28), NOW)
    assert len(hours) == 28 * 24 + 1
    by_hour = [0] * 24
    weekday = weekend = 0
    for start, count in hours:
        by_hour[start.hour] += count
        if start.weekday() < 5:
            weekday += count
        else:
            weekend += count
    assert by_hour[14] > 5 * by_hour[2]  # the afternoon peak against the night
    assert weekday / 20 > 2 * weekend / 8  # a weekday is busier than a weekend day


def test_every_chart_period_has_data(seeded: str) -> None:
    client = Client()
    with frozen_clock(NOW):
        for period in ("24h", "7d", "30d", "1y"):
            page = client.get(f"/links/docs/?period={period}").content.decode()
            assert "No data" not in page, period
            assert "visits in" in page


def test_a_second_run_adds_nothing(seeded: str) -> None:
    totals = dict(Series.objects.values_list("name", "total"))
    rows = Bucket.objects.count()
    with frozen_clock(NOW + timedelta(minutes=5)):
        again = run_seed()
    assert "already seeded" in again
    assert dict(Series.objects.values_list("name", "total")) == totals
    assert Bucket.objects.count() == rows
    assert Link.objects.count() == len(KEYS)


def test_the_same_shapes_every_run() -> None:
    link = seed.LINKS[0]
    now = NOW.timestamp()
    first = list(seed.history(link, now))
    assert first == list(seed.history(link, now))
    times = [t for t, _ in first]
    assert times == sorted(times)
    assert times[0] >= now - seed.HISTORY - 3600
    assert times[-1] < now - now % 60  # the current minute is left to live traffic


def test_buckets_cover_the_range_once() -> None:
    assert list(seed.buckets(90, 400, 100)) == [(90, 10), (100, 100), (200, 100), (300, 100)]
    assert list(seed.buckets(100, 100, 60)) == []
