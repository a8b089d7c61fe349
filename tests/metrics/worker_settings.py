"""Settings of the Celery worker subprocess started by the ``celery_worker`` fixture."""

from __future__ import annotations

import json
import os

from tests.settings import *  # noqa: F403

DATABASES = {"default": json.loads(os.environ["METRICS_WORKER_DB"])}
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["METRICS_TEST_REDIS"],
    },
}
# No flusher thread or SIGTERM handler in the worker: tests.metrics.celery_app says so.
CELERY_BROKER_URL = os.environ["METRICS_TEST_REDIS"]
