"""Typed access to the two ``METRICS_*`` settings, read on every access.

Nothing is snapshotted at import, so ``override_settings`` just works. The parsed retention
is cached and the cache is cleared by a ``setting_changed`` receiver. See ``docs/settings.rst``
(section "Metrics") for their meaning.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from metrics_app.retention import DEFAULT_RETENTION, Retention, parse_retention

DEFAULTS: dict[str, Any] = {
    "METRICS_RETENTION": DEFAULT_RETENTION,
    "METRICS_BUFFER": "memory",
}

#: The django-redis cache alias of ``METRICS_BUFFER = "redis"``; ``"redis:<alias>"`` names
#: another.
DEFAULT_REDIS_ALIAS = "default"


def _get(name: str) -> Any:
    return getattr(settings, name, DEFAULTS[name])


def parse_buffer(value: object) -> str | None:
    """The django-redis cache alias a ``METRICS_BUFFER`` value names, None for ``"memory"``.

    ``"redis"`` is the alias ``"default"``, ``"redis:<alias>"`` that alias. Raises
    ``ValueError`` for any other value.
    """
    if value == "memory":
        return None
    if value == "redis":
        return DEFAULT_REDIS_ALIAS
    if isinstance(value, str) and value.startswith("redis:") and value[len("redis:") :]:
        return value[len("redis:") :]
    raise ValueError(value)


class Settings:
    """One property per setting; see ``docs/settings.rst`` for their meaning."""

    @property
    def RETENTION(self) -> Retention:
        return _parsed_retention(str(_get("METRICS_RETENTION")))

    @property
    def BUFFER(self) -> str:
        """``"redis"`` for the Redis buffer (any alias), else ``"memory"`` (the system check
        ``metrics_app.E004`` reports a value that is neither)."""
        return "memory" if self.BUFFER_CACHE is None else "redis"

    @property
    def BUFFER_CACHE(self) -> str | None:
        """The django-redis cache alias of the Redis buffer; None with the memory buffer."""
        try:
            return parse_buffer(_get("METRICS_BUFFER"))
        except ValueError:
            return None


conf = Settings()


@lru_cache(maxsize=8)
def _parsed_retention(value: str) -> Retention:
    return parse_retention(value)


@receiver(setting_changed)
def _clear_caches(*, setting: str, **kwargs: Any) -> None:
    if setting == "METRICS_RETENTION":
        _parsed_retention.cache_clear()
