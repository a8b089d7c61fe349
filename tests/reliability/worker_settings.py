"""Settings of the metrics subprocesses of the fault tests (``tests.reliability.worker``).

The database comes from ``RELIABILITY_DB`` (a JSON ``DATABASES`` entry); the downsampling
lock's cache from ``RELIABILITY_LOCK_CACHE`` (a memcached address shared by the processes, or
empty: local memory, one lock per process, so two runs really run at once).
"""

from __future__ import annotations

import json
import os

from tests.settings import *  # noqa: F403

DATABASES = {"default": json.loads(os.environ["RELIABILITY_DB"])}
_lock_cache = os.environ.get("RELIABILITY_LOCK_CACHE", "")
CACHES = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": _lock_cache,
        }
        if _lock_cache
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    ),
}
# The flusher's interval (RELIABILITY_FLUSH_INTERVAL, else no thread) is set by
# tests.reliability.worker; the SIGTERM handler is installed (metrics_app's default).
if os.environ.get("RELIABILITY_REDIS"):  # to drain the Redis buffer of the gunicorn site
    CACHES["buffer"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["RELIABILITY_REDIS"],
    }
    METRICS_BUFFER = "redis:buffer"
