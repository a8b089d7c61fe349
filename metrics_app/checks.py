"""System checks for the ``METRICS_*`` settings. Every ID is listed here, once.

Documented in ``docs/metrics.rst`` (section "System checks").
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from metrics_app.conf import DEFAULTS, parse_buffer
from metrics_app.retention import parse_retention

#: Check ID -> what it means (docs/metrics.rst lists the same).
CHECK_IDS: dict[str, str] = {
    "metrics_app.E001": "METRICS_RETENTION does not parse or breaks whisper's rules.",
    "metrics_app.E004": "METRICS_BUFFER is neither 'memory', 'redis' nor 'redis:<alias>'.",
    "metrics_app.E005": "METRICS_BUFFER names no django-redis cache.",
    "metrics_app.W001": "The default cache is local to one process, so the downsample lock "
    "does not stop two processes.",
}

_LOCAL_CACHES = (
    "django.core.cache.backends.locmem.LocMemCache",
    "django.core.cache.backends.dummy.DummyCache",
)


def _get(name: str) -> Any:
    return getattr(settings, name, DEFAULTS[name])


def _error(check_id: str, detail: str) -> Error:
    return Error(f"{CHECK_IDS[check_id]} {detail}", id=check_id)


def _retention() -> list[CheckMessage]:
    try:
        parse_retention(_get("METRICS_RETENTION"))
    except ValueError as exc:
        return [_error("metrics_app.E001", f"{_get('METRICS_RETENTION')!r}: {exc}")]
    return []


def _buffer() -> list[CheckMessage]:
    value = _get("METRICS_BUFFER")
    try:
        alias = parse_buffer(value)
    except ValueError:
        return [_error("metrics_app.E004", f"Got {value!r}.")]
    if alias is None:
        return []
    if alias not in settings.CACHES:
        return [_error("metrics_app.E005", f"Got {value!r}: CACHES has no alias {alias!r}.")]
    backend = settings.CACHES[alias].get("BACKEND", "")
    if not backend.startswith("django_redis."):
        return [
            _error(
                "metrics_app.E005",
                f"Got {value!r}: CACHES[{alias!r}] has BACKEND {backend!r}; the Redis buffer "
                "needs django_redis.cache.RedisCache for HINCRBY and its Lua script.",
            )
        ]
    return []


def _lock_cache() -> list[CheckMessage]:
    # The downsample lock lives in the default cache (Django's own check requires one).
    if settings.CACHES.get("default", {}).get("BACKEND") in _LOCAL_CACHES:
        return [
            Warning(
                CHECK_IDS["metrics_app.W001"],
                hint="Point CACHES['default'] at Redis or memcached when several processes "
                "(Celery workers, beat, cron) may downsample.",
                id="metrics_app.W001",
            )
        ]
    return []


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    return [message for check in (_retention, _buffer, _lock_cache) for message in check()]
