"""metrics_app benchmarks (``python -m bench.claims.metrics``; ``make bench`` calls ``main()``).

1. ``record()`` against the floor of the same job (a locked dict increment keyed by
   ``(name, minute)`` with a clock read), interleaved in one run; target <= 3x.
2. One flush of 100,000 series on PostgreSQL: statements, time and the process's CPU
   (insert and update paths); target: at most 0.5 s of CPU. Before it, the buffer at the
   default bounds with a flush interval of 100,000 series across a minute's end beside the
   batch before it (300,000 keys): nothing may be dropped, whoever chose the names.
3. Downsampling dense minute data of 100 series, loaded in SQL (``generate_series``):
   60 days by default (the whole bench then takes about 5 minutes on 2 cores);
   ``--full-year`` for the size docs/performance quotes, 100 series x 365 days (52.56M
   minute rows), ``--days`` and ``--series`` for other sizes, ``--batch-size`` for the rows
   per transaction (``rollup.DOWNSAMPLE_BATCH_SIZE``): load time, downsample time, rows per
   second, on PostgreSQL.
4. One dense series over a year: rows left after downsampling (bound < 2,600, against 525,600
   minute rows), the same count computed from the retention rules for every hour of a week
   (min / mean / max: it depends on where "now" falls in the week), measured again at the
   worst hour, and a one-year chart query in milliseconds.

Runs in a child process with its own Django settings and a throwaway PostgreSQL, because
``python -m bench`` configures Django for ratelimit_app first. The server never outlives the
bench: the child stops it in a ``finally`` and on SIGTERM/SIGINT (which the parent forwards),
the child gets SIGTERM if the parent dies, and a watchdog process in its own session stops
the server if the child dies any other way (SIGKILL, say).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

from bench.common import table

YEAR = 365 * 86400
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Rows per dense series per year must stay under this: retention keeps a series small
#: whatever its traffic (docs/performance, Metrics).
ROW_BOUND = 2600
#: Days of the default downsampling run, sized to finish the whole bench in ~5 minutes.
DEFAULT_DAYS = 60
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
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    from metrics_app import query
    from metrics_app.buffer import flusher, process

    flusher.FLUSH_INTERVAL = 0  # no flusher thread: the bench flushes when it says
    process.HANDLE_SIGTERM = False
    query.DOWNSAMPLE_ON_READ = False  # no broker: queries send no downsample


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


#: Series in the flush bench, and the CPU its flush may take in the flushing process (ms;
#: issue 37: a flush interval of a crowd's series, written in half a second). The
#: database's own work is the server's, apart: the wall time shows it.
FLUSH_SERIES, FLUSH_CPU_MS = 100_000, 500.0


def bench_buffer(series: int) -> list[list[object]]:
    """The default buffer holding a flush interval of ``series`` series that straddles a
    minute's end (two keys each) beside the interval before, queued while it is written:
    the keys held, the events dropped (must be 0) and the bytes a key costs."""
    import gc
    import tracemalloc

    from metrics_app.buffer.aggregator import Aggregator

    rows: list[list[object]] = []
    minute = int(NOW // 60)
    for chosen in (False, True):
        held = Aggregator()
        for i in range(series):  # the interval before, sealed: being written
            held.add(f"shorturl:{i:x}", minute - 1, 1, chosen)
        held.seal()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for at in (minute, minute + 1):
                for i in range(series):
                    held.add(f"shorturl:{i:x}", at, 1, chosen)
            size = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        stats = held.stats()
        rows.append(
            [
                "client-chosen names" if chosen else "names the code chose",
                f"{stats['buffered_keys']:,}",
                stats["dropped_events"],
                round(size / (2 * series)),
                "yes" if stats["dropped_events"] == 0 else "NO",
            ]
        )
    return rows


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
            start, cpu = time.perf_counter(), time.process_time()
            metrics_app.flush()
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        cpu_ms = cpu * 1e3
        met = "yes" if cpu_ms <= FLUSH_CPU_MS else "NO"
        rows.append(
            [f"{series:,} series, {label}", len(ctx.captured_queries), elapsed * 1e3, cpu_ms, met]
        )
    assert Series.objects.count() == series
    assert Bucket.objects.filter(count=2).count() == series
    Series.objects.all().delete()
    return rows


def _dense(prefix: str, n_series: int, days: int, now: float = NOW) -> int:
    """Insert dense minute buckets (count 1) for ``days`` up to ``now``, all in SQL.

    ``INSERT ... SELECT ... FROM generate_series(...)`` one day at a time (time-major, as
    flushes write them), then ``ANALYZE`` so the planner knows the table's size. The
    foreign-key trigger is skipped for the load (``session_replication_role = replica``:
    the series ids come from the series table itself); it is on again for the downsample.
    """
    from django.db import connection

    from metrics_app.models import Series

    Series.objects.bulk_create(
        [Series(name=f"{prefix}{i}", total=days * 1440) for i in range(n_series)]
    )
    end = int(now // 60 * 60)
    inserted = 0
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        for day in range(days, 0, -1):
            lo = end - day * 86400
            cursor.execute(
                "INSERT INTO metrics_app_bucket (series_id, resolution, start, count) "
                "SELECT s.id, 60, t, 1 FROM generate_series(%s::bigint, %s::bigint, 60) t "
                "CROSS JOIN (SELECT id FROM metrics_app_series WHERE name LIKE %s) s "
                "ORDER BY t, s.id",
                [lo, lo + 86400 - 60, prefix + "%"],
            )
            inserted += int(cursor.rowcount)
        cursor.execute("SET session_replication_role = DEFAULT")
        cursor.execute("ANALYZE metrics_app_bucket")
    return inserted


def _clear() -> None:
    """Empty the tables (a cascading delete of millions of rows would take minutes)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE metrics_app_bucket, metrics_app_series, metrics_app_flushledger")


def bench_downsample(n_series: int, days: int, batch_size: int | None) -> list[list[object]]:
    from metrics_app import rollup
    from metrics_app.models import Bucket

    start = time.perf_counter()
    inserted = _dense("d:", n_series, days)
    load = time.perf_counter() - start
    start = time.perf_counter()
    result = rollup.downsample(now=NOW, batch_size=batch_size)
    elapsed = time.perf_counter() - start
    again = rollup.downsample(now=NOW, batch_size=batch_size)
    assert (again.folded, again.expired) == (0, 0)  # idempotent
    left = Bucket.objects.count()
    moved = result.folded + result.expired
    _clear()
    return [
        [
            f"{n_series} series x {days} d",
            inserted,
            load,
            inserted / load,
            moved,
            result.batches,
            elapsed,
            inserted / elapsed,
            moved / elapsed,
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


def _year_series(now: float) -> tuple[int, int, list[float], list[float], int, int]:
    """Load a dense year for one series up to ``now``, downsample, chart it; clean up."""
    from metrics_app import query, rollup
    from metrics_app.models import Bucket
    from metrics_app.testing import frozen_clock

    inserted = _dense("y:", 1, 365, now)
    rollup.downsample(now=now)
    stored = Bucket.objects.count()
    end = datetime.fromtimestamp(now, tz=UTC)
    start = datetime.fromtimestamp(now - YEAR, tz=UTC)
    with frozen_clock(now):
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            points = query.series("y:0", start, end)
            times.append((time.perf_counter() - t0) * 1e3)
        weekly = []
        for _ in range(5):
            t0 = time.perf_counter()
            points_w = query.series("y:0", start, end, step=604800)
            weekly.append((time.perf_counter() - t0) * 1e3)
    # Exact: every minute of the year is in the week chart (which may start a few days
    # before ``start``, in the expired part, and so count less than ``inserted``).
    assert sum(c for _, c in points_w) == sum(c for _, c in points) <= inserted
    _clear()
    return inserted, stored, times, weekly, len(points), len(points_w)


def bench_year_series() -> list[list[object]]:
    # The count depends on where "now" falls in the week (and the hour): sweep every hour
    # of a week with the rules, then measure the worst hour for real too.
    week = {NOW + h * 3600: dense_rows(NOW + h * 3600) for h in range(7 * 24)}
    worst_now = max(week, key=lambda t: week[t])
    inserted, stored, times, weekly, n_points, n_weekly = _year_series(NOW)
    assert dense_rows(NOW) == stored, (dense_rows(NOW), stored)
    _, worst_stored, _, _, _, _ = _year_series(worst_now)
    assert week[worst_now] == worst_stored, (week[worst_now], worst_stored)
    assert max(week.values()) < ROW_BOUND, max(week.values())
    worst = datetime.fromtimestamp(worst_now, tz=UTC).strftime("%a %H:%M")
    return [
        ["minute rows inserted (1 series, 365 d)", inserted],
        ["rows stored after downsampling (now = Wed 12:00)", stored],
        ["same, from the rules (must match)", dense_rows(NOW)],
        ["rows stored, every hour of a week: min", min(week.values())],
        ["rows stored, every hour of a week: mean", round(statistics.mean(week.values()))],
        [f"rows stored, every hour of a week: max (now = {worst})", max(week.values())],
        ["same worst hour, measured", worst_stored],
        ["bound", ROW_BOUND],
        ["one-year chart, default step: points", n_points],
        ["one-year chart, default step: median ms", statistics.median(times)],
        ["one-year chart, step=1w: points", n_weekly],
        ["one-year chart, step=1w: median ms", statistics.median(weekly)],
    ]


def _tune(cursor: Any) -> None:
    """Bulk-write settings of a throwaway server (no restart needed; fsync is already off)."""
    for setting in ("max_wal_size = '8GB'", "checkpoint_timeout = '30min'"):
        cursor.execute(f"ALTER SYSTEM SET {setting}")
    cursor.execute("SELECT pg_reload_conf()")


def run(days: int, n_series: int, batch_size: int | None, quick: bool) -> None:
    from django.core.management import call_command
    from django.db import connection

    from tests.servers import start_postgres

    pg = start_postgres()
    # A watchdog in its own session stops the server if this process dies in any way
    # (SIGKILL, a timeout, a crash) before the ``finally`` below could.
    _spawn_watchdog(pg.tmpdir)

    def on_signal(signum: int, _frame: Any) -> None:
        pg.stop()  # first: a long statement in progress then fails at once
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
        with connection.cursor() as cursor:
            _tune(cursor)
        started = time.perf_counter()
        calls, rounds = (100_000, 3) if quick else (1_000_000, 7)
        print(
            table(
                f"metrics: record() vs floor ({calls:,} calls x {rounds} rounds, median)",
                ["what", "ns/call", "x floor"],
                bench_record(calls, rounds),
            ),
            end="\n\n",
            flush=True,
        )
        print(
            table(
                f"metrics: the buffer at its default bounds, {FLUSH_SERIES:,} series across "
                "a minute's end beside the interval before (target: none dropped)",
                ["names", "keys held", "dropped", "bytes a key", "met"],
                bench_buffer(FLUSH_SERIES),
            ),
            end="\n\n",
            flush=True,
        )
        print(
            table(
                "metrics: one flush on PostgreSQL (1,000 series per statement; "
                f"target: at most {FLUSH_CPU_MS:g} ms of the process's CPU)",
                ["flush", "statements", "ms", "CPU ms", "met"],
                bench_flush(FLUSH_SERIES),
            ),
            end="\n\n",
            flush=True,
        )
        from metrics_app import rollup
        from metrics_app.conf import conf

        size = batch_size or rollup.DOWNSAMPLE_BATCH_SIZE
        print(
            table(
                "metrics: downsampling dense minute data on PostgreSQL "
                f"(retention {conf.RETENTION}, batch {size:,} rows)",
                [
                    "data",
                    "minute rows",
                    "load s",
                    "load rows/s",
                    "rows folded+expired",
                    "batches",
                    "downsample s",
                    "minute rows/s",
                    "rows moved/s",
                    "rows left",
                ],
                bench_downsample(n_series, days, batch_size),
            ),
            end="\n\n",
            flush=True,
        )
        print(
            table(
                "metrics: one dense series over a year (retention 1m:1d,5m:2d,1h:31d,1w:1y)",
                ["what", "value"],
                bench_year_series(),
            ),
            flush=True,
        )
        print(f"\n(metrics benchmarks: {time.perf_counter() - started:.0f} s)")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        pg.stop()


def _spawn_watchdog(tmpdir: str) -> None:
    subprocess.Popen(
        [sys.executable, "-m", "bench.claims.metrics", "--watchdog", str(os.getpid()), tmpdir],
        cwd=ROOT,
        start_new_session=True,  # not killed with our process group
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except OSError:
        return False


def watchdog(pid: int, tmpdir: str) -> None:
    """Wait for ``pid`` to end, then stop the PostgreSQL cluster in ``tmpdir`` if it runs."""
    import shutil

    from tests.servers import as_postgres_user, find_binary

    while _alive(pid):
        time.sleep(0.5)
    datadir = os.path.join(tmpdir, "data")
    pg_ctl = find_binary("pg_ctl")
    if pg_ctl and os.path.exists(os.path.join(datadir, "postmaster.pid")):
        subprocess.run(
            as_postgres_user([pg_ctl, "-D", datadir, "-m", "immediate", "-w", "stop"]),
            capture_output=True,
            check=False,
            timeout=60,
        )
    shutil.rmtree(tmpdir, ignore_errors=True)


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the parent dies (Linux), so nothing runs on alone."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover  (not Linux)
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.claims.metrics")
    parser.add_argument(
        "--days",
        type=int,
        default=int(os.environ.get("BENCH_METRICS_DAYS", DEFAULT_DAYS)),
        help=f"days of dense minute data to downsample (default {DEFAULT_DAYS})",
    )
    parser.add_argument("--series", type=int, default=100, help="series (default 100)")
    parser.add_argument(
        "--full-year",
        action="store_true",
        help="the size docs/performance quotes: 100 series x 365 days (52.56M minute rows)",
    )
    parser.add_argument("--batch-size", type=int, default=None, help="rows per transaction")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--watchdog", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else [])
    if args.watchdog:
        watchdog(int(args.watchdog[0]), args.watchdog[1])
        return
    if args.full_year:
        args.days, args.series = 365, 100
    if args.quick:
        args.days, args.series = min(args.days, 7), min(args.series, 10)
    if args.child:
        run(args.days, args.series, args.batch_size, args.quick)
        return
    # A fresh interpreter: Django may already be configured for another benchmark.
    cmd = [
        sys.executable,
        "-m",
        "bench.claims.metrics",
        "--child",
        f"--days={args.days}",
        f"--series={args.series}",
    ]
    if args.batch_size:
        cmd.append(f"--batch-size={args.batch_size}")
    if args.quick:
        cmd.append("--quick")
    child = subprocess.Popen(cmd, cwd=ROOT, preexec_fn=_die_with_parent)

    def forward(signum: int, _frame: Any) -> None:
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if child.poll() is None:
            child.terminate()
            child.wait()
    if code:
        raise subprocess.CalledProcessError(code, cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
