"""Reading series back: ``series`` (one or, with ``series_many``, several), ``total``, ``top``.

Queries read the database only; call :func:`metrics_app.flush` first to include what this
process still buffers. They read the database the routers choose for the models
(``db_for_read``; the default one without routers).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from django.core.cache import caches
from django.db.models import QuerySet, Sum

from metrics_app import clock
from metrics_app.conf import conf
from metrics_app.models import Bucket, Series
from metrics_app.retention import align

logger = logging.getLogger("metrics_app")

#: Whether a read that finds buckets past their tier sends ``downsample_series`` for the
#: series (:func:`schedule_downsample`); the metrics tests turn it off.
DOWNSAMPLE_ON_READ = True

Point = tuple[datetime, int]


def _seconds(value: datetime, label: str) -> int:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ValueError(f"{label} must be an aware datetime, got {value!r}")
    return int(value.timestamp() // 1)


def series(
    name: str,
    start: datetime,
    end: datetime,
    step: int | timedelta | None = None,
    *,
    now: float | None = None,
) -> list[Point]:
    """Every bucket of ``[start, end)`` as ``(bucket start, count)``, zero-filled.

    ``step`` (seconds or a timedelta) defaults to the finest step stored for the whole range:
    the coarser of what the retention guarantees for ``start`` and the coarsest bucket found.
    Buckets are whole and aligned (weeks on Mondays, UTC): the first may start before
    ``start`` and the last may end after ``end``, and each count covers its whole bucket.
    A period split between a coarse row (older part, folded) and finer rows (younger part)
    is summed whole at the coarse step; at the finer step only the younger part can be
    answered (any range inside the finer tier's age).
    A ``step`` that does not split into the stored buckets (finer than stored for part of
    the range, or not a multiple of the finest tier) raises ``ValueError``.

    ``now`` (Unix seconds; default the clock) is the time the tiers' ages count from: pass the
    time ``start`` and ``end`` were computed from, so a second ticking between the two reads
    cannot move a range across a tier's edge.
    """
    lo, hi = _seconds(start, "start"), _seconds(end, "end")
    if hi <= lo:
        return []
    size = None if step is None else _step_seconds(step, conf.RETENTION.finest.precision)
    fetched = list(
        _rows_near(lo, hi, size)
        .filter(series__name=name)
        .values_list("resolution", "start", "count")
    )
    return _points(name, fetched, lo, hi, size, start, end, now)


def series_many(
    names: Iterable[str],
    start: datetime,
    end: datetime,
    step: int | timedelta | None = None,
    *,
    now: float | None = None,
) -> dict[str, list[Point]]:
    """``{name: series(name, start, end, step)}`` for each of ``names``, read in one query.

    For lists of series (the admin's sparklines). Every name asked gets its points, an unknown
    one zero-filled; without ``step`` each name gets the step :func:`series` would choose for
    it. Raises ``ValueError`` where :func:`series` would.
    """
    wanted = list(dict.fromkeys(names))
    lo, hi = _seconds(start, "start"), _seconds(end, "end")
    if hi <= lo:
        return {name: [] for name in wanted}
    size = None if step is None else _step_seconds(step, conf.RETENTION.finest.precision)
    by_name: dict[str, list[Row]] = {name: [] for name in wanted}
    if wanted:
        for name, resolution, t, count in (
            _rows_near(lo, hi, size)
            .filter(series__name__in=wanted)
            .values_list("series__name", "resolution", "start", "count")
        ):
            by_name[name].append((resolution, t, count))
    return {
        name: _points(name, rows, lo, hi, size, start, end, now) for name, rows in by_name.items()
    }


def _rows_near(lo: int, hi: int, size: int | None) -> QuerySet[Bucket]:
    """Every bucket that may hold part of ``[lo, hi)``: a margin of the coarsest step."""
    margin = max(max(conf.RETENTION.precisions), size or 0)
    return Bucket.objects.filter(start__lt=hi + margin, start__gt=lo - margin)


Row = tuple[int, int, int]


def _points(
    name: str,
    fetched: list[Row],
    lo: int,
    hi: int,
    size: int | None,
    start: datetime,
    end: datetime,
    now: float | None = None,
) -> list[Point]:
    """Zero-filled points of ``[lo, hi)`` from the ``(resolution, start, count)`` rows near it."""
    if now is None:
        now = clock.now()
    # A coarse row may hold only the older part of its period (the younger part is still
    # in finer rows): what it holds ends at ``content_end``, so it only matters to a range
    # that reaches before that.
    ends = {r: conf.RETENTION.content_end(r, now) for r in {r for r, _, _ in fetched}}
    if size is None:
        size, rows = _automatic_step(fetched, lo, hi, ends, now)
    else:
        rows = _reaching(fetched, *_whole(lo, hi, size), ends)
        coarser = sorted({r for r, _, _ in rows if size % r})
        if coarser:
            raise ValueError(
                f"step {size}s is finer than the {coarser[-1]}s buckets stored for part of "
                f"[{start.isoformat()}, {end.isoformat()}) of {name!r}; use a step that is a "
                f"multiple of {coarser[-1]}s"
            )
    sums: dict[int, int] = {}
    for _resolution, t, count in rows:
        key = align(t, size)
        sums[key] = sums.get(key, 0) + count
    if _too_fine(rows, now):
        schedule_downsample(name)
    return [
        (datetime.fromtimestamp(t, tz=UTC), sums.get(t, 0))
        for t in range(*_whole(lo, hi, size), size)
    ]


def _whole(lo: int, hi: int, size: int) -> tuple[int, int]:
    """Buckets are whole: the answer covers [align(lo), end of the bucket holding hi - 1)."""
    return align(lo, size), align(hi - 1, size) + size


def _reaching(rows: list[Row], lo: int, hi: int, ends: dict[int, int | None]) -> list[Row]:
    """The rows whose content reaches into ``[lo, hi)``."""
    found = []
    for row in rows:
        resolution, t, _ = row
        limit = ends[resolution]
        end = t + resolution if limit is None or limit <= t else min(t + resolution, limit)
        if t < hi and end > lo:
            found.append(row)
    return found


def _automatic_step(
    fetched: list[Row], lo: int, hi: int, ends: dict[int, int | None], now: float
) -> tuple[int, list[Row]]:
    """The finest step that covers every row it reaches whole, and those rows."""
    found = {r for r, _, _ in _reaching(fetched, lo, hi, ends)}
    size = max([conf.RETENTION.expected_step(lo, now), *found])
    while True:
        rows = _reaching(fetched, *_whole(lo, hi, size), ends)
        coarser = {r for r, _, _ in rows if size % r}
        if not coarser:
            return size, rows
        # The widened range reaches a coarser row: a step of its own chooses wider, until
        # every row it covers fits whole (each pass only widens; precisions divide).
        size = math.lcm(size, *coarser)


def _step_seconds(step: int | timedelta, finest: int) -> int:
    size = int(step.total_seconds()) if isinstance(step, timedelta) else int(step)
    if size <= 0 or size % finest:
        raise ValueError(
            f"step must be a positive multiple of the finest precision ({finest}s), got {size}s"
        )
    return size


def _too_fine(rows: list[Row], now: float) -> bool:
    """True if some bucket outlived its tier: downsampling is late for this series, so the
    read asks for it (:func:`schedule_downsample`)."""
    retention = conf.RETENTION
    cutoffs = {
        tier.precision: (
            retention.fold_cutoff(i, now)
            if i < len(retention.tiers) - 1
            else retention.expiry_cutoff(now)
        )
        for i, tier in enumerate(retention.tiers)
    }
    return any(t < cutoffs.get(resolution, t) for resolution, t, _ in rows)


def schedule_downsample(name: str) -> None:
    """Send the Celery task ``downsample_series(name)``, at most once a minute per series.

    It is sent from a background thread: a page never waits on the broker. Without Celery
    installed nothing is sent (``manage.py metrics_downsample``, run from cron, does the
    work); nor with :data:`DOWNSAMPLE_ON_READ` off.
    """
    if not DOWNSAMPLE_ON_READ:
        return
    try:
        from metrics_app.tasks import downsample_series, publisher
    except ImportError:  # no Celery (an optional extra): nothing to send to
        return
    if not caches["default"].add(f"metrics_app:scheduled:{name}", 1, 60):
        return
    try:
        publisher.send(downsample_series, (name,))
    except Exception as exc:  # a query must not fail because the broker is down
        logger.warning("metrics: could not schedule downsample_series(%r): %s", name, exc)


def total(name: str) -> int:
    """All-time count of ``name`` (0 for an unknown series); retention never lowers it."""
    value = Series.objects.filter(name=name).values_list("total", flat=True)
    return int(value[0]) if value else 0


def top(n: int, since: datetime | None = None) -> list[tuple[str, int]]:
    """The ``n`` busiest series: by all-time total, or by buckets starting at/after ``since``.

    With ``since``, the answer is exact when ``since`` is aligned to the buckets stored
    around it (a coarse bucket that starts before ``since`` is left out whole).
    """
    if since is None:
        return list(Series.objects.order_by("-total", "name").values_list("name", "total")[:n])
    lo = _seconds(since, "since")
    rows = (
        Bucket.objects.filter(start__gte=lo)
        .values("series__name")
        .annotate(n=Sum("count"))
        .order_by("-n", "series__name")[:n]
    )
    return [(r["series__name"], int(r["n"])) for r in rows]
