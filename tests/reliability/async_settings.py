"""Settings of the event-loop test's site (``test_async_loop``), served by uvicorn as
``django.core.asgi:get_asgi_application`` (``--factory``); its URLs and async views are
:mod:`tests.reliability.async_urls`.

* ``RELIABILITY_COUNTERS``: ``memcached`` (``MEMCACHED_SERVERS``) or ``redis``
  (``RELIABILITY_REDIS``), where the limiter keeps its counters
  (:func:`~tests.reliability.common.counter_caches`): the test points them at a proxy that
  makes every answer late;
* ``RELIABILITY_SQLITE``: the database file, migrated before the start.
"""

from __future__ import annotations

import os

from tests.reliability.common import counter_caches

#: A rate no test reaches: every request is counted, and admitted.
HUGE = "1000000/s"
#: The subject of both limits: a header, which the engine reads safely on the event loop
#: (``ASYNC_SAFE_ACCESSORS``, ratelimit_app/config/limits.py).
CLIENT_HEADER = "X-Client"
KEY = f"header:{CLIENT_HEADER.lower()}"

SECRET_KEY = "django-bucketry-reliability-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "ratelimit_app"]
MIDDLEWARE = ["ratelimit_app.middleware.RatelimitMiddleware"]
ROOT_URLCONF = "tests.reliability.async_urls"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("RELIABILITY_SQLITE", ""),
    }
}
CACHES = counter_caches()
RATELIMIT_USE_CACHE = "ratelimit"
RATELIMIT_RULES = [{"name": "async-ruled", "path": "/ruled/", "key": KEY, "rate": HUGE}]
SILENCED_SYSTEM_CHECKS = ["ratelimit_app.W001"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
