"""``demo_seed``'s data: a year of synthetic visits to a few links, and how it is written.

The traffic is a model, not a replay: visits per minute follow a daily rhythm (a peak at a
link's own hour, a quiet night), a weekly one (weekends quieter or busier), a year of growth
and, for one link, a launch spike that decays over a few weeks; counts are drawn from a
Poisson distribution around that rate, with a fixed seed per link, so every run draws the
same shapes (relative to now).

It is written the way live traffic is: :func:`metrics_app.record` with ``at=``, one
:func:`metrics_app.flush`, then :func:`metrics_app.rollup.downsample`, which folds what is
old into the coarser tiers. To stay fast, a bucket of history is recorded in one call:
per minute for the last day, per 5 minutes for the day before, per hour before that, which
is what the default retention keeps anyway (about 10,000 calls per link, a second or two in
all).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import transaction

import metrics_app
from demo_site.shortener.models import Link
from metrics_app import clock, rollup
from metrics_app.rollup import DownsampleResult
from metrics_app.testing import manual_flush

MINUTE, HOUR, DAY = 60, 3600, 86400
#: How far back the history goes: the 52 weeks the default retention keeps.
HISTORY = 364 * DAY


@dataclass(frozen=True)
class SeedLink:
    """A seeded link and the shape of its traffic."""

    key: str
    url: str
    #: Visits an hour at the daily peak of an ordinary weekday, today.
    peak_per_hour: float
    #: UTC hour of the daily peak.
    peak_hour: float
    #: Weekend traffic as a share of weekday traffic (above 1: busier on weekends).
    weekend: float
    #: Traffic today as a multiple of traffic a year ago.
    growth: float = 1.5
    #: A launch this many days ago: nine times the traffic at once, decaying over weeks.
    launch_days_ago: float | None = None

    def rate(self, t: float, now: float) -> float:
        """Expected visits per second at Unix time ``t``."""
        hour = (t % DAY) / HOUR
        # A smooth daily wave, narrower than a sine: busy around the peak, quiet at night.
        daily = 0.06 + 0.94 * (0.5 + 0.5 * math.cos(2 * math.pi * (hour - self.peak_hour) / 24))
        daily **= 2
        weekly = self.weekend if datetime.fromtimestamp(t, tz=UTC).weekday() >= 5 else 1.0
        trend = self.growth ** (-(now - t) / HISTORY)
        boost = 1.0
        if self.launch_days_ago is not None:
            launch = now - self.launch_days_ago * DAY
            if t >= launch:
                boost += 8 * math.exp(-(t - launch) / (6 * DAY))
        return self.peak_per_hour / HOUR * daily * weekly * trend * boost


LINKS: tuple[SeedLink, ...] = (
    SeedLink("docs", "https://docs.djangoproject.com/en/stable/", 240, 14, 0.35, growth=1.8),
    SeedLink(
        "launch",
        "https://example.com/blog/introducing-django-bucketry",
        30,
        16,
        0.6,
        launch_days_ago=75,
    ),
    SeedLink("shop", "https://example.com/shop/winter-sale", 120, 20, 1.6, growth=1.3),
    SeedLink("podcast", "https://example.com/podcast/episode-42", 20, 7, 0.5, growth=2.5),
)


@dataclass
class SeedResult:
    """What :func:`seed` did; ``created`` is False when the data was already there."""

    created: bool
    links: list[str] = field(default_factory=list)
    visits: int = 0
    records: int = 0
    downsample: DownsampleResult | None = None


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw: exact (Knuth) for small means, the normal approximation above 30."""
    if mean <= 0:
        return 0
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k


def buckets(start: int, end: int, step: int) -> Iterator[tuple[int, int]]:
    """``(bucket start, seconds of it inside [start, end))`` for ``step``-aligned buckets."""
    t = start - start % step
    while t < end:
        lo, hi = max(t, start), min(t + step, end)
        if hi > lo:
            yield lo, hi - lo
        t += step


def history(link: SeedLink, now: float) -> Iterator[tuple[int, int]]:
    """``(Unix time, visits)`` of the link's year, one pair per bucket recorded: per minute
    for the last day, per 5 minutes for the day before, per hour before that."""
    rng = random.Random(f"django-bucketry demo {link.key}")
    end = int(now) - int(now) % MINUTE  # the current minute is left to live traffic
    by_minute = end - DAY
    by_five = by_minute - DAY - (by_minute - DAY) % HOUR
    for start, stop, step in (
        (end - HISTORY, by_five, HOUR),
        (by_five, by_minute, 5 * MINUTE),
        (by_minute, end, MINUTE),
    ):
        for t, seconds in buckets(start, stop, step):
            count = poisson(rng, link.rate(t + seconds / 2, now) * seconds)
            if count:
                yield t, count


def seed(links: tuple[SeedLink, ...] = LINKS, now: float | None = None) -> SeedResult:
    """Create ``links`` with their history, once: nothing happens if seeded links exist.

    The links and their counts are committed together (one transaction around the flush), so
    a run that fails leaves nothing behind and the next one starts over; the downsample runs
    after the commit (if another run holds its lock, the worker's next run folds the data).
    """
    at = clock.now() if now is None else now
    # No flusher thread while recording: the one flush below writes everything, inside the
    # transaction (a thread would write part of it on a connection of its own).
    with manual_flush(), transaction.atomic():
        if Link.objects.filter(seeded=True).exists():
            return SeedResult(
                created=False,
                links=list(
                    Link.objects.filter(seeded=True).order_by("id").values_list("key", flat=True)
                ),
            )
        result = SeedResult(created=True)
        created = datetime.fromtimestamp(at, tz=UTC) - timedelta(seconds=HISTORY)
        for item in links:
            Link.objects.create(key=item.key, url=item.url, created=created, seeded=True)
            result.links.append(item.key)
            for t, count in history(item, at):
                metrics_app.record(f"shorturl:{item.key}", count, at=t)
                result.visits += count
                result.records += 1
        metrics_app.flush()
    result.downsample = rollup.downsample()
    return result
