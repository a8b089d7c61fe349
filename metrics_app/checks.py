"""System checks for the ``METRICS_*`` settings. Every ID is listed here, once.

Documented in ``docs/metrics.rst`` (section "System checks").
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from metrics_app.conf import DEFAULTS
from metrics_app.retention import parse_retention

#: Check ID -> what it means (docs/metrics.rst lists the same).
CHECK_IDS: dict[str, str] = {
    "metrics_app.E001": "METRICS_RETENTION does not parse or breaks whisper's rules.",
    "metrics_app.E002": "METRICS_FLUSH_INTERVAL is not a number >= 0.",
    "metrics_app.E003": "METRICS_MAX_BUFFERED_KEYS is not a positive integer.",
    "metrics_app.E004": "METRICS_BUFFER is neither 'memory' nor 'redis'.",
    "metrics_app.E005": "METRICS_BUFFER = 'redis' but METRICS_REDIS_CACHE is no django-redis "
    "cache.",
    "metrics_app.E007": "METRICS_LOCK_CACHE is not in CACHES.",
    "metrics_app.E008": "METRICS_DATABASE is not in DATABASES.",
    "metrics_app.E009": "METRICS_QUERY_DOWNSAMPLE is not 'celery', 'inline' or None.",
    "metrics_app.E010": "METRICS_MAX_CLIENT_KEYS is not None or a positive integer smaller "
    "than METRICS_MAX_BUFFERED_KEYS.",
    "metrics_app.W001": "METRICS_LOCK_CACHE is local to one process, so the downsample lock "
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


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _retention() -> list[CheckMessage]:
    try:
        parse_retention(_get("METRICS_RETENTION"))
    except ValueError as exc:
        return [_error("metrics_app.E001", f"{_get('METRICS_RETENTION')!r}: {exc}")]
    return []


def _sizes() -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    interval = _get("METRICS_FLUSH_INTERVAL")
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval < 0:
        messages.append(_error("metrics_app.E002", f"Got {interval!r}."))
    max_keys = _get("METRICS_MAX_BUFFERED_KEYS")
    if not _positive_int(max_keys):
        messages.append(_error("metrics_app.E003", f"Got {max_keys!r}."))
    client_keys = _get("METRICS_MAX_CLIENT_KEYS")
    if client_keys is not None and not (
        _positive_int(client_keys) and (not _positive_int(max_keys) or client_keys < max_keys)
    ):
        # Equal to the whole buffer, it would leave no room kept for the code's own names.
        messages.append(_error("metrics_app.E010", f"Got {client_keys!r}."))
    return messages


def _buffer() -> list[CheckMessage]:
    buffer = _get("METRICS_BUFFER")
    if buffer not in ("memory", "redis"):
        return [_error("metrics_app.E004", f"Got {buffer!r}.")]
    if buffer == "memory":
        return []
    alias = _get("METRICS_REDIS_CACHE")
    backend = settings.CACHES.get(alias, {}).get("BACKEND", "")
    if not backend.startswith("django_redis."):
        return [
            _error(
                "metrics_app.E005",
                f"CACHES[{alias!r}] has BACKEND {backend!r}; the Redis buffer needs "
                "django_redis.cache.RedisCache for HINCRBY and its Lua script.",
            )
        ]
    return []


def _lock_cache() -> list[CheckMessage]:
    lock_alias = _get("METRICS_LOCK_CACHE")
    if lock_alias not in settings.CACHES:
        return [_error("metrics_app.E007", f"Got {lock_alias!r}.")]
    if settings.CACHES[lock_alias].get("BACKEND") in _LOCAL_CACHES:
        return [
            Warning(
                CHECK_IDS["metrics_app.W001"],
                hint="Point METRICS_LOCK_CACHE at Redis or memcached when several processes "
                "(Celery workers, beat, cron) may downsample.",
                id="metrics_app.W001",
            )
        ]
    return []


def _database() -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    if _get("METRICS_DATABASE") not in settings.DATABASES:
        messages.append(_error("metrics_app.E008", f"Got {_get('METRICS_DATABASE')!r}."))
    if _get("METRICS_QUERY_DOWNSAMPLE") not in ("celery", "inline", None, False):
        messages.append(_error("metrics_app.E009", f"Got {_get('METRICS_QUERY_DOWNSAMPLE')!r}."))
    return messages


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    return [
        message
        for check in (_retention, _sizes, _buffer, _lock_cache, _database)
        for message in check()
    ]
