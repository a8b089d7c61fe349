"""The project's Celery app: ``proj/celery.py``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
# Every CELERY_* setting, CELERY_BROKER_URL first, read when the app is first used.
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def add_metrics_schedule(sender: Celery, **kwargs: object) -> None:
    # Not at import time: proj/__init__.py imports this module while proj.settings is being
    # imported, and beat_schedule() reads a setting (METRICS_BUFFER).
    from metrics_app.tasks import beat_schedule

    sender.conf.beat_schedule = {**sender.conf.beat_schedule, **beat_schedule()}
