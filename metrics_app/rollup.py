"""Downsampling: fold buckets that outlived their tier into the next tier, drop expired ones.

For each tier but the last, finest first, every bucket whose *whole* coarse bucket ended at
least the tier's age ago (:meth:`Retention.fold_cutoff`) is deleted and its count added to
the aligned bucket of the next tier, ``coarse += fine``, in one transaction per batch of
``METRICS_DOWNSAMPLE_BATCH_SIZE`` rows. Buckets of the last tier older than its age are
deleted; ``Series.total`` is untouched, so the all-time total survives.

Why it is exact under concurrency: the fine rows are removed with ``DELETE ... RETURNING``,
and the coarse rows are built from what the DELETE returned, in the same transaction. A
flush that adds to a fine row concurrently either commits before the DELETE takes the row
(its count is returned and folded) or, if the row is gone, inserts a new fine row that the
next run folds ("late writes are folded next run"). On PostgreSQL the fold is one statement
(a data-modifying CTE); on SQLite the rows go through Python (SQLite writes are serialised
anyway).

Idempotent (a second run finds nothing due), catches up (tiers are processed finest first,
so rows folded into tier ``i+1`` are themselves folded further in the same run), and one run
at a time: a lock with a TTL in the cache ``METRICS_LOCK_CACHE``, refreshed every batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.cache import caches
from django.db import connections, transaction

from metrics_app import clock, storage
from metrics_app.conf import conf
from metrics_app.models import Bucket, FlushLedger, Series
from metrics_app.retention import EPOCH_MONDAY

LOCK_KEY = "metrics_app:downsample:lock"

Progress = Callable[[str], None]


@dataclass
class DownsampleResult:
    """What one run did. ``skipped`` means another run held the lock."""

    folded: int = 0
    expired: int = 0
    batches: int = 0
    ledger_pruned: int = 0
    skipped: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "folded": self.folded,
            "expired": self.expired,
            "batches": self.batches,
            "ledger_pruned": self.ledger_pruned,
            "skipped": self.skipped,
        }


class _Lock:
    def __init__(self) -> None:
        self.cache = caches[conf.LOCK_CACHE]
        self.token = uuid.uuid4().hex
        self.ttl = conf.LOCK_TTL

    def acquire(self) -> bool:
        return bool(self.cache.add(LOCK_KEY, self.token, self.ttl))

    def refresh(self) -> None:
        self.cache.touch(LOCK_KEY, self.ttl)

    def release(self) -> None:
        # Only our own lock: after a TTL expiry another run may hold it.
        if self.cache.get(LOCK_KEY) == self.token:
            self.cache.delete(LOCK_KEY)


def downsample(
    *,
    now: float | None = None,
    series_names: Sequence[str] | None = None,
    batch_size: int | None = None,
    progress: Progress | None = None,
) -> DownsampleResult:
    """Fold everything due (for ``series_names``, or every series) as of ``now``."""
    lock = _Lock()
    if not lock.acquire():
        return DownsampleResult(skipped=True)
    try:
        return _downsample(now, series_names, batch_size, progress, lock)
    finally:
        lock.release()


def _downsample(
    now: float | None,
    series_names: Sequence[str] | None,
    batch_size: int | None,
    progress: Progress | None,
    lock: _Lock,
) -> DownsampleResult:
    alias = conf.DATABASE
    now = clock.now() if now is None else now
    retention = conf.RETENTION
    size = batch_size or conf.DOWNSAMPLE_BATCH_SIZE
    result = DownsampleResult()
    series_ids: list[int] | None = None
    if series_names is not None:
        series_ids = list(
            Series.objects.using(alias).filter(name__in=series_names).values_list("id", flat=True)
        )
        if not series_ids:
            return result
    tiers = retention.tiers
    for i, tier in enumerate(tiers):
        last = i == len(tiers) - 1
        cutoff = retention.expiry_cutoff(now) if last else retention.fold_cutoff(i, now)
        coarse = 0 if last else tiers[i + 1].precision
        done_here = 0
        floor: int | None = None  # keyset: batches walk ``start`` upwards
        while True:
            with transaction.atomic(using=alias):
                if last:
                    n, floor = _expire_batch(
                        alias, tier.precision, cutoff, floor, series_ids, size
                    )
                    result.expired += n
                else:
                    n, floor = _fold_batch(
                        alias, tier.precision, coarse, cutoff, floor, series_ids, size
                    )
                    result.folded += n
            done_here += n
            if n:
                result.batches += 1
                lock.refresh()
                if progress is not None:
                    what = "expired" if last else f"folded into {tiers[i + 1]}"
                    progress(f"tier {tier}: {done_here} buckets {what}")
            if n < size:
                break
    if series_ids is None:
        horizon = datetime.fromtimestamp(now, tz=UTC) - timedelta(days=conf.LEDGER_DAYS)
        result.ledger_pruned, _ = (
            FlushLedger.objects.using(alias).filter(created__lt=horizon).delete()
        )
    from metrics_app.signals import downsampled

    downsampled.send(sender=None, result=result)
    return result


def _select_ids(
    qn: Callable[[str], str],
    table: str,
    resolution: int,
    cutoff: int,
    floor: int | None,
    series_ids: list[int] | None,
    size: int,
) -> tuple[str, list[Any]]:
    """The ids of the next batch, oldest first.

    Batches walk ``start`` upwards from the previous batch's last start (keyset pagination):
    re-scanning from the bottom would step over the index entries of every row already
    deleted, which makes a long catch-up quadratic on PostgreSQL.
    """
    sql = f"SELECT {qn('id')} FROM {table} WHERE {qn('resolution')} = %s AND {qn('start')} < %s"
    params: list[Any] = [resolution, cutoff]
    if floor is not None:
        sql += f" AND {qn('start')} >= %s"
        params.append(floor)
    if series_ids is not None:
        sql += f" AND {qn('series_id')} IN ({', '.join(['%s'] * len(series_ids))})"
        params += series_ids
    sql += f" ORDER BY {qn('start')} LIMIT %s"
    return sql, [*params, size]


def _fold_batch(
    alias: str,
    fine: int,
    coarse: int,
    cutoff: int,
    floor: int | None,
    series_ids: list[int] | None,
    size: int,
) -> tuple[int, int | None]:
    connection = connections[alias]
    qn = connection.ops.quote_name
    table = qn(Bucket._meta.db_table)
    select_ids, params = _select_ids(qn, table, fine, cutoff, floor, series_ids, size)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            start = qn("start")
            cursor.execute(
                # = ANY(ARRAY(...)) makes PostgreSQL fetch the batch by primary key instead
                # of hash-joining it against a scan of the whole table.
                f"WITH moved AS (DELETE FROM {table} WHERE {qn('id')} = ANY(ARRAY({select_ids})) "
                f"RETURNING {qn('series_id')}, {start}, {qn('count')}), "
                f"ins AS (INSERT INTO {table} ({qn('series_id')}, {qn('resolution')}, "
                f"{start}, {qn('count')}) "
                f"SELECT {qn('series_id')}, %s, "
                f"{start} - (({start} - {EPOCH_MONDAY}) %% %s), SUM({qn('count')}) "
                f"FROM moved GROUP BY 1, 3 "
                f"ON CONFLICT ({qn('series_id')}, {qn('resolution')}, {start}) "
                f"DO UPDATE SET {qn('count')} = {table}.{qn('count')} + EXCLUDED.{qn('count')}) "
                f"SELECT COUNT(*), MAX({start}) FROM moved",
                [*params, coarse, coarse],
            )
            n, top = cursor.fetchone()
            return int(n), (floor if top is None else int(top))
        cursor.execute(
            f"DELETE FROM {table} WHERE {qn('id')} IN ({select_ids}) "
            f"RETURNING {qn('series_id')}, {qn('start')}, {qn('count')}",
            params,
        )
        moved = cursor.fetchall()
        sums: dict[tuple[int, int], int] = {}
        for series_id, start_s, count in moved:
            key = (series_id, start_s - ((start_s - EPOCH_MONDAY) % coarse))
            sums[key] = sums.get(key, 0) + count
        rows = sorted(sums.items())
        for part in storage.chunks(rows, conf.BATCH_SIZE):
            flat: list[Any] = []
            for (series_id, start_s), count in part:
                flat += [series_id, coarse, start_s, count]
            storage.upsert_buckets(cursor, connection, len(part), flat)
        return len(moved), max((m[1] for m in moved), default=floor)


def _expire_batch(
    alias: str,
    precision: int,
    cutoff: int,
    floor: int | None,
    series_ids: list[int] | None,
    size: int,
) -> tuple[int, int | None]:
    connection = connections[alias]
    qn = connection.ops.quote_name
    table = qn(Bucket._meta.db_table)
    select_ids, params = _select_ids(qn, table, precision, cutoff, floor, series_ids, size)
    with connection.cursor() as cursor:
        match = "= ANY(ARRAY({}))" if connection.vendor == "postgresql" else "IN ({})"
        cursor.execute(
            f"DELETE FROM {table} WHERE {qn('id')} {match.format(select_ids)} "
            f"RETURNING {qn('start')}",
            params,
        )
        starts = [row[0] for row in cursor.fetchall()]
        return len(starts), max(starts, default=floor)
