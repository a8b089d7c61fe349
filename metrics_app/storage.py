"""Writing buffered counts to the database: one transaction per flush.

A flush is three kinds of statement, each a multi-row batch of at most
:data:`BATCH_SIZE` rows, so the number of statements is
``1 + ceil(series / batch) + ceil(buckets / batch)`` whatever the traffic:

1. the flush-ledger row, ``INSERT ... ON CONFLICT (flush_id) DO NOTHING``. When it inserts
   nothing, this exact batch was committed before (the reply to its COMMIT was lost, say) and
   the flush stops there: it is never counted twice;
2. the series' totals, ``INSERT ... ON CONFLICT (name) DO UPDATE SET total = total +
   EXCLUDED.total ... RETURNING id, name``;
3. the buckets, ``INSERT ... ON CONFLICT (series_id, resolution, start) DO UPDATE SET
   count = count + EXCLUDED.count``.

SQLite (3.35+) takes this SQL. Rows are written in sorted order so that concurrent flushes
from many processes lock rows in the same order and cannot deadlock. On PostgreSQL
(:func:`_write_json`) steps 2 and 3 are one statement per batch of series, ``1 + ceil(series
/ batch)`` in all: the batch's rows are one JSON array (``json_array_elements ... WITH
ORDINALITY``) rather than four placeholders a row, which psycopg would parse in Python, and
the series' upsert is a CTE whose ids the buckets' upsert joins in SQL; the order of the
rows locked is the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.db import connections, router, transaction

from metrics_app import clock
from metrics_app.conf import conf
from metrics_app.models import Bucket, FlushLedger, Series, TopKey
from metrics_app.retention import align
from metrics_app.topk import CAPACITY, SpaceSaving

T = TypeVar("T")

#: Rows per multi-row statement (a flush's, and a downsample's on SQLite).
BATCH_SIZE = 1000

#: ``{(series name, minute index): count}``; minute index = Unix seconds // 60.
Counts = Mapping[tuple[str, int], int]


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _gathered(
    counts: Counts, precision: int
) -> tuple[dict[str, list[int]], dict[tuple[str, int], int]]:
    """The series of ``counts`` (name -> [total, first minute's start, last minute's
    start], in seconds) and their buckets of ``precision`` seconds (name, start -> count)."""
    buckets: dict[tuple[str, int], int] = {}
    series: dict[str, list[int]] = {}
    starts: dict[int, int] = {}  # minute -> its bucket's start (a flush holds a few minutes)
    for (name, minute), count in counts.items():
        if not count:
            continue
        start = starts.get(minute)
        if start is None:
            start = starts[minute] = align(minute * 60, precision)
        buckets[name, start] = buckets.get((name, start), 0) + count
        row = series.get(name)
        at = minute * 60
        if row is None:
            series[name] = [count, at, at]
        else:
            row[0] += count
            if at < row[1]:
                row[1] = at
            if at > row[2]:
                row[2] = at
    return series, buckets


def _times(connection: Any) -> Callable[[float], Any]:
    """A flush's adapter of Unix seconds to the database's datetime value, each distinct
    second adapted once (a flush's times fall in a few minutes)."""
    adapted: dict[float, Any] = {}

    def dt(seconds: float) -> Any:
        found = adapted.get(seconds)
        if found is None:
            found = adapted[seconds] = connection.ops.adapt_datetimefield_value(
                datetime.fromtimestamp(seconds, tz=UTC)
            )
        return found

    return dt


def write_counts(counts: Counts, flush_id: str, *, using: str | None = None) -> bool:
    """Add ``counts`` to the database in one transaction; False if ``flush_id`` was applied.

    Minutes are aligned to the finest retention tier here (at write time), so the
    in-process buffer never reads a setting.
    """
    alias = using or router.db_for_write(Bucket)
    precision = conf.RETENTION.finest.precision
    connection = connections[alias]
    qn = connection.ops.quote_name
    ledger_t, series_t = (qn(m._meta.db_table) for m in (FlushLedger, Series))

    dt = _times(connection)

    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {ledger_t} ({qn('flush_id')}, {qn('created')}) VALUES (%s, %s) "
            f"ON CONFLICT ({qn('flush_id')}) DO NOTHING",
            [flush_id, dt(clock.now())],
        )
        if cursor.rowcount == 0:
            return False
        if connection.vendor == "postgresql":
            _write_json(cursor, connection, counts, precision)
            return True
        series, buckets = _gathered(counts, precision)
        ids: dict[str, int] = {}
        first, last = qn("first_seen"), qn("last_seen")
        for part in chunks(sorted(series), BATCH_SIZE):
            params: list[Any] = []
            for name in part:
                total, lo, hi = series[name]
                params += [name, total, dt(lo), dt(hi)]
            cursor.execute(
                f"INSERT INTO {series_t} ({qn('name')}, {qn('total')}, {first}, {last}) "
                f"VALUES {', '.join(['(%s, %s, %s, %s)'] * len(part))} "
                f"ON CONFLICT ({qn('name')}) DO UPDATE SET "
                f"{qn('total')} = {series_t}.{qn('total')} + EXCLUDED.{qn('total')}, "
                f"{first} = CASE WHEN {series_t}.{first} IS NULL "
                f"OR EXCLUDED.{first} < {series_t}.{first} "
                f"THEN EXCLUDED.{first} ELSE {series_t}.{first} END, "
                f"{last} = CASE WHEN {series_t}.{last} IS NULL "
                f"OR EXCLUDED.{last} > {series_t}.{last} "
                f"THEN EXCLUDED.{last} ELSE {series_t}.{last} END "
                f"RETURNING {qn('id')}, {qn('name')}",
                params,
            )
            ids.update((name, pk) for pk, name in cursor.fetchall())
        rows = sorted((ids[name], start, count) for (name, start), count in buckets.items())
        for part_rows in chunks(rows, BATCH_SIZE):
            params = []
            for series_id, start, count in part_rows:
                params += [series_id, precision, start, count]
            upsert_buckets(cursor, connection, len(part_rows), params)
    return True


def _by_series(counts: Counts, precision: int) -> dict[str, list[Any]]:
    """The rows of a flush on PostgreSQL, in one pass over ``counts``: name -> ``[name,
    total, first minute's start, last minute's start, bucket start, count, ...]`` (seconds;
    a start and count for each bucket of the name, one or two in a flush)."""
    rows: dict[str, list[Any]] = {}
    minutes: dict[int, tuple[int, int]] = {}  # minute -> its start, its bucket's start
    for (name, minute), count in counts.items():
        if not count:
            continue
        times = minutes.get(minute)
        if times is None:
            times = minutes[minute] = (minute * 60, align(minute * 60, precision))
        row = rows.get(name)
        if row is None:
            at, start = times
            rows[name] = [name, count, at, at, start, count]
        else:
            _add(row, count, *times)
    return rows


def _add(row: list[Any], count: int, at: int, start: int) -> None:
    """Add a second (or later) minute's ``count`` to a row of :func:`_by_series`."""
    row[1] += count
    if at < row[2]:
        row[2] = at
    if at > row[3]:
        row[3] = at
    for i in range(4, len(row), 2):
        if row[i] == start:
            row[i + 1] += count
            return
    row += (start, count)


def _write_json(cursor: Any, connection: Any, counts: Counts, precision: int) -> None:
    """The series and buckets of a flush on PostgreSQL: one statement per batch of
    :data:`BATCH_SIZE` series, their rows one JSON array (``json_array_elements ... WITH
    ORDINALITY``, in the names' order), not four placeholders a row. The series' upsert is
    a data-modifying CTE whose ``RETURNING`` the buckets' upsert joins on the name, so no id
    comes back to Python.

    psycopg parses a statement's placeholders, and adapts the items of a list, in Python:
    4,000 placeholders a statement cost more than writing the rows, where ``json.dumps``
    writes a batch in C. Names are text JSON escapes exactly
    (:func:`metrics_app.names.check_name` keeps out NUL and lone surrogates, which no column
    could store either). Rows are locked in the names' order, a series before its buckets,
    so concurrent flushes cannot deadlock."""
    qn = connection.ops.quote_name
    series_t, bucket_t = qn(Series._meta.db_table), qn(Bucket._meta.db_table)
    first, last, total, name = qn("first_seen"), qn("last_seen"), qn("total"), qn("name")
    upsert = (
        "WITH u AS (SELECT v, n FROM json_array_elements(%s::json) WITH ORDINALITY AS u(v, n)), "
        f"s AS (INSERT INTO {series_t} ({name}, {total}, {first}, {last}) "
        "SELECT v->>0, (v->>1)::bigint, to_timestamp((v->>2)::bigint), "
        "to_timestamp((v->>3)::bigint) FROM u ORDER BY n "
        f"ON CONFLICT ({name}) DO UPDATE SET "
        f"{total} = {series_t}.{total} + EXCLUDED.{total}, "
        f"{first} = LEAST({series_t}.{first}, EXCLUDED.{first}), "
        f"{last} = GREATEST({series_t}.{last}, EXCLUDED.{last}) "
        f"RETURNING {qn('id')}, {name}) "
        f"INSERT INTO {bucket_t} ({qn('series_id')}, {qn('resolution')}, {qn('start')}, "
        f"{qn('count')}) SELECT s.{qn('id')}, %s, (u.v->>b.i)::bigint, (u.v->>(b.i + 1))::bigint "
        f"FROM u JOIN s ON s.{name} = u.v->>0 "
        "CROSS JOIN generate_series(4, json_array_length(u.v) - 1, 2) AS b(i) "
        "ORDER BY u.n, b.i "
        f"ON CONFLICT ({qn('series_id')}, {qn('resolution')}, {qn('start')}) DO UPDATE SET "
        f"{qn('count')} = {bucket_t}.{qn('count')} + EXCLUDED.{qn('count')}"
    )
    rows = _by_series(counts, precision)
    for part in chunks(sorted(rows), BATCH_SIZE):
        batch = json.dumps([rows[series] for series in part], ensure_ascii=False)
        cursor.execute(upsert, [batch, precision])


def upsert_buckets(cursor: Any, connection: Any, n: int, params: list[Any]) -> None:
    """Additive multi-row upsert of ``n`` ``(series_id, resolution, start, count)`` rows."""
    qn = connection.ops.quote_name
    bucket_t = qn(Bucket._meta.db_table)
    cursor.execute(
        f"INSERT INTO {bucket_t} ({qn('series_id')}, {qn('resolution')}, {qn('start')}, "
        f"{qn('count')}) VALUES {', '.join(['(%s, %s, %s, %s)'] * n)} "
        f"ON CONFLICT ({qn('series_id')}, {qn('resolution')}, {qn('start')}) DO UPDATE SET "
        f"{qn('count')} = {bucket_t}.{qn('count')} + EXCLUDED.{qn('count')}",
        params,
    )


#: Seconds of a top-keys bucket: a page sums a name's buckets over the last hour or day.
TOP_BUCKET = 600
#: Longest ``label`` and ``ref`` stored (the columns' sizes); a longer ``ref`` is not
#: stored at all (half of one acts on nothing).
LABEL_LENGTH, REF_LENGTH = 200, 320


def write_tops(
    sketches: Mapping[str, tuple[float, SpaceSaving]], *, using: str | None = None
) -> int:
    """Add each named sketch's keys to their bucket's rows (``TopKey``), keep the
    :data:`~metrics_app.topk.CAPACITY` most counted keys of each name and bucket, and delete
    the rows past their ``expires``, in one transaction. Returns the rows written.

    A row adds up the keys' certain counts (``Entry.count``, never above the truth), so a
    sum over flushes and processes never is either."""
    alias = using or router.db_for_write(TopKey)
    rows = sorted(
        (name, align(int(e.last), TOP_BUCKET), key, e, keep)
        for name, (keep, sketch) in sketches.items()
        for key, e in sketch.entries.items()
    )
    connection = connections[alias]
    qn = connection.ops.quote_name
    table = qn(TopKey._meta.db_table)
    columns = ("name", "key", "label", "ref", "start", "count", "first_seen", "last_seen")
    first, last = qn("first_seen"), qn("last_seen")

    dt = _times(connection)

    with transaction.atomic(using=alias), connection.cursor() as cursor:
        for part in chunks(rows, BATCH_SIZE):
            params: list[Any] = []
            for name, start, key, e, keep in part:
                ref = e.ref if len(e.ref) <= REF_LENGTH else ""
                params += [name, key, e.label[:LABEL_LENGTH], ref, start, e.count]
                params += [dt(e.first), dt(e.last), dt(e.last + keep)]
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(qn(c) for c in columns)}, {qn('expires')}) "
                f"VALUES {', '.join(['(%s, %s, %s, %s, %s, %s, %s, %s, %s)'] * len(part))} "
                f"ON CONFLICT ({qn('name')}, {qn('start')}, {qn('key')}) DO UPDATE SET "
                f"{qn('count')} = {table}.{qn('count')} + EXCLUDED.{qn('count')}, "
                f"{qn('label')} = EXCLUDED.{qn('label')}, {qn('ref')} = EXCLUDED.{qn('ref')}, "
                f"{first} = CASE WHEN EXCLUDED.{first} < {table}.{first} "
                f"THEN EXCLUDED.{first} ELSE {table}.{first} END, "
                f"{last} = CASE WHEN EXCLUDED.{last} > {table}.{last} "
                f"THEN EXCLUDED.{last} ELSE {table}.{last} END, "
                f"{qn('expires')} = EXCLUDED.{qn('expires')}",
                params,
            )
        for name, start in sorted({(row[0], row[1]) for row in rows}):
            cursor.execute(
                f"DELETE FROM {table} WHERE {qn('name')} = %s AND {qn('start')} = %s AND "
                f"{qn('id')} NOT IN (SELECT {qn('id')} FROM {table} WHERE {qn('name')} = %s "
                f"AND {qn('start')} = %s ORDER BY {qn('count')} DESC, {last} DESC LIMIT %s)",
                [name, start, name, start, CAPACITY],
            )
        expire_tops(using=alias)
    return len(rows)


def expire_tops(*, using: str | None = None) -> int:
    """Delete the top-keys rows past their ``expires``; how many."""
    now = datetime.fromtimestamp(clock.now(), tz=UTC)
    alias = using or router.db_for_write(TopKey)
    deleted, _ = TopKey.objects.using(alias).filter(expires__lt=now).delete()
    return deleted
