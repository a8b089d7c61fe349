"""Settings of the load bench (``bench/claims/load.py``): demo_site's, plus bench URLs and rules.

Everything of the demo stays as it is (its middleware, its rules, its database and caches from
the environment: ``DATABASE_URL``, ``MEMCACHED_SERVERS``, ``REDIS_URL``, ``DEBUG``); the bench
adds its own URLconf (:mod:`bench.load_urls`, which includes the demo's) and three rules on
``/bench/rules/``. Every limit is huge: wrk sends every request from one address, one subject,
and nothing may be refused, so that each request does a check's full work.

The site's modules (this one, :mod:`bench.load_urls`, :mod:`bench.load_floor`) keep these
names in every revision: ``bench/claims/load_ab.py`` serves an older revision's tree with this
tree's ``DJANGO_SETTINGS_MODULE``.
"""

from __future__ import annotations

from demo_site.settings import *  # noqa: F403 (the demo's settings, as they are)
from demo_site.settings import RATELIMIT_RULES as DEMO_RULES

ROOT_URLCONF = "bench.load_urls"

# Both libraries' instruments, as every figure of docs/performance was measured: the dev
# group now installs OpenTelemetry's Prometheus exporter (the docs' snippets run it), with
# which "auto" would make prometheus-client's alone, and the counts would drop for that.
RATELIMIT_TELEMETRY = "both"

# The floor case (bench.load_floor): one round trip where RatelimitMiddleware sits.
MIDDLEWARE = [*MIDDLEWARE, "bench.load_floor.RoundTripFloor"]  # noqa: F405

# Persistent database connections, as a production site keeps them (or a pooler does): the
# demo's settings open one per request, which under load costs more than the whole request
# (a PostgreSQL backend process forked per connection).
DATABASES["default"]["CONN_MAX_AGE"] = 600  # noqa: F405
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # noqa: F405

#: Requests per window of every bench limit (a rule and a django-ratelimit decorator alike).
HUGE = 1_000_000_000
RULES_PATH = "/bench/rules/"

RATELIMIT_RULES = [
    *DEMO_RULES,
    {"name": "bench-ip-m", "path": RULES_PATH, "key": "ip", "rate": f"{HUGE}/m"},
    {"name": "bench-email-h", "path": RULES_PATH, "key": "email", "rate": f"{HUGE}/h"},
    {"name": "bench-ip-d", "path": RULES_PATH, "key": "ip", "rate": f"{HUGE}/d"},
    # One rule alone (bench.instructions' one-rule case: what each further rule adds).
    {"name": "bench-one", "path": "/bench/one/", "key": "ip", "rate": f"{HUGE}/m"},
    # One leaky bucket (bench.claims.memos: the memos its check reads).
    {
        "name": "bench-leaky",
        "path": "/bench/leaky/",
        "key": "ip",
        "rate": f"{HUGE}/m",
        "algorithm": "leaky_bucket",
    },
    # Floods: every client over its limit after its first request, so nearly every request
    # of a timed run is refused (429). The botnet's clients come through X-Forwarded-For.
    {"name": "bench-flood", "path": "/bench/flood/", "key": "ip", "rate": "1/h"},
    {"name": "bench-botnet", "path": "/bench/botnet/", "key": "ip", "rate": "1/h"},
]

# wrk (the botnet case) names its clients in X-Forwarded-For; every other case sends none,
# so its client is the connection's address (127.0.0.1, one subject).
RATELIMIT_TRUSTED_PROXIES = ["127.0.0.1"]
