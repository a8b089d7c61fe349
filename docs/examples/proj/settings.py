"""The settings of ``proj``: what metrics_app and Celery need, and little else.

A real project's settings have more; ``docs/celery.rst`` shows the Celery part.
"""

from __future__ import annotations

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "docs-example-not-secret")
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "ratelimit_app",
    "metrics_app",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True

# The limiter's counters, as the quickstart sets them up. Celery changes nothing here.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": "127.0.0.1:11211",
    },
}

# -- Celery ------------------------------------------------------------------------------
# The broker every process sends to (web processes too) and the workers read from.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/1")
# metrics_app's tasks return their counts for a caller that waits; the beat never does.
CELERY_TASK_IGNORE_RESULT = True
# -- end of Celery -----------------------------------------------------------------------
