"""The demo's Celery app: ``celery -A demo_site worker -B`` runs metrics_app's downsampling.

The broker is Redis when ``REDIS_URL`` is set, else kombu's filesystem transport in the state
directory (see ``demo_site.settings``); results are not kept. The beat schedule is
metrics_app's (:func:`metrics_app.tasks.beat_schedule`): a downsample every 5 minutes, and the
Redis buffer's drain when ``METRICS_BUFFER = "redis"``.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_site.settings")

app = Celery("demo_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _add_beat_schedule(sender: Celery, **kwargs: object) -> None:
    # Once the Django settings are read (beat_schedule() reads METRICS_BUFFER), not at import.
    from metrics_app.tasks import beat_schedule

    sender.conf.beat_schedule = {**sender.conf.beat_schedule, **beat_schedule()}
