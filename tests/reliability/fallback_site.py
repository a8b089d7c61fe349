"""A site for the outage test (``test_fallback_outage``): settings, URLs and views in one
module, served by gunicorn as ``django.core.wsgi:get_wsgi_application()``.

``/login/`` answers 401 to a wrong password and 200 to the right one, behind a log-in rule of
:data:`LIMIT` wrong passwords a minute per username that counts in each worker's memory
while its counter server is down (``"fallback": "memory"``) and fails closed otherwise.
``/ping/`` has no limit. No database: the rules come from settings alone.

* ``RELIABILITY_COUNTERS``: ``memcached`` (``MEMCACHED_SERVERS``) or ``redis``
  (``RELIABILITY_REDIS``), where the limiter keeps its counters.
"""

from __future__ import annotations

import os

from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from tests.reliability.common import counter_caches

#: Wrong passwords a minute per username.
LIMIT = 5
PASSWORD = "right"


@csrf_exempt
def login(request: HttpRequest) -> HttpResponse:
    if request.POST.get("password") == PASSWORD:
        return HttpResponse("welcome", headers={"X-Pid": str(os.getpid())})
    return HttpResponse("wrong", status=401, headers={"X-Pid": str(os.getpid())})


def ping(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("login/", login), path("ping/", ping)]

SECRET_KEY = "django-bucketry-reliability-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "ratelimit_app"]
MIDDLEWARE = ["ratelimit_app.middleware.RatelimitMiddleware"]
ROOT_URLCONF = __name__
DATABASES: dict[str, dict[str, str]] = {}
CACHES = counter_caches()
RATELIMIT_USE_CACHE = "ratelimit"
RATELIMIT_RULES = [
    {
        "name": "login",
        "path": "/login/",
        "methods": ["POST"],
        "key": "post:username",
        "rate": f"{LIMIT}/m",
        "count": "failures",
        "fail_open": False,
        "fallback": "memory",
    }
]
SILENCED_SYSTEM_CHECKS = ["ratelimit_app.W001"]
USE_TZ = True
