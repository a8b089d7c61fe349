"""Flushing to the database: additive upserts, the ledger, bounded statements, DB down."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext, override_settings

import metrics_app
from metrics_app import buffer, storage
from metrics_app.buffer import flusher
from metrics_app.models import Bucket, FlushLedger, Series
from metrics_app.query import total
from metrics_app.signals import flush_failed
from metrics_app.testing import FrozenClock
from tests.metrics.conftest import lose_first_commit_reply

pytestmark = [pytest.mark.db_matrix, pytest.mark.django_db]


def bucket_counts() -> dict[tuple[str, int, int], int]:
    return {
        (name, res, start): count
        for name, res, start, count in Bucket.objects.values_list(
            "series__name", "resolution", "start", "count"
        )
    }


def test_flush_is_additive_across_flushes(clock: FrozenClock) -> None:
    metrics_app.record("a", 2)
    metrics_app.record("b")
    assert metrics_app.flush() == 2
    metrics_app.record("a", 3)
    metrics_app.record("a", at=clock.t - 60)
    assert metrics_app.flush() == 2
    minute = int(clock.t // 60) * 60
    assert bucket_counts() == {
        ("a", 60, minute): 5,
        ("a", 60, minute - 60): 1,
        ("b", 60, minute): 1,
    }
    a = Series.objects.get(name="a")
    assert a.total == 6
    assert a.first_seen is not None
    assert a.last_seen is not None
    assert a.first_seen.timestamp() == minute - 60
    assert a.last_seen.timestamp() == minute
    assert FlushLedger.objects.count() == 2


def test_empty_flush_writes_nothing() -> None:
    with CaptureQueriesContext(connection) as ctx:
        assert metrics_app.flush() == 0
    assert len(ctx.captured_queries) == 0


@mock.patch.object(storage, "BATCH_SIZE", 100)
def test_statements_per_flush_bounded_by_batches(clock: FrozenClock) -> None:
    for i in range(1000):
        metrics_app.record(f"s{i}")
        metrics_app.record(f"s{i}", at=clock.t - 60)
    with CaptureQueriesContext(connection) as ctx:
        assert metrics_app.flush() == 2000
    writes = [
        q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().startswith(("INSERT", "WITH"))
    ]
    # 1 ledger row + 1000 series / 100 + 2000 buckets / 100, whatever the traffic; on
    # PostgreSQL a batch's series and their buckets are one statement.
    assert len(writes) == 1 + 10 + (0 if connection.vendor == "postgresql" else 20)
    # The rest is transaction control (savepoints in a test, BEGIN/COMMIT otherwise).
    assert len(ctx.captured_queries) <= len(writes) + 4
    assert Series.objects.count() == 1000
    assert Bucket.objects.count() == 2000


@override_settings(METRICS_RETENTION="5m:1d,1h:2d")
def test_finest_tier_coarser_than_a_minute(clock: FrozenClock) -> None:
    for k in range(10):
        metrics_app.record("a", at=clock.t + k * 60)
    metrics_app.flush()
    assert sorted(bucket_counts().values()) == [5, 5]
    assert {res for (_, res, _) in bucket_counts()} == {300}


def test_same_flush_id_is_applied_once() -> None:
    counts = {("a", 28_000_000): 4}
    assert storage.write_counts(counts, "proc:1") is True
    assert storage.write_counts(counts, "proc:1") is False
    assert storage.write_counts(counts, "proc:2") is True
    assert total("a") == 8


def test_lost_commit_reply_is_not_counted_twice(
    clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The COMMIT succeeds but the reply is lost: the retry must be a no-op."""
    calls = lose_first_commit_reply(monkeypatch)
    metrics_app.record("a", 7)
    with pytest.raises(OperationalError):
        metrics_app.flush()
    assert buffer.stats()["pending_batches"] == 1  # kept, with its id
    metrics_app.record("a", 1)
    assert metrics_app.flush() == 1
    assert calls[0] == calls[1]  # the retry reused the flush id
    assert total("a") == 8
    assert sum(bucket_counts().values()) == 8
    assert buffer.stats()["buffered_keys"] == 0


@contextmanager
def database_down() -> Iterator[None]:
    """Make the metrics database unreachable for real (PostgreSQL) or refuse statements."""
    if connection.vendor == "postgresql":
        saved = connection.settings_dict["PORT"]
        connection.close()
        connection.settings_dict["PORT"] = "1"  # nothing listens there
        try:
            yield
        finally:
            connection.close()
            connection.settings_dict["PORT"] = saved
        return

    def refuse(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "metrics_app" in sql:
            raise OperationalError("unable to open database file")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refuse):
        yield


@pytest.mark.django_db(transaction=True)
def test_database_down_keeps_counts_and_retries(clock: FrozenClock) -> None:
    failures: list[dict[str, Any]] = []

    def on_fail(**kwargs: Any) -> None:
        failures.append(kwargs)

    flush_failed.connect(on_fail)
    try:
        metrics_app.record("a", 3)
        with database_down():
            assert metrics_app.flush(raise_errors=False) is None
            metrics_app.record("a", 2)
            metrics_app.record("b", at=clock.t - 3600)
            assert metrics_app.flush(raise_errors=False) is None
            assert buffer.stats()["pending_batches"] == 2
            assert buffer.stats()["failures"] == 2
        assert metrics_app.flush() == 3  # back up: both queued batches, oldest first
    finally:
        flush_failed.disconnect(on_fail)
    assert [f["attempt"] for f in failures] == [1, 2]
    assert total("a") == 5
    assert total("b") == 1
    assert buffer.stats() == {
        "buffered_keys": 0,
        "client_keys": 0,
        "pending_batches": 0,
        "dropped_events": 0,
        "failures": 0,
    }


@pytest.mark.django_db(transaction=True)
def test_flusher_thread_flushes_and_backs_off(clock: FrozenClock) -> None:
    """The thread flushes on its own, and waits longer after each failed flush.

    The test reads the database only once a flush has committed (the ``flushed`` signal):
    on SQLite's shared in-memory test database, reading while the thread is inside its write
    transaction is refused at once ("database table is locked") instead of waiting.
    """
    import itertools
    import threading
    import time

    from metrics_app.signals import flushed

    committed = threading.Event()
    failed_at: list[float] = []

    def on_flushed(buckets: int, **kwargs: Any) -> None:
        if buckets:
            committed.set()

    def on_failed(**kwargs: Any) -> None:
        failed_at.append(time.monotonic())

    def refused(*args: Any, **kwargs: Any) -> bool:
        raise OperationalError("unable to open database file")

    flushed.connect(on_flushed)
    flush_failed.connect(on_failed)
    try:
        with mock.patch.object(flusher, "FLUSH_INTERVAL", 0.05):
            with mock.patch.object(storage, "write_counts", refused):
                metrics_app.record("threaded", 4)
                deadline = time.monotonic() + 10
                while len(failed_at) < 4 and time.monotonic() < deadline:
                    time.sleep(0.01)
            assert len(failed_at) >= 4, failed_at
            gaps = [b - a for a, b in itertools.pairwise(failed_at)]
            # 0.05 s doubled per failure: 0.1, 0.2, 0.4 (lower bounds; a busy machine is slower)
            assert gaps[0] >= 0.09 and gaps[1] >= 0.19 and gaps[2] >= 0.39, gaps
            assert committed.wait(10)  # the next try after the fault is gone writes the counts
    finally:
        flushed.disconnect(on_flushed)
        flush_failed.disconnect(on_failed)
    assert total("threaded") == 4
    buffer.reset()


#: Names that a flush must write exactly: quotes, a backslash, braces and commas (an array
#: literal's), JSON's own escapes, a tab, characters beyond ASCII and beyond the BMP.
AWKWARD = ['say "hi"', "back\\slash", "{a,b}", '["x", 1]', "tab\there", "café ☕ 𝄞", "null"]


def test_awkward_names_and_first_last_seen_are_written_exactly(clock: FrozenClock) -> None:
    """On PostgreSQL a flush sends each batch's rows as one JSON array
    (``storage._write_json``), on SQLite as placeholders: either way every name is stored
    as recorded, and a series' first and last minute only ever widen."""
    for name in AWKWARD:
        metrics_app.record(name, 2)
    assert metrics_app.flush() == len(AWKWARD)
    minute = int(clock.t // 60) * 60
    for name in AWKWARD:
        metrics_app.record(name, at=clock.t - 120)
        metrics_app.record(name, at=clock.t + 60)
    metrics_app.flush()
    metrics_app.record(AWKWARD[0], at=clock.t)  # inside: neither end moves
    metrics_app.flush()
    found = {s.name: s for s in Series.objects.all()}
    assert set(found) == set(AWKWARD)
    for name in AWKWARD:
        assert total(name) == 4 + (name == AWKWARD[0])
        assert found[name].first_seen.timestamp() == minute - 120  # type: ignore[union-attr]
        assert found[name].last_seen.timestamp() == minute + 60  # type: ignore[union-attr]
    assert bucket_counts()[(AWKWARD[5], 60, minute)] == 2


@pytest.mark.django_db(transaction=True)
@mock.patch.object(storage, "BATCH_SIZE", 50)
def test_concurrent_flushes_of_overlapping_names_neither_deadlock_nor_lose_counts() -> None:
    """Processes flush overlapping names at once, split into batches at different places
    (each flush a different subset): rows are locked in the names' order, a series before
    its buckets, so no flush deadlocks or waits for ever, and every count arrives once."""
    import random
    import threading

    from django.db import connections

    names = [f"n{i:04d}" for i in range(600)]
    minute = 29_000_000
    expected: dict[str, int] = {}
    plans: list[list[dict[tuple[str, int], int]]] = []
    rng = random.Random(37)
    for _ in range(4):  # four writers, five flushes each
        flushes = []
        for _ in range(5):
            counts = {
                (name, minute + rng.randrange(3)): rng.randrange(1, 4)
                for name in rng.sample(names, 300)
            }
            for (name, _), count in counts.items():
                expected[name] = expected.get(name, 0) + count
            flushes.append(counts)
        plans.append(flushes)
    errors: list[BaseException] = []
    start = threading.Barrier(len(plans))

    def writer(k: int, flushes: list[dict[tuple[str, int], int]]) -> None:
        try:
            start.wait()
            for r, counts in enumerate(flushes):
                assert storage.write_counts(counts, f"writer{k}:{r}") is True
        except BaseException as exc:  # a deadlock is an OperationalError in this thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(k, f)) for k, f in enumerate(plans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert dict(Series.objects.values_list("name", "total")) == expected
    per_series: dict[str, int] = {}
    for name, count in Bucket.objects.values_list("series__name", "count"):
        per_series[name] = per_series.get(name, 0) + count
    assert per_series == expected
