"""The Celery app of the test worker (``celery -A tests.metrics.celery_app worker``).

It is a normal Django + Celery wiring (what a site does in ``proj/celery.py``) plus two
test-only tasks that let a test seed and read the worker's own database.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.metrics.worker_settings")
django.setup()

from django.conf import settings  # noqa: E402

from metrics_app import tasks  # noqa: E402
from metrics_app.buffer import flusher, process  # noqa: E402
from metrics_app.tasks import beat_schedule  # noqa: E402

app = Celery(
    "metrics-tests", broker=settings.CELERY_BROKER_URL, backend=settings.CELERY_BROKER_URL
)
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    beat_schedule=beat_schedule(),
)
app.set_default()

# As in the test process: no flusher thread (the seed task flushes), no SIGTERM handler.
flusher.FLUSH_INTERVAL = 0
process.HANDLE_SIGTERM = False

__all__ = ["app", "tasks"]


@app.task(name="tests.ping")
def ping() -> str:
    return "pong"


@app.task(name="tests.seed")
def seed(events: list[tuple[str, float, int]]) -> int:
    """Record ``(name, unix seconds, count)`` events in the worker and flush them."""
    import metrics_app

    for name, t, count in events:
        metrics_app.record(name, count, at=t)
    return metrics_app.flush()


@app.task(name="tests.snapshot")
def snapshot(name: str, start: float, end: float, step: int | None = None) -> dict[str, Any]:
    """The worker's view of a series: query answer, total and stored resolutions."""
    from metrics_app import query
    from metrics_app.models import Bucket

    points = query.series(
        name,
        datetime.fromtimestamp(start, tz=UTC),
        datetime.fromtimestamp(end, tz=UTC),
        step=step,
    )
    return {
        "points": [[p.timestamp(), c] for p, c in points],
        "total": query.total(name),
        "resolutions": sorted(
            set(Bucket.objects.filter(series__name=name).values_list("resolution", flat=True))
        ),
    }
