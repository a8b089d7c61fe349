"""Settings of the event-loop test's site (``test_async_loop``), served by uvicorn as
``django.core.asgi:get_asgi_application`` (``--factory``); its URLs and async views are
:mod:`tests.reliability.async_urls`.

* ``RELIABILITY_COUNTERS``: ``memcached`` (``MEMCACHED_SERVERS``, one node or several
  separated by commas), ``redis`` or ``redis-cluster`` (``RELIABILITY_REDIS``: the server,
  or one node of the cluster), where the limiter keeps its counters
  (:func:`~tests.reliability.common.counter_caches`, and ``RATELIMIT_BACKEND`` for the
  cluster: :func:`~tests.reliability.common.counter_backend`): the test points them at
  proxies that make every answer late;
* ``RELIABILITY_SQLITE``: the database file, migrated before the start.
"""

from __future__ import annotations

import os

from tests.reliability.common import counter_backend, counter_caches

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
RATELIMIT_BACKEND = counter_backend()  # (None: the backend that fits the cache)
RATELIMIT_RULES = [{"name": "async-ruled", "path": "/ruled/", "key": KEY, "rate": HUGE}]
SILENCED_SYSTEM_CHECKS = ["ratelimit_app.W001"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
