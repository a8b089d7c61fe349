"""A small site for gunicorn (``tests.reliability.site_wsgi``), configured from the environment.

Self-contained on purpose: a test of the limiter across processes should not break when the
demo's pages change.
The apps and the middleware are the ones a project installs.

* ``RELIABILITY_DB``: a JSON ``DATABASES`` entry (PostgreSQL);
* ``RELIABILITY_REDIS``: a Redis URL (the metrics buffer with ``RELIABILITY_BUFFER=redis``, and
  the counters with ``RELIABILITY_COUNTERS=redis``);
* ``RELIABILITY_COUNTERS``: ``memcached`` (``MEMCACHED_SERVERS``), ``redis`` or ``locmem``;
* ``RELIABILITY_BUFFER``: ``memory`` or ``redis`` (``METRICS_BUFFER = "redis:buffer"``);
* ``RELIABILITY_FLUSH_INTERVAL``: the flusher's interval (``site_wsgi`` sets the constant).
"""

from __future__ import annotations

import json
import os

from tests.reliability.clients import LIMIT

SECRET_KEY = "django-bucketry-reliability-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "ratelimit_app",
    "metrics_app",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "ratelimit_app.middleware.RatelimitMiddleware",
]
ROOT_URLCONF = "tests.reliability.site_urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {"default": json.loads(os.environ["RELIABILITY_DB"])}

_redis = os.environ.get("RELIABILITY_REDIS", "")
_counters = os.environ.get("RELIABILITY_COUNTERS", "locmem")
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if _redis:
    CACHES["buffer"] = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": _redis}
if _counters == "memcached":
    CACHES["ratelimit"] = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": os.environ["MEMCACHED_SERVERS"].split(","),
    }
elif _counters == "redis":
    CACHES["ratelimit"] = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": _redis}
else:
    CACHES["ratelimit"] = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}

RATELIMIT_USE_CACHE = "ratelimit"
# One subject for every client (they all come from 127.0.0.1).
RATELIMIT_RULES = [{"name": "one-subject", "path": "/limited/", "key": "ip", "rate": f"{LIMIT}/m"}]

_buffer = os.environ.get("RELIABILITY_BUFFER", "memory")
METRICS_BUFFER = "redis:buffer" if _buffer == "redis" else _buffer
SILENCED_SYSTEM_CHECKS = ["ratelimit_app.W001", "metrics_app.W001"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
