"""Typed access to the ``METRICS_*`` settings, read on every access.

Nothing is snapshotted at import, so ``override_settings`` just works. The parsed retention
is cached and the cache is cleared by a ``setting_changed`` receiver. See ``docs/metrics.rst``
for the meaning of each setting.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from metrics_app.retention import DEFAULT_RETENTION, Retention, parse_retention

DEFAULTS: dict[str, Any] = {
    "METRICS_FLUSH_INTERVAL": 10.0,
    "METRICS_RETENTION": DEFAULT_RETENTION,
    "METRICS_MAX_BUFFERED_KEYS": 100_000,
    "METRICS_MAX_CLIENT_KEYS": None,
    "METRICS_BUFFER": "memory",
    "METRICS_REDIS_CACHE": "default",
    "METRICS_REDIS_KEY": "metrics:buffer",
    "METRICS_DATABASE": "default",
    "METRICS_LOCK_CACHE": "default",
    "METRICS_QUERY_DOWNSAMPLE": "celery",
    "METRICS_HANDLE_SIGTERM": True,
}


def _get(name: str) -> Any:
    return getattr(settings, name, DEFAULTS[name])


class Settings:
    """One property per setting; see ``docs/metrics.rst`` for their meaning."""

    @property
    def FLUSH_INTERVAL(self) -> float:
        return float(_get("METRICS_FLUSH_INTERVAL"))

    @property
    def RETENTION(self) -> Retention:
        return _parsed_retention(str(_get("METRICS_RETENTION")))

    @property
    def MAX_BUFFERED_KEYS(self) -> int:
        return int(_get("METRICS_MAX_BUFFERED_KEYS"))

    @property
    def MAX_CLIENT_KEYS(self) -> int:
        """Explicit, or a tenth of ``METRICS_MAX_BUFFERED_KEYS`` (at least 1)."""
        value = _get("METRICS_MAX_CLIENT_KEYS")
        return max(1, self.MAX_BUFFERED_KEYS // 10) if value is None else int(value)

    @property
    def BUFFER(self) -> str:
        return str(_get("METRICS_BUFFER"))

    @property
    def REDIS_CACHE(self) -> str:
        return str(_get("METRICS_REDIS_CACHE"))

    @property
    def REDIS_KEY(self) -> str:
        return str(_get("METRICS_REDIS_KEY"))

    @property
    def DATABASE(self) -> str:
        return str(_get("METRICS_DATABASE"))

    @property
    def LOCK_CACHE(self) -> str:
        return str(_get("METRICS_LOCK_CACHE"))

    @property
    def QUERY_DOWNSAMPLE(self) -> str | None:
        value = _get("METRICS_QUERY_DOWNSAMPLE")
        return None if not value else str(value)

    @property
    def HANDLE_SIGTERM(self) -> bool:
        return bool(_get("METRICS_HANDLE_SIGTERM"))


conf = Settings()


@lru_cache(maxsize=8)
def _parsed_retention(value: str) -> Retention:
    return parse_retention(value)


@receiver(setting_changed)
def _clear_caches(*, setting: str, **kwargs: Any) -> None:
    if setting == "METRICS_RETENTION":
        _parsed_retention.cache_clear()
