"""Settings for the demo site. Not for production: DEBUG defaults on, the key is public."""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-bucketry-demo-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "true").strip().lower() in {"1", "true", "yes", "on"}
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ratelimit_app",
    "metrics_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "ratelimit_app.middleware.RatelimitMiddleware",
]

ROOT_URLCONF = "demo_site.urls"
WSGI_APPLICATION = "demo_site.wsgi.application"
ASGI_APPLICATION = "demo_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The database lives under var/ (git-ignored), so `make clean` can wipe the demo state.
VAR_DIR.mkdir(exist_ok=True)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": VAR_DIR / "demo.sqlite3",
    },
}

# Counters: local memory by default, so the demo needs no server (each process counts on
# its own). MEMCACHED_SERVERS="127.0.0.1:11211,..." or REDIS_URL="redis://..." switch the
# limiter to a shared store.
MEMCACHED_SERVERS = [s for s in os.environ.get("MEMCACHED_SERVERS", "").split(",") if s.strip()]
REDIS_URL = os.environ.get("REDIS_URL", "").strip()
if MEMCACHED_SERVERS:
    RATELIMIT_CACHE = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": MEMCACHED_SERVERS,
    }
elif REDIS_URL:
    RATELIMIT_CACHE = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL}
else:
    RATELIMIT_CACHE = {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "bucketry-demo-ratelimit",
    }
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "bucketry-demo",
    },
    "ratelimit": RATELIMIT_CACHE,
}
RATELIMIT_USE_CACHE = "ratelimit"
RATELIMIT_FAIL_OPEN = True  # the demo stays up when a counter server goes away
# Limits without decorators (docs/rules.rst): wrong passwords on the admin login, per account
# and per IP (each alone is weak: see the docs). Only failed logins count.
RATELIMIT_RULES = [
    {
        "name": "admin-login-account",
        "path": "/admin/login/",
        "methods": ["POST"],
        "key": "post:username",
        "rate": "5/m;10/d",
        "count": "failures",
    },
    {
        "name": "admin-login-ip",
        "path": "/admin/login/",
        "methods": ["POST"],
        "key": "ip",
        "rate": "30/h",
        "count": "failures",
    },
]

# Local memory on purpose: the demo runs without servers (one web process, one worker).
SILENCED_SYSTEM_CHECKS = ["ratelimit_app.W001", "metrics_app.W001"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "/static/"
