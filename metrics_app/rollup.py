"""Downsampling: fold buckets that outlived their tier into the next tier, drop expired ones.

For each tier but the last, finest first, every bucket that *itself* ended at least the
tier's age ago (:meth:`Retention.fold_cutoff`) is deleted and its count added to the aligned
bucket of the next tier, ``coarse += fine``, in one transaction per batch of at most
:data:`DOWNSAMPLE_BATCH_SIZE` rows. The rest of that coarse period may still be stored
at the fine precision (a *split* period: older part coarse, younger part fine); queries
stitch the two (:func:`metrics_app.query.series`). Buckets of the last tier older than its
age are deleted; ``Series.total`` is untouched, so the all-time total survives.

Why it is exact under concurrency: the fine rows are removed with ``DELETE ... RETURNING``,
and the coarse rows are built from what the DELETE returned, in the same transaction. A
flush that adds to a fine row concurrently either commits before the DELETE takes the row
(its count is returned and folded) or, if the row is gone, inserts a new fine row that the
next run folds ("late writes are folded next run").

On PostgreSQL a batch is set-based: one data-modifying CTE per range of ``start`` for all
series at once (:func:`_pg_batches`). On any other database (SQLite) a batch is the ids of the
next due rows, deleted with ``RETURNING`` and summed in Python (:func:`_batches_by_id`);
SQLite serialises writes anyway.

Idempotent (a second run finds nothing due), catches up (tiers are processed finest first,
so rows folded into tier ``i+1`` are themselves folded further in the same run), and one run
at a time: a lock with a TTL in Django's ``"default"`` cache, refreshed every batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.cache import caches
from django.db import connections, router, transaction

from metrics_app import clock, storage
from metrics_app.conf import conf
from metrics_app.models import Bucket, FlushLedger, Series
from metrics_app.retention import EPOCH_MONDAY, align
from metrics_app.signals import downsampled

LOCK_KEY = "metrics_app:downsample:lock"
#: Seconds the lock lives without a refresh (each batch refreshes it): how long a crashed
#: run keeps the next one out.
LOCK_TTL = 600
#: Fine rows folded (at most) per transaction; on PostgreSQL a batch is a range of bucket
#: starts, never less than one start of every series.
DOWNSAMPLE_BATCH_SIZE = 20_000
#: Days flush-ledger rows are kept: a batch queued longer (a database down for a week) could
#: be counted twice if its first commit had in fact succeeded.
LEDGER_DAYS = 7

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
        self.cache = caches["default"]
        self.token = uuid.uuid4().hex
        self.ttl = LOCK_TTL

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


@dataclass(frozen=True)
class _Sweep:
    """One tier's pass over database ``alias``: what is due, where it goes, how much at once.

    Rows of resolution ``fine`` starting before ``cutoff`` are folded into buckets of
    ``coarse`` seconds, or deleted when ``coarse`` is 0 (past the last tier); at most
    ``size`` rows per transaction; only the rows of ``series_ids`` when it is not None.
    """

    alias: str
    fine: int
    coarse: int
    cutoff: int
    series_ids: tuple[int, ...] | None
    size: int


def _downsample(
    now: float | None,
    series_names: Sequence[str] | None,
    batch_size: int | None,
    progress: Progress | None,
    lock: _Lock,
) -> DownsampleResult:
    alias = router.db_for_write(Bucket)
    now = clock.now() if now is None else now
    retention = conf.RETENTION
    size = batch_size or DOWNSAMPLE_BATCH_SIZE
    result = DownsampleResult()
    series_ids: tuple[int, ...] | None = None
    if series_names is not None:
        series_ids = tuple(
            Series.objects.using(alias).filter(name__in=series_names).values_list("id", flat=True)
        )
        if not series_ids:
            return result
    tiers = retention.tiers
    batches_of = _pg_batches if connections[alias].vendor == "postgresql" else _batches_by_id
    for i, tier in enumerate(tiers):
        last = i == len(tiers) - 1
        sweep = _Sweep(
            alias=alias,
            fine=tier.precision,
            coarse=0 if last else tiers[i + 1].precision,
            cutoff=retention.expiry_cutoff(now) if last else retention.fold_cutoff(i, now),
            series_ids=series_ids,
            size=size,
        )
        what = "expired" if last else f"folded into {tiers[i + 1]}"
        done_here = 0
        for n in batches_of(sweep):
            if last:
                result.expired += n
            else:
                result.folded += n
            done_here += n
            result.batches += 1
            lock.refresh()
            if progress is not None:
                progress(f"tier {tier}: {done_here} buckets {what}")
    if series_ids is None:
        horizon = datetime.fromtimestamp(now, tz=UTC) - timedelta(days=LEDGER_DAYS)
        result.ledger_pruned, _ = (
            FlushLedger.objects.using(alias).filter(created__lt=horizon).delete()
        )
        storage.expire_tops(using=alias)  # (also at each flush that writes top keys)
    downsampled.send(sender=None, result=result)
    return result


def _batches_by_id(sweep: _Sweep) -> Iterator[int]:
    """Any database: each batch deletes the ids of the next ``size`` due rows, oldest first,
    and (when folding) adds up their counts in Python, one transaction per batch."""
    floor: int | None = None  # keyset: batches walk ``start`` upwards
    while True:
        with transaction.atomic(using=sweep.alias):
            n, floor = _batch_by_id(sweep, floor)
        if n:
            yield n
        if n < sweep.size:
            return


def _pg_batches(sweep: _Sweep) -> Iterator[int]:
    """Set-based PostgreSQL path: one statement per batch, a batch is a range of ``start``.

    A batch takes every due row of ``fine`` resolution whose start lies in ``[lo, hi)``, for
    all series at once, in one data-modifying CTE: ``DELETE ... RETURNING`` feeds
    ``INSERT ... SELECT ... GROUP BY (series, coarse start) ON CONFLICT DO UPDATE SET
    count = count + EXCLUDED.count`` (or, past the last tier, just the ``DELETE``).

    ``hi`` bounds the transaction: it is the start of the ``size + 1``-th due row from
    ``lo`` (an index-only walk of ``(resolution, start)``), so a batch holds at most ``size``
    rows, or the rows of one single ``start`` when that many series share it. The bound is
    read first and passed as a constant, so the ``DELETE`` is a plain index range scan, and
    the next batch starts at ``hi`` (no re-scan of deleted index entries).
    """
    fine, coarse, cutoff = sweep.fine, sweep.coarse, sweep.cutoff
    connection = connections[sweep.alias]
    qn = connection.ops.quote_name
    table = qn(Bucket._meta.db_table)
    start, sid, cnt, res = qn("start"), qn("series_id"), qn("count"), qn("resolution")
    only = "" if sweep.series_ids is None else f" AND {sid} = ANY(%s)"
    # A list, which the driver sends as an array (a tuple would be a row).
    only_params: list[Any] = [] if sweep.series_ids is None else [list(sweep.series_ids)]
    due = f"FROM {table} WHERE {res} = %s AND {start} >= %s AND {start} < %s{only}"
    first = f"SELECT MIN({start}) {due}"
    bound = f"SELECT {start} {due} ORDER BY {start} OFFSET %s LIMIT 1"
    delete = f"DELETE {due}"
    if coarse:
        # The coarse start is retention.align(start, coarse), in SQL: every start lies after
        # EPOCH_MONDAY, where SQL's % (which truncates) and Python's (which floors) agree.
        statement = (
            f"WITH moved AS ({delete} RETURNING {sid}, {start}, {cnt}), "
            f"ins AS (INSERT INTO {table} ({sid}, {res}, {start}, {cnt}) "
            f"SELECT {sid}, %s, {start} - (({start} - {EPOCH_MONDAY}) %% %s), SUM({cnt}) "
            f"FROM moved GROUP BY 1, 3 "
            f"ON CONFLICT ({sid}, {res}, {start}) "
            f"DO UPDATE SET {cnt} = {table}.{cnt} + EXCLUDED.{cnt}) "
            f"SELECT COUNT(*) FROM moved"
        )
        extra: list[Any] = [coarse, coarse]
    else:
        statement, extra = delete, []
    with connection.cursor() as cursor:
        cursor.execute(first, [fine, -(2**62), cutoff, *only_params])
        (lo,) = cursor.fetchone()
        while lo is not None and lo < cutoff:
            cursor.execute(bound, [fine, lo, cutoff, *only_params, sweep.size])
            row = cursor.fetchone()
            # ``lo`` and ``cutoff`` are multiples of ``fine``: lo + fine <= cutoff.
            hi = cutoff if row is None else max(int(row[0]), lo + fine)
            with transaction.atomic(using=sweep.alias):
                cursor.execute(statement, [fine, lo, hi, *only_params, *extra])
                n = int(cursor.fetchone()[0]) if coarse else cursor.rowcount
            if n:
                yield n
            lo = hi


def _select_ids(
    sweep: _Sweep, qn: Callable[[str], str], table: str, floor: int | None
) -> tuple[str, list[Any]]:
    """The ids of the next batch, oldest first.

    Batches walk ``start`` upwards from the previous batch's last start (keyset pagination):
    re-scanning from the bottom would step over the index entries of every row already
    deleted, which makes a long catch-up quadratic on PostgreSQL.
    """
    sql = f"SELECT {qn('id')} FROM {table} WHERE {qn('resolution')} = %s AND {qn('start')} < %s"
    params: list[Any] = [sweep.fine, sweep.cutoff]
    if floor is not None:
        sql += f" AND {qn('start')} >= %s"
        params.append(floor)
    if sweep.series_ids is not None:
        sql += f" AND {qn('series_id')} IN ({', '.join(['%s'] * len(sweep.series_ids))})"
        params += sweep.series_ids
    sql += f" ORDER BY {qn('start')} LIMIT %s"
    return sql, [*params, sweep.size]


def _batch_by_id(sweep: _Sweep, floor: int | None) -> tuple[int, int | None]:
    """Delete the next batch of due rows, and fold them when ``sweep.coarse`` is set.

    Returns the rows taken and the greatest start among them (the next batch's floor).
    """
    connection = connections[sweep.alias]
    qn = connection.ops.quote_name
    table = qn(Bucket._meta.db_table)
    select_ids, params = _select_ids(sweep, qn, table, floor)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table} WHERE {qn('id')} IN ({select_ids}) "
            f"RETURNING {qn('series_id')}, {qn('start')}, {qn('count')}",
            params,
        )
        moved: list[tuple[int, int, int]] = cursor.fetchall()
        if sweep.coarse:
            sums: dict[tuple[int, int], int] = {}
            for series_id, start, count in moved:
                key = (series_id, align(start, sweep.coarse))
                sums[key] = sums.get(key, 0) + count
            rows = sorted(sums.items())
            for part in storage.chunks(rows, storage.BATCH_SIZE):
                flat: list[Any] = []
                for (series_id, start), count in part:
                    flat += [series_id, sweep.coarse, start, count]
                storage.upsert_buckets(cursor, connection, len(part), flat)
    return len(moved), max((row[1] for row in moved), default=floor)
