"""Django REST framework's throttles, counted on our sliding windows (or a leaky bucket).

``rest_framework.throttling`` keeps a list of timestamps per client in the cache, read and
written back without a lock: concurrent requests lose each other's updates, and every
request pickles the whole list. The classes here have DRF's names and hooks, so switching is
a change of module path::

    REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": [
            "ratelimit_app.throttling.AnonRateThrottle",
            "ratelimit_app.throttling.UserRateThrottle",
        ],
        "DEFAULT_THROTTLE_RATES": {"anon": "100/d", "user": "10/m;1000/d"},
    }

The rooms: :mod:`.throttles` (the classes and what a request does with them),
:mod:`.limits` (the limit a throttle counts with, for the operator's tools) and
:mod:`.problems` (what the system checks report). Importing this package registers the
throttles with :mod:`ratelimit_app.config.sources`, where the operations, the admin and the
system checks find them without importing DRF. See ``docs/drf.rst`` for the differences from
DRF's classes.
"""

from __future__ import annotations

try:
    import rest_framework  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "ratelimit_app.throttling needs Django REST framework: pip install 'django-bucketry[drf]'"
    ) from exc

from ratelimit_app.config import sources
from ratelimit_app.throttling.limits import (
    NoRate,
    lookup,
    reset,
    resolve,
    scope_limits,
    throttle_limit,
)
from ratelimit_app.throttling.problems import problems
from ratelimit_app.throttling.throttles import (
    AnonRateThrottle,
    BaseThrottle,
    ScopedRateThrottle,
    SimpleRateThrottle,
    ThrottleUnavailable,
    UserRateThrottle,
)

__all__ = [
    "AnonRateThrottle",
    "BaseThrottle",
    "NoRate",
    "ScopedRateThrottle",
    "SimpleRateThrottle",
    "ThrottleUnavailable",
    "UserRateThrottle",
    "lookup",
    "problems",
    "reset",
    "scope_limits",
    "throttle_limit",
]

sources.register(
    sources.DRF, kind="DRF throttle", limits=scope_limits, problems=problems, resolve=resolve
)
