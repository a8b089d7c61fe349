"""Settings of the demo site (``make demo``): a URL shortener and accounts behind rate limits.

Not for production as they stand: DEBUG defaults on and the superuser is demo/demo. Every
server is optional and chosen from the environment (:mod:`demo_site.env` parses it and names
the variable when a value is wrong):

* ``DATABASE_URL``: ``postgres://user:password@host:port/name`` or ``sqlite:///path``;
  default, a SQLite file in the state directory;
* ``MEMCACHED_SERVERS``: ``host:port,host:port``: the rate-limit counters go there;
* ``REDIS_URL``: the default cache (the downsample lock) and Celery's broker go there (the
  counters too, without memcached); default, local memory and a filesystem broker;
* ``DEBUG`` (default true), ``ALLOWED_HOSTS`` (comma-separated), ``SECRET_KEY`` (default: one
  generated on first use and kept in ``<state dir>/secret_key``);
* ``DEMO_STATE_DIR``: where the demo keeps its files (default ``.demo`` in the project, git
  ignored; a relative path is taken from the project directory).
"""

from __future__ import annotations

import os
from pathlib import Path

import django

from demo_site import env

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = env.state_dir(os.environ, BASE_DIR)

SECRET_KEY = env.secret_key(os.environ, STATE_DIR / "secret_key")
DEBUG = env.get_bool(os.environ, "DEBUG", True)
ALLOWED_HOSTS = env.get_list(os.environ, "ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])

INSTALLED_APPS = [
    "demo_site.shortener",
    "demo_site.accounts",
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
    # After AuthenticationMiddleware, so that rules keyed on the user see who it is.
    "ratelimit_app.middleware.RatelimitMiddleware",
]

ROOT_URLCONF = "demo_site.urls"
WSGI_APPLICATION = "demo_site.wsgi.application"
ASGI_APPLICATION = "demo_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # First: the base template, and the pages this site restyles (the 429 of
        # ratelimit_app, the log-in and password-reset pages the admin would otherwise give).
        "DIRS": [BASE_DIR / "demo_site" / "templates"],
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

_database_url = os.environ.get("DATABASE_URL", "").strip()
DATABASES = {
    "default": (
        env.parse_database_url(_database_url, base_dir=BASE_DIR)
        if _database_url
        else env.sqlite_database(STATE_DIR / "db.sqlite3")
    ),
}

MEMCACHED_SERVERS = env.parse_memcached_servers(os.environ.get("MEMCACHED_SERVERS", ""))
_redis_url = os.environ.get("REDIS_URL", "").strip()
REDIS_URL = env.parse_redis_url(_redis_url) if _redis_url else None
CACHES = env.caches(MEMCACHED_SERVERS, REDIS_URL)

# Local memory is fine for one web process and one worker, and needs no server: say so
# instead of warning on every start.
SILENCED_SYSTEM_CHECKS = env.silenced_checks(CACHES)

# -- Rate limits (docs/rules.rst): the demo's scenarios, as rules the middleware applies. ----
RATELIMIT_USE_CACHE = "ratelimit"
RATELIMIT_FAIL_OPEN = True  # the demo stays up when a counter server goes away
# What fails, for the "failures" rules: a 404 (the "shorturl-scan" rule counts the keys a
# client guesses wrong) and a 401 (a refused HTTP Basic password on the API). Wrong passwords
# are told by Django's user_login_failed, which every door that checks one sends. Not 400 or
# 403: a form with errors or a failed CSRF check tries no password, and a 400 from the API's
# POST with the right password must not count as a wrong one.
RATELIMIT_FAILURE_STATUSES = [401, 404]
# Every door that checks a password (demo_site/accounts/passwords.py): the log-in forms, the
# password changes (the old password), and the JSON API's HTTP Basic, which the API reads on
# POST only. The log-in rules cover them all: one budget per account whichever is used.
PASSWORD_DOORS = [
    "/accounts/login/",
    "/admin/login/",
    "/accounts/password_change/",
    "/admin/password_change/",
    "/api/",
]
RATELIMIT_RULES = [
    # Wrong passwords per account and client address together: 5 a minute and 20 a day. A
    # stranger who uses them up locks out their own address, not the account's owner. The
    # account is the one the door checks (the log-in form's username, the signed-in user,
    # the Basic user name), compared like an email: case and spaces do not matter.
    {
        "name": "login-pair",
        "path": PASSWORD_DOORS,
        "methods": ["POST"],
        "key": "demo_site.accounts.passwords.account_and_address",
        "rate": "5/m;20/d",
        "count": "failures",
        # While the counter server is down, each process counts these guesses in its own
        # memory (at most 5 a minute per process) instead of letting every guess through
        # (docs/operators.rst, "Counting in memory during an outage").
        "fallback": "memory",
    },
    # ...and per account from every address: 100 a day stops a botnet that spreads its
    # guesses over many addresses. Locking the owner out takes 100 wrong passwords from at
    # least five addresses (docs/rules.rst, "Three limits on the log-in").
    {
        "name": "login-account",
        "path": PASSWORD_DOORS,
        "methods": ["POST"],
        "key": "demo_site.accounts.passwords.account",
        "rate": "100/d",
        "count": "failures",
    },
    # ...and per client address, so that one address cannot spray many accounts.
    {
        "name": "login-ip",
        "path": PASSWORD_DOORS,
        "methods": ["POST"],
        "key": "ip",
        "rate": "20/m;200/d",
        "count": "failures",
    },
    # Password-reset emails: 5 an hour per address (every request counts, whether the
    # address has an account or not, so the answer gives nothing away)...
    {
        "name": "password-reset",
        "path": "/accounts/password_reset/",
        "methods": ["POST"],
        "key": "email",
        "rate": "5/h",
    },
    # ...and 10 an hour, 30 a day per client address, whatever the addresses asked for: one
    # client cannot mail every account it knows of.
    {
        "name": "password-reset-ip",
        "path": "/accounts/password_reset/",
        "methods": ["POST"],
        "key": "ip",
        "rate": "10/h;30/d",
    },
    # Sign-ups: 20 a day per client address.
    {
        "name": "signup",
        "path": "/accounts/signup/",
        "methods": ["POST"],
        "key": "ip",
        "rate": "20/d",
    },
    # ...and a stricter sign-up limit on trial, run dry: it refuses nothing, and the log
    # ("dry run: signup-strict would refuse ...") and the admin's "would refuse" chart show
    # whom it would stop before anyone switches it on (docs/operators.rst, "Dry run").
    {
        "name": "signup-strict",
        "path": "/accounts/signup/",
        "methods": ["POST"],
        "key": "ip",
        "rate": "3/h",
        "shadow": True,
    },
    # A link's page draws its charts from the database: it costs ten of the hour's 300 page
    # views per client address, and at most three of them are drawn at once for an address
    # (docs/operators.rst, "Cost" and "Requests in flight"); the redirect is not limited here.
    {
        "name": "link-pages",
        "path": "/links/",
        "methods": ["GET", "HEAD"],
        "key": "ip",
        "rate": "300/h",
        "cost": 10,
        "concurrent": 3,
        "lease": "30s",
    },
    # One message a second per user.
    {
        "name": "send-message",
        "path": "/messages/",
        "url_name": "send_message",
        "methods": ["POST"],
        "key": "user",
        "rate": "1/s",
    },
    # Short keys guessed wrong (404s) per client address: scanning the key space is slow.
    # Every door that tells whether a key exists counts, in one budget: the redirect, the
    # link's page and the API's visits (alternating between them gains nothing). GET and
    # HEAD only: the API's POST /api/links/ takes no key.
    # A scanner refused five times within ten minutes is banned from the whole site for 15
    # minutes, then 30, 60... up to a day (docs/operators.rst, "Bans").
    {
        "name": "shorturl-scan",
        "path": ["/s/", "/links/", "/api/links/"],
        "methods": ["GET", "HEAD"],
        "key": "ip",
        "rate": "30/m;300/d",
        "count": "failures",
        "ban": {"after": 5, "within": "10m", "for": "15m", "max": "1d", "scope": "site"},
    },
]

# -- The JSON API (demo_site/api.py): Django REST framework on our sliding windows. ----------
# Switching from DRF's throttles is the module path in DEFAULT_THROTTLE_CLASSES (docs/drf.rst).
# DRF checks a password before any throttle runs: the log-in rules above hold the API's
# HTTP Basic, which it reads on POST only (the rules' method), to one budget per account.
# Creating a link counts in the shortener form's budget (shortener/views.py, CREATE_LIMIT).
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "demo_site.authentication.BasicAuthenticationOnPost",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_THROTTLE_CLASSES": [
        "ratelimit_app.throttling.AnonRateThrottle",
        "ratelimit_app.throttling.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "anon": "30/m;1000/d",
        "user": "120/m;10000/d",
    },
}

# -- Metrics: visits per short link, flushed from memory every 10 s, downsampled by Celery. --
# (Both are metrics_app's defaults: the memory buffer, and the downsample lock in the
# "default" cache, which every process shares.)

# -- Celery: the worker runs metrics_app's downsampling on the beat schedule (celery.py). ----
CELERY_BROKER_URL, CELERY_BROKER_TRANSPORT_OPTIONS = env.celery_broker(
    REDIS_URL, STATE_DIR / "broker"
)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULE_FILENAME = str(STATE_DIR / "celerybeat-schedule")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# -- Accounts. --------------------------------------------------------------------------------
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "shortener:index"
LOGOUT_REDIRECT_URL = "shortener:index"
# Password-reset emails are printed by the web server (in the `make demo` terminal).
if django.VERSION >= (6, 1):  # MAILERS replaces EMAIL_BACKEND (which 6.1 warns about)
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}
else:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = "demo@localhost"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "/static/"
