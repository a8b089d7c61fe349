"""Celery tasks and the beat schedule.

Wire them into your Celery app (the demo does)::

    from metrics_app.tasks import beat_schedule
    app.conf.beat_schedule = {**app.conf.beat_schedule, **beat_schedule()}

Every task is also a plain function: ``downsample()`` runs in-process.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from metrics_app.conf import conf

#: Downsample every 5 minutes; drain the Redis buffer every 10 seconds.
BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    "metrics-downsample": {"task": "metrics_app.downsample", "schedule": 300.0},
    "metrics-flush-redis-buffer": {"task": "metrics_app.flush_redis_buffer", "schedule": 10.0},
}


def beat_schedule() -> dict[str, dict[str, Any]]:
    """:data:`BEAT_SCHEDULE`, without the Redis flush unless ``METRICS_BUFFER = "redis"``."""
    schedule = {k: dict(v) for k, v in BEAT_SCHEDULE.items()}
    if conf.BUFFER != "redis":
        schedule.pop("metrics-flush-redis-buffer")
    return schedule


@shared_task(name="metrics_app.downsample")
def downsample() -> dict[str, Any]:
    """Fold and expire everything due, for every series (one run at a time)."""
    from metrics_app import rollup

    return rollup.downsample().as_dict()


@shared_task(name="metrics_app.downsample_series")
def downsample_series(name: str) -> dict[str, Any]:
    """Fold and expire everything due for one series (sent by queries that find it due)."""
    from metrics_app import rollup

    return rollup.downsample(series_names=[name]).as_dict()


@shared_task(name="metrics_app.flush_redis_buffer")
def flush_redis_buffer() -> int:
    """Drain the shared Redis buffer into the database; returns the keys written."""
    from metrics_app import redis_buffer

    return redis_buffer.flush()
