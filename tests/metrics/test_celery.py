"""A real Celery worker (subprocess, Redis broker, its own database) runs the tasks."""

from __future__ import annotations

import time

import pytest
from django.core.cache import caches
from django.test.utils import override_settings

import metrics_app
from metrics_app.rollup import LOCK_KEY
from metrics_app.tasks import BEAT_SCHEDULE, beat_schedule
from tests.metrics.conftest import Worker
from tests.servers import wait_for

pytestmark = pytest.mark.db_matrix

DAY = 86400


def test_beat_schedule() -> None:
    assert BEAT_SCHEDULE["metrics-downsample"] == {
        "task": "metrics_app.downsample",
        "schedule": 300.0,
    }
    assert "metrics-flush-redis-buffer" not in beat_schedule()
    with override_settings(METRICS_BUFFER="redis"):
        assert beat_schedule()["metrics-flush-redis-buffer"]["task"] == (
            "metrics_app.flush_redis_buffer"
        )
    with override_settings(METRICS_BUFFER="redis:buffer"):  # another alias: the same
        assert "metrics-flush-redis-buffer" in beat_schedule()


def test_worker_downsamples_exactly_and_idempotently(celery_worker: Worker) -> None:
    now = time.time()
    events = [("w:a", now - k * 3600, k % 3 + 1) for k in range(0, 24 * 10)]
    expected = sum(c for _, _, c in events)
    assert celery_worker.call("tests.seed", events) == len(events)
    first = celery_worker.call("metrics_app.downsample")
    assert first["folded"] > 0
    assert not first["skipped"]
    second = celery_worker.call("metrics_app.downsample")
    assert (second["folded"], second["expired"]) == (0, 0)
    snap = celery_worker.call("tests.snapshot", "w:a", now - 11 * DAY, now + 60, 3600)
    assert sum(c for _, c in snap["points"]) == expected == snap["total"]
    assert snap["resolutions"] == [60, 300, 3600]


def test_worker_respects_the_lock(celery_worker: Worker, redis_server: str) -> None:
    now = time.time()
    celery_worker.call("tests.seed", [("w:lock", now - 5 * DAY, 2)])
    redis_cache = {
        "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server}
    }
    with override_settings(CACHES=redis_cache):
        lock_cache = caches["default"]
        assert lock_cache.add(LOCK_KEY, "held-by-the-test", 60)
        try:
            assert celery_worker.call("metrics_app.downsample")["skipped"] is True
        finally:
            lock_cache.delete(LOCK_KEY)
    assert celery_worker.call("metrics_app.downsample")["folded"] == 2


def test_query_finding_stale_buckets_schedules_downsample_series(celery_worker: Worker) -> None:
    now = time.time()
    celery_worker.call("tests.seed", [("w:slim", now - 3 * DAY, 4), ("w:other", now - 3 * DAY, 1)])
    # The worker's query sees minute buckets three days old and sends downsample_series.
    celery_worker.call("tests.snapshot", "w:slim", now - 4 * DAY, now, 3600)

    def folded() -> bool:
        snap = celery_worker.call("tests.snapshot", "w:slim", now - 4 * DAY, now, 3600)
        return bool(snap["resolutions"] == [3600])

    assert wait_for(folded, timeout=20, interval=0.3)
    snap = celery_worker.call("tests.snapshot", "w:other", now - 4 * DAY, now, 3600)
    assert snap["total"] == 1


def test_worker_drains_the_redis_buffer(celery_worker: Worker, redis_server: str) -> None:
    redis_cache = {
        "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server}
    }
    with override_settings(CACHES=redis_cache, METRICS_BUFFER="redis"):
        metrics_app.record("w:redis", 3)  # into Redis from the test process
        metrics_app.record("w:redis", 2)
    assert celery_worker.call("metrics_app.flush_redis_buffer") == 1
    now = time.time()
    snap = celery_worker.call("tests.snapshot", "w:redis", now - 600, now + 60, 60)
    assert snap["total"] == 5
    assert celery_worker.call("metrics_app.flush_redis_buffer") == 0
