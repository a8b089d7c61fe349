"""metrics_app benchmarks (``python -m bench.bench_metrics``; ``make bench`` calls ``main()``).

1. ``record()`` against the floor of the same job (a locked dict increment keyed by
   ``(name, minute)`` with a clock read), interleaved in one run; target <= 3x.
2. One flush of 10,000 series on PostgreSQL: statements and time (insert and update paths).
3. Downsampling dense minute data of 100 series (14 days by default; ``--days 365`` for the
   full year, which takes tens of minutes just to load 52.6M rows): rows per second, on
   PostgreSQL.
4. One dense series over a year: rows left after downsampling (bound < 2,600, against 525,600
   minute rows), the same count computed from the retention rules for every hour of a week
   (min / mean / max: it depends on where "now" falls in the week), and a one-year chart
   query in milliseconds.

Runs in a child process with its own Django settings and a throwaway PostgreSQL, because
``python -m bench`` configures Django for ratelimit_app first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

from bench.common import table

YEAR = 365 * 86400
#: The simulated "now": a Wednesday noon, so the week tier is mid-bucket.
NOW = datetime(2025, 3, 5, 12, 0, tzinfo=UTC).timestamp()


def _configure(database: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="bench-not-secret",
        INSTALLED_APPS=["metrics_app"],
        DATABASES={"default": database},
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        USE_TZ=True,
        METRICS_FLUSH_INTERVAL=0,
        METRICS_QUERY_DOWNSAMPLE=None,
        METRICS_HANDLE_SIGTERM=False,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def bench_record(calls: int, rounds: int) -> list[list[object]]:
    import metrics_app
    from metrics_app import buffer

    lock = threading.Lock()
    counts: dict[tuple[str, int], int] = {}
    clock = time.time

    def floor(name: str) -> None:
        key = (name, int(clock() // 60))
        with lock:
            counts[key] = counts.get(key, 0) + 1

    record = metrics_app.record
    names = [f"shorturl:{i}" for i in range(100)] * (calls // 100)
    ours: list[float] = []
    base: list[float] = []
    for _ in range(rounds):
        for fn, out in ((floor, base), (record, ours)):
            start = time.perf_counter()
            for name in names:
                fn(name)
            out.append((time.perf_counter() - start) / len(names) * 1e9)
        buffer.reset()
        counts.clear()
    floor_ns, ours_ns = statistics.median(base), statistics.median(ours)
    return [
        ["floor (lock + dict + clock)", floor_ns, 1.0],
        ["metrics_app.record()", ours_ns, ours_ns / floor_ns],
    ]


def bench_flush(series: int) -> list[list[object]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import metrics_app
    from metrics_app.models import Bucket, Series

    rows = []
    for label in ("insert", "update"):
        for i in range(series):
            metrics_app.record(f"s:{i}", at=NOW)
        with CaptureQueriesContext(connection) as ctx:
            start = time.perf_counter()
            metrics_app.flush()
            elapsed = time.perf_counter() - start
        rows.append([f"{series} series, {label}", len(ctx.captured_queries), elapsed * 1e3])
    assert Series.objects.count() == series
    assert Bucket.objects.filter(count=2).count() == series
    Series.objects.all().delete()
    return rows


def _dense(prefix: str, n_series: int, days: int) -> int:
    """Insert dense minute buckets (count 1) for ``days`` up to NOW, server-side."""
    from django.db import connection

    from metrics_app.models import Series

    Series.objects.bulk_create(
        [Series(name=f"{prefix}{i}", total=days * 1440) for i in range(n_series)]
    )
    first = int(NOW // 60 * 60) - days * 86400
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO metrics_app_bucket (series_id, resolution, start, count) "
            "SELECT s.id, 60, t, 1 FROM metrics_app_series s, "
            "generate_series(%s::bigint, %s::bigint, 60) t WHERE s.name LIKE %s",
            [first, int(NOW // 60 * 60) - 60, prefix + "%"],
        )
        return int(cursor.rowcount)


def bench_downsample(n_series: int, days: int) -> list[list[object]]:
    from metrics_app import rollup
    from metrics_app.models import Bucket, Series

    start = time.perf_counter()
    inserted = _dense("d:", n_series, days)
    load = time.perf_counter() - start
    start = time.perf_counter()
    result = rollup.downsample(now=NOW)
    elapsed = time.perf_counter() - start
    left = Bucket.objects.count()
    Series.objects.filter(name__startswith="d:").delete()
    return [
        [
            f"{n_series} series x {days} d",
            inserted,
            load,
            result.folded + result.expired,
            elapsed,
            (result.folded + result.expired) / elapsed,
            left,
        ]
    ]


def dense_rows(now: float, span: int = YEAR) -> int:
    """Rows a dense minute series of ``span`` seconds up to ``now`` keeps after a downsample.

    Computed from the fold rules alone (a tier holds what lies between its cutoff and the
    finer tier's cutoff), to check the measured count and to sweep "now" over a week.
    """
    from metrics_app.conf import conf
    from metrics_app.retention import align

    retention = conf.RETENTION
    tiers = retention.tiers
    upper = align(now, 60)
    lowest = align(now - span, 60)
    rows = 0
    for i, tier in enumerate(tiers):
        if i < len(tiers) - 1:
            lower = retention.fold_cutoff(i, now)
        else:
            lower = retention.expiry_cutoff(now)
        lower = max(lower, align(lowest, tier.precision))
        if upper > lower:
            rows += -(-(upper - lower) // tier.precision)
        upper = min(upper, lower)
    return rows


def bench_year_series() -> list[list[object]]:
    from metrics_app import query, rollup
    from metrics_app.models import Bucket, Series
    from metrics_app.testing import frozen_clock

    inserted = _dense("y:", 1, 365)
    rollup.downsample(now=NOW)
    stored = Bucket.objects.count()
    # Worst case: "now" just before a week boundary keeps most hour rows.
    end = datetime.fromtimestamp(NOW, tz=UTC)
    start = datetime.fromtimestamp(NOW - YEAR, tz=UTC)
    with frozen_clock(NOW):
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            points = query.series("y:0", start, end)
            times.append((time.perf_counter() - t0) * 1e3)
        weekly = []
        for _ in range(5):
            t0 = time.perf_counter()
            points_h = query.series("y:0", start, end, step=604800)
            weekly.append((time.perf_counter() - t0) * 1e3)
    assert sum(c for _, c in points) <= inserted
    Series.objects.filter(name__startswith="y:").delete()
    predicted = dense_rows(NOW)
    assert predicted == stored, (predicted, stored)
    week = [dense_rows(NOW + h * 3600) for h in range(7 * 24)]
    return [
        ["minute rows inserted (1 series, 365 d)", inserted],
        ["rows stored after downsampling (now = Wed 12:00)", stored],
        ["same, from the rules (must match)", predicted],
        ["rows stored, any hour of a week: min", min(week)],
        ["rows stored, any hour of a week: mean", round(statistics.mean(week))],
        ["rows stored, any hour of a week: max", max(week)],
        ["one-year chart, default step: points", len(points)],
        ["one-year chart, default step: median ms", statistics.median(times)],
        ["one-year chart, step=1w: median ms", statistics.median(weekly)],
        ["one-year chart, step=1w: points", len(points_h)],
    ]


def run(days: int, quick: bool) -> None:
    from django.core.management import call_command

    from tests.servers import start_postgres

    pg = start_postgres()
    try:
        _configure(
            {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": pg.extra["dbname"],
                "USER": pg.extra["user"],
                "HOST": pg.host,
                "PORT": str(pg.port),
            }
        )
        call_command("migrate", verbosity=0)
        calls, rounds = (100_000, 3) if quick else (1_000_000, 7)
        print(
            table(
                f"metrics: record() vs floor ({calls:,} calls x {rounds} rounds, median)",
                ["what", "ns/call", "x floor"],
                bench_record(calls, rounds),
            ),
            end="\n\n",
        )
        print(
            table(
                "metrics: one flush on PostgreSQL (METRICS_BATCH_SIZE=1000)",
                ["flush", "statements", "ms"],
                bench_flush(10_000),
            ),
            end="\n\n",
        )
        print(
            table(
                "metrics: downsampling dense minute data on PostgreSQL",
                ["data", "rows", "load s", "rows folded", "s", "rows/s", "rows left"],
                bench_downsample(100 if not quick else 10, days),
            ),
            end="\n\n",
        )
        print(
            table(
                "metrics: one dense series over a year (retention 1m:1d,5m:2d,1h:31d,1w:1y)",
                ["what", "value"],
                bench_year_series(),
            )
        )
    finally:
        pg.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_metrics")
    parser.add_argument("--days", type=int, default=int(os.environ.get("BENCH_METRICS_DAYS", 14)))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else [])
    if args.child:
        run(args.days, args.quick)
        return
    # A fresh interpreter: Django may already be configured for another benchmark.
    cmd = [sys.executable, "-m", "bench.bench_metrics", "--child", f"--days={args.days}"]
    if args.quick:
        cmd.append("--quick")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(cmd, check=True, cwd=root)


if __name__ == "__main__":
    main(sys.argv[1:])
