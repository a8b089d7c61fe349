"""A site for the multiprocess scrape test (``test_prometheus_multiproc``): settings, URLs
and a view in one module, served by gunicorn as ``django.core.wsgi:get_wsgi_application()``.

``/limited/`` is behind one rule of :data:`LIMIT` requests a minute for every client (all
come from 127.0.0.1), counted on the session's memcached (``MEMCACHED_SERVERS``), so that
the workers share the counters; ``/metrics`` is :func:`metrics_app.views.prometheus`. The
metrics buffer flushes to a SQLite file (``RELIABILITY_SQLITE``), migrated before the start.
"""

from __future__ import annotations

import os
import time

from django.http import HttpRequest, HttpResponse
from django.urls import path

LIMIT = 5
RULE = "multiproc"
#: Seconds an admitted request takes.
SLOW = 0.2


def limited(request: HttpRequest) -> HttpResponse:
    time.sleep(SLOW)  # holds its worker: requests sent at once reach every worker
    return HttpResponse("ok")


def metrics(request: HttpRequest) -> HttpResponse:
    # Imported here: this module is the settings too, read before the apps are ready.
    from metrics_app.views import prometheus

    return prometheus(request)


urlpatterns = [path("limited/", limited), path("metrics", metrics)]

SECRET_KEY = "django-bucketry-reliability-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "ratelimit_app",
    "metrics_app",
]
MIDDLEWARE = ["ratelimit_app.middleware.RatelimitMiddleware"]
ROOT_URLCONF = __name__
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("RELIABILITY_SQLITE", ""),
    }
}
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "ratelimit": {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": os.environ.get("MEMCACHED_SERVERS", "").split(","),
    },
}
RATELIMIT_USE_CACHE = "ratelimit"
RATELIMIT_RULES = [{"name": RULE, "path": "/limited/", "key": "ip", "rate": f"{LIMIT}/m"}]
SILENCED_SYSTEM_CHECKS = ["ratelimit_app.W001", "metrics_app.W001"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
