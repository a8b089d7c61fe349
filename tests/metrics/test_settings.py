"""Where the metrics live, and the downsample lock's constants.

* a database router (docs/deployment.rst's): flushes, queries, downsampling and the admin use
  the alias it chooses for metrics_app's models;
* the downsample lock lives in the ``"default"`` cache (here a real Redis);
* ``rollup.LOCK_TTL`` (a constant): the lock's lifetime, so a crashed run blocks the next for
  that long;
* ``rollup.DOWNSAMPLE_BATCH_SIZE`` (a constant): rows folded per transaction.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.core.cache import caches
from django.db import connections
from django.db.models import Model
from django.db.utils import load_backend
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse

import metrics_app
from metrics_app import query, rollup
from metrics_app.models import Bucket, FlushLedger, Series, TopKey
from metrics_app.testing import FrozenClock

DAY = 86400
ELSEWHERE = "metrics_elsewhere"


@pytest.fixture
def metrics_database(db: None, tmp_path: Path) -> Iterator[str]:
    """A second SQLite database, with the metrics tables, under the alias :data:`ELSEWHERE`.

    The connection is made here rather than declared in ``DATABASES``: Django's test case
    only lets a test reach the aliases it was set up with, and allows connections made
    while it runs. Not in the test's transaction: a file of its own, thrown away with
    ``tmp_path``.
    """
    entry = connections.configure_settings(
        {
            "default": {"ENGINE": "django.db.backends.sqlite3"},
            ELSEWHERE: {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "m.db")},
        }
    )[ELSEWHERE]
    wrapper = load_backend(entry["ENGINE"]).DatabaseWrapper(entry, ELSEWHERE)
    connections[ELSEWHERE] = wrapper
    try:
        with wrapper.schema_editor() as editor:
            for model in (Series, Bucket, FlushLedger, TopKey):
                editor.create_model(model)
        yield ELSEWHERE
    finally:
        wrapper.close()
        del connections[ELSEWHERE]


class MetricsRouter:
    """docs/deployment.rst's router, for the alias :data:`ELSEWHERE`."""

    def db_for_read(self, model: type[Model], **hints: object) -> str | None:
        return ELSEWHERE if model._meta.app_label == "metrics_app" else None

    db_for_write = db_for_read


@pytest.mark.django_db
def test_a_routed_database_receives_the_flushes_and_serves_every_read(
    metrics_database: str, clock: FrozenClock
) -> None:
    with override_settings(DATABASE_ROUTERS=[MetricsRouter()]):
        metrics_app.record("routed", 3)
        metrics_app.record("routed", 4, at=clock.t - 3 * DAY)
        assert metrics_app.flush() == 2
        # Reads and downsampling go to the same alias.
        assert query.total("routed") == 7
        assert query.top(1) == [("routed", 7)]
        assert rollup.downsample().folded == 2  # a minute, into 5 minutes, into an hour
        resolutions = Bucket.objects.using(metrics_database).values_list("resolution", flat=True)
        assert sorted(resolutions) == [60, 3600]
        # The admin lists and charts the series from there too.
        admin = Client()
        admin.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
        listing = admin.get(reverse("admin:metrics_app_series_changelist"))
        assert listing.status_code == 200
        assert b"routed" in listing.content
        series = Series.objects.using(metrics_database).get(name="routed")
        page = admin.get(reverse("admin:metrics_app_series_change", args=[series.pk]))
        assert page.status_code == 200
        assert b"routed" in page.content
    assert series.total == 7
    assert FlushLedger.objects.using(metrics_database).count() == 1
    # Nothing of it in the default database.
    assert not Series.objects.using("default").exists()
    assert not Bucket.objects.using("default").exists()
    assert not FlushLedger.objects.using("default").exists()


@pytest.fixture
def redis_locks(redis_server: str) -> Iterator[str]:
    """The default cache on the session's Redis, beside a local cache ``"local"``."""
    caches_setting = {
        "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server},
        "local": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "bucketry-tests",
        },
    }
    with override_settings(CACHES=caches_setting):
        caches["default"].delete(rollup.LOCK_KEY)
        yield "default"
        caches["default"].delete(rollup.LOCK_KEY)


def due_minutes(clock: FrozenClock, n: int, name: str = "a") -> None:
    """``n`` minute buckets of ``name``, all old enough to be folded."""
    for k in range(n):
        metrics_app.record(name, at=clock.t - 2 * DAY - k * 60)
    metrics_app.flush()


@pytest.mark.db_matrix
@pytest.mark.django_db
def test_the_default_cache_holds_the_downsample_lock(redis_locks: str, clock: FrozenClock) -> None:
    due_minutes(clock, 3)
    seen: list[tuple[object, object]] = []

    def during_the_run(message: str) -> None:
        seen.append(
            (caches[redis_locks].get(rollup.LOCK_KEY), caches["local"].get(rollup.LOCK_KEY))
        )

    rollup.downsample(progress=during_the_run)
    assert seen and all(isinstance(token, str) and other is None for token, other in seen)
    assert caches[redis_locks].get(rollup.LOCK_KEY) is None  # released at the end
    # A lock held in the default cache stops a run; the same key in another cache does not.
    caches["local"].add(rollup.LOCK_KEY, "elsewhere", 60)
    try:
        due_minutes(clock, 1, "b")
        assert rollup.downsample().folded == 1
        caches[redis_locks].add(rollup.LOCK_KEY, "another run", 60)
        due_minutes(clock, 1, "c")
        assert rollup.downsample().skipped
    finally:
        caches["local"].delete(rollup.LOCK_KEY)


@pytest.mark.db_matrix
@pytest.mark.django_db
def test_lock_ttl_is_the_locks_lifetime_and_each_batch_renews_it(
    redis_locks: str, clock: FrozenClock
) -> None:
    due_minutes(clock, 6)
    lock_cache = caches[redis_locks]
    ttls: list[int] = []

    def during_the_run(message: str) -> None:
        ttls.append(lock_cache.ttl(rollup.LOCK_KEY))
        lock_cache.touch(rollup.LOCK_KEY, 5)  # the next batch must renew it to the full TTL

    rollup.downsample(batch_size=2, progress=during_the_run)
    assert len(ttls) >= 3
    assert all(rollup.LOCK_TTL - 4 <= ttl <= rollup.LOCK_TTL for ttl in ttls), ttls


@pytest.mark.db_matrix
@pytest.mark.django_db
def test_a_crashed_runs_lock_expires_after_the_lock_ttl(
    redis_locks: str, clock: FrozenClock
) -> None:
    due_minutes(clock, 2)
    with mock.patch.object(rollup, "LOCK_TTL", 1):
        crashed = rollup._Lock()  # a run that took the lock and died without releasing it
        assert crashed.acquire()
        assert rollup.downsample().skipped
        time.sleep(1.2)
        result = rollup.downsample()
    assert not result.skipped and result.folded >= 2


@pytest.mark.db_matrix
@pytest.mark.django_db
def test_downsample_batch_size_is_the_rows_per_transaction(clock: FrozenClock) -> None:
    due_minutes(clock, 50)
    progress: list[str] = []
    with (
        mock.patch.object(rollup, "DOWNSAMPLE_BATCH_SIZE", 7),
        CaptureQueriesContext(connections["default"]) as queries,
    ):
        result = rollup.downsample(progress=progress.append)
    minute_tier = [m for m in progress if m.startswith("tier 1m:1d:")]
    # Partial progress, one batch at a time: 7 rows each, the last one what is left.
    assert [int(m.split()[2]) for m in minute_tier] == [7, 14, 21, 28, 35, 42, 49, 50]
    assert result.folded >= 50
    # One transaction per batch: the savepoints (inside the test's transaction) say so.
    savepoints = [q for q in queries.captured_queries if q["sql"].startswith("SAVEPOINT")]
    assert len(savepoints) >= 8
