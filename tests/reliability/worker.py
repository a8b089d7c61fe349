"""A metrics process for the fault tests: ``python -m tests.reliability.worker COMMAND``.

Commands print one JSON line on stdout (``progress`` lines before it for ``downsample``):

* ``visits SECONDS``: record visits from four threads for SECONDS while the flusher thread
  flushes; then wait (at most 60 s) until the flusher has written everything, and exit
  (``atexit`` flushes any remainder). Prints what was recorded and what the flusher saw.
* ``seed``: wipe the metrics tables and write :func:`seed_counts` (deterministic).
* ``downsample BATCH``: one downsampling run as of :data:`NOW`, a progress line per batch.
* ``snapshot``: every bucket and every series total.
* ``ledger``: every flush-ledger row, as ``[flush id, Unix time of its write]``.
* ``sigterm-in-query SECONDS``: record 7 visits, then wait in ``pg_sleep(SECONDS)`` for a
  SIGTERM; prints ``ready`` first, ``previous_handler`` when the chained handler runs.
* ``drain``: what the Celery task ``flush_redis_buffer`` does: the Redis buffer into the
  database.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import django

#: "Now" of the downsampling runs: folds are due in three tiers of the default retention.
NOW = 1_710_000_000
SERIES = 20
#: Minute buckets per series, ending 1 day before NOW (all due for folding).
MINUTES = 1800


def out(**data: Any) -> None:
    print(json.dumps(data), flush=True)


def seed_counts() -> dict[tuple[str, int], int]:
    first = (NOW - 86400) // 60 - MINUTES
    return {
        (f"fold:{s}", first + m): 1 + (s * 7 + m * 13) % 17
        for s in range(SERIES)
        for m in range(MINUTES)
    }


def visits(seconds: float) -> None:
    from metrics_app import buffer, record
    from metrics_app.signals import flush_failed

    failures: list[str] = []
    flush_failed.connect(lambda exception, **kw: failures.append(repr(exception)), weak=False)
    counts = [0] * 4
    stop = time.monotonic() + seconds

    def run(n: int) -> None:
        while time.monotonic() < stop:
            for _ in range(20):
                record("visits:fault", 1)
                counts[n] += 1
            time.sleep(0.005)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    recorded = sum(counts)
    deadline = time.monotonic() + 60
    while buffer.stats()["buffered_keys"] and time.monotonic() < deadline:
        time.sleep(0.1)
    out(
        recorded=recorded,
        left_for_exit=buffer.stats()["buffered_keys"],
        flush_failures=len(failures),
        first_failure=failures[0] if failures else "",
    )


def seed() -> None:
    from metrics_app import storage
    from metrics_app.models import Bucket, FlushLedger, Series

    Bucket.objects.all().delete()
    Series.objects.all().delete()
    FlushLedger.objects.all().delete()
    storage.write_counts(seed_counts(), f"seed:{time.time()}")
    out(rows=Bucket.objects.count())


def downsample(batch: int) -> None:
    from metrics_app import rollup

    def progress(text: str) -> None:
        out(progress=text)

    result = rollup.downsample(now=NOW, batch_size=batch, progress=progress)
    out(**result.as_dict())


def snapshot() -> None:
    from metrics_app.models import Bucket, Series

    buckets = sorted(Bucket.objects.values_list("series__name", "resolution", "start", "count"))
    out(buckets=buckets, totals=dict(Series.objects.values_list("name", "total")))


def ledger() -> None:
    from metrics_app.models import FlushLedger

    rows = FlushLedger.objects.values_list("flush_id", "created")
    out(rows=sorted([flush_id, created.timestamp()] for flush_id, created in rows))


def sigterm_in_query(seconds: float) -> None:
    """Record visits, then wait in a PostgreSQL query (``pg_sleep``) for the SIGTERM the test
    sends: the flush must not run on the interrupted connection (it would wait on itself),
    and the handler that was installed before metrics_app's (a server's) still runs."""
    import signal

    from django.db import connection

    from metrics_app import record

    def previous(signum: int, frame: Any) -> None:
        out(previous_handler=True)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, previous)
    record("visits:sigterm", 7)  # installs metrics_app's handler, chained to ``previous``
    out(ready=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [seconds])
    out(query_finished=True)


def shorten_waits() -> None:
    """Shorter retries than the constant's 300 s, and the lock time the test asks for
    (``RELIABILITY_LOCK_TTL``), so the faults show within the test's time. The flusher's
    interval is the test's (``RELIABILITY_FLUSH_INTERVAL``; none: no thread), and no query
    sends a downsample to a broker."""
    from metrics_app import query, rollup
    from metrics_app.buffer import flusher

    flusher.MAX_RETRY_DELAY = 1.0
    flusher.FLUSH_INTERVAL = float(os.environ.get("RELIABILITY_FLUSH_INTERVAL", "0"))
    query.DOWNSAMPLE_ON_READ = False
    rollup.LOCK_TTL = int(os.environ.get("RELIABILITY_LOCK_TTL", "600"))


def main(argv: list[str]) -> None:
    django.setup()
    shorten_waits()
    command, *args = argv
    if command == "visits":
        visits(float(args[0]))
    elif command == "seed":
        seed()
    elif command == "downsample":
        downsample(int(args[0]))
    elif command == "snapshot":
        snapshot()
    elif command == "ledger":
        ledger()
    elif command == "sigterm-in-query":
        sigterm_in_query(float(args[0]))
    elif command == "drain":
        from metrics_app.buffer import shared as redis_buffer

        out(written=redis_buffer.flush())
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
