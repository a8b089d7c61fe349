"""Minimal Django settings for the test suite (``pytest`` picks them from pyproject)."""

from __future__ import annotations

import os
import tempfile

SECRET_KEY = "django-bucketry-tests-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ratelimit_app",
    "metrics_app",
    # The demo site's apps (tests/demo), so the test database has their tables.
    "demo_site.shortener",
    "demo_site.accounts",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # As a project installs it. With no rule configured it costs a prefix test; the live
    # server of the admin browser tests loads its middleware once, at start.
    "ratelimit_app.middleware.RatelimitMiddleware",
]

ROOT_URLCONF = "tests.urls"

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

# SQLite by default; `pytest --db=postgres` swaps in a throwaway PostgreSQL (see
# django_db_modify_db_settings in tests/conftest.py).
#
# The test database is a file, not SQLite's memory: Django ignores close() on an in-memory
# database (closing its last connection would destroy it), so the connections that our
# background threads close when they finish (the rules loader, the metrics flusher) stayed
# open until garbage-collected, which Python 3.13 reports as an unclosed database. One file
# per test process (engineers and CI may run several suites at once), which Django creates
# and deletes; synchronous=OFF since a crash may lose it whole.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": ":memory:",
        "OPTIONS": {"init_command": "PRAGMA synchronous=OFF"},
        "TEST": {
            "NAME": os.path.join(tempfile.gettempdir(), f"bucketry-tests-{os.getpid()}.sqlite3")
        },
    },
}

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "bucketry-tests",
    },
}

# Django 6.1 sends mail through MAILERS and warns (an error here) when a project has none;
# its test runner then swaps each mailer for the locmem backend, as Django 5.2's swaps
# EMAIL_BACKEND. Django 5.2 ignores this setting.
MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}

# MD5 is insecure and exactly what a test suite wants: fast logins.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = True
STATIC_URL = "/static/"

# No flusher thread or SIGTERM handler in the test process (rules record their blocks as
# metrics): tests flush by hand, under metrics_app.testing.manual_flush() (tests/conftest.py).

# Both sinks: the suite reads prometheus-client's registry and OpenTelemetry's in-memory
# reader. The dev group installs OpenTelemetry's exporters (the observability page's
# snippets run them), with which "auto" would choose prometheus-client's alone.
RATELIMIT_TELEMETRY = "both"
