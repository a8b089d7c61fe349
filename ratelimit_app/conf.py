"""Typed access to the ``RATELIMIT_*`` settings.

Nothing is read at import. A value is read from ``django.conf.settings`` on first use and
remembered as a plain attribute, because the limiter reads about ten settings per request and
Django's settings object is slow to ask; the ``setting_changed`` receiver below forgets
everything, so ``override_settings`` and pytest-django's ``settings`` fixture just work.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import logging
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from ratelimit_app.access import AccessList
    from ratelimit_app.rules import Rule, RuleSet
    from ratelimit_app.store import Snapshot

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
logger = logging.getLogger("ratelimit_app")

DEFAULTS: dict[str, Any] = {
    "RATELIMIT_ENABLE": True,
    "RATELIMIT_USE_CACHE": "default",
    "RATELIMIT_VIEW": None,
    "RATELIMIT_FAIL_OPEN": False,
    "RATELIMIT_IP_META_KEY": None,
    "RATELIMIT_IPV4_MASK": 32,
    "RATELIMIT_IPV6_MASK": 64,
    "RATELIMIT_HASH_ALGORITHM": hashlib.sha256,
    "RATELIMIT_CACHE_PREFIX": "rl:",
    "RATELIMIT_EXCEPTION_CLASS": "ratelimit_app.exceptions.Ratelimited",
    "RATELIMIT_TRUSTED_PROXIES": (),
    "RATELIMIT_BUCKETS_PER_WINDOW": 60,
    "RATELIMIT_HIERARCHICAL": False,
    "RATELIMIT_SOCKET_TIMEOUT": 0.1,
    "RATELIMIT_DEAD_RETRY": 5.0,
    "RATELIMIT_BACKEND": None,
    "RATELIMIT_RULES": (),
    "RATELIMIT_ALLOW": (),
    "RATELIMIT_DENY": (),
    "RATELIMIT_FAILURE_STATUSES": (400, 401, 403),
    "RATELIMIT_HEADERS": True,
    "RATELIMIT_FAIL_CLOSED_STATUS": 503,
    "RATELIMIT_DB_RULES": True,
    "RATELIMIT_CONFIG_REFRESH": 1.0,
    "RATELIMIT_REFUSAL_MEMORY": 5.0,
    "RATELIMIT_REFUSAL_MEMORY_SIZE": 10_000,
    "RATELIMIT_CACHE_PAGES": False,
}


def _get(name: str) -> Any:
    return getattr(settings, name, DEFAULTS[name])


class Settings:
    """One attribute per setting; see ``docs/settings`` for their meaning.

    A setting is computed on first use and then kept as a plain attribute of the instance
    (``functools.cached_property``), so the request path reads it without a call; the
    ``setting_changed`` receiver forgets them all. ``RULES``, ``ALLOW`` and ``DENY`` come
    from the snapshot of :mod:`ratelimit_app.store`, refreshed while the process runs.
    """

    @functools.cached_property
    def ENABLE(self) -> bool:
        return bool(_get("RATELIMIT_ENABLE"))

    @functools.cached_property
    def USE_CACHE(self) -> str:
        return str(_get("RATELIMIT_USE_CACHE"))

    @functools.cached_property
    def VIEW(self) -> str | Callable[..., Any] | None:
        return _get("RATELIMIT_VIEW")

    @functools.cached_property
    def FAIL_OPEN(self) -> bool:
        return bool(_get("RATELIMIT_FAIL_OPEN"))

    @functools.cached_property
    def IP_META_KEY(self) -> str | Callable[..., Any] | None:
        return _get("RATELIMIT_IP_META_KEY")

    @functools.cached_property
    def IPV4_MASK(self) -> int:
        return _get("RATELIMIT_IPV4_MASK")

    @functools.cached_property
    def IPV6_MASK(self) -> int:
        return _get("RATELIMIT_IPV6_MASK")

    @functools.cached_property
    def HASH(self) -> Callable[[bytes], Any]:
        return _hash_function(_get("RATELIMIT_HASH_ALGORITHM"))

    @functools.cached_property
    def CACHE_PREFIX(self) -> str:
        return str(_get("RATELIMIT_CACHE_PREFIX"))

    @functools.cached_property
    def SALT(self) -> str:
        """Mixed into every hashed key; derived from ``SECRET_KEY``, never stored."""
        try:
            secret = str(settings.SECRET_KEY)
        except ImproperlyConfigured:  # an empty SECRET_KEY: a script, not a site
            secret = ""
        return _salt(secret)

    @functools.cached_property
    def NAMESPACES(self) -> dict[tuple[str, str, str], str]:
        """Memo of hashed subjects, ``(scope, kind, value) -> namespace``, for
        :func:`ratelimit_app.core.namespace`; forgotten when a setting changes (the salt
        and the hash come from settings)."""
        return {}

    @functools.cached_property
    def EXCEPTION_CLASS(self) -> type[Exception]:
        value = _get("RATELIMIT_EXCEPTION_CLASS")
        return import_string(value) if isinstance(value, str) else value

    @functools.cached_property
    def TRUSTED_PROXIES(self) -> tuple[IPNetwork, ...]:
        return _networks(tuple(_get("RATELIMIT_TRUSTED_PROXIES")))

    @functools.cached_property
    def BUCKETS_PER_WINDOW(self) -> int:
        return _get("RATELIMIT_BUCKETS_PER_WINDOW")

    @functools.cached_property
    def HIERARCHICAL(self) -> bool:
        return bool(_get("RATELIMIT_HIERARCHICAL"))

    @functools.cached_property
    def SOCKET_TIMEOUT(self) -> float:
        return float(_get("RATELIMIT_SOCKET_TIMEOUT"))

    @functools.cached_property
    def DEAD_RETRY(self) -> float:
        return float(_get("RATELIMIT_DEAD_RETRY"))

    @functools.cached_property
    def BACKEND(self) -> str | None:
        return _get("RATELIMIT_BACKEND")

    @property
    def RULES(self) -> RuleSet:
        """The rules in force: ``RATELIMIT_RULES`` and the enabled rules of the database
        (:mod:`ratelimit_app.store`), validated and compiled."""
        return _current().rules

    @property
    def CURRENT(self) -> Snapshot:
        """The snapshot in force: ``RULES``, ``ALLOW`` and ``DENY`` in one read."""
        return _current()

    @property
    def ALLOW(self) -> AccessList:
        """``RATELIMIT_ALLOW`` and the database's allow list."""
        return _current().allow

    @property
    def DENY(self) -> AccessList:
        """``RATELIMIT_DENY`` and the database's deny list."""
        return _current().deny

    @functools.cached_property
    def SETTINGS_RULES(self) -> tuple[Rule, ...]:
        """``RATELIMIT_RULES`` alone, validated (invalid rules are left out and logged; the
        system checks report them)."""
        from ratelimit_app.rules import parse_rules

        found, errors = parse_rules(_get("RATELIMIT_RULES"))
        for error in errors:
            logger.error("ratelimit: %s (rule left out)", error)
        return tuple(found)

    @functools.cached_property
    def SETTINGS_ALLOW(self) -> AccessList:
        return _access("RATELIMIT_ALLOW")

    @functools.cached_property
    def SETTINGS_DENY(self) -> AccessList:
        return _access("RATELIMIT_DENY")

    @functools.cached_property
    def DB_RULES(self) -> bool:
        return bool(_get("RATELIMIT_DB_RULES"))

    @functools.cached_property
    def CONFIG_REFRESH(self) -> float:
        return float(_get("RATELIMIT_CONFIG_REFRESH"))

    @functools.cached_property
    def FAILURE_STATUSES(self) -> frozenset[int]:
        return frozenset(_get("RATELIMIT_FAILURE_STATUSES"))

    @functools.cached_property
    def HEADERS(self) -> bool:
        return bool(_get("RATELIMIT_HEADERS"))

    @functools.cached_property
    def FAIL_CLOSED_STATUS(self) -> int:
        return int(_get("RATELIMIT_FAIL_CLOSED_STATUS"))

    @functools.cached_property
    def REFUSAL_MEMORY(self) -> float:
        return float(_get("RATELIMIT_REFUSAL_MEMORY"))

    @functools.cached_property
    def REFUSAL_MEMORY_SIZE(self) -> int:
        return int(_get("RATELIMIT_REFUSAL_MEMORY_SIZE"))

    @functools.cached_property
    def CACHE_PAGES(self) -> bool:
        return bool(_get("RATELIMIT_CACHE_PAGES"))


def _current() -> Snapshot:
    # Read on every request: the function is looked up once, not imported each time.
    global _current_fn
    if _current_fn is None:
        from ratelimit_app.store import current

        _current_fn = current
    return _current_fn()


_current_fn: Callable[[], Snapshot] | None = None


def _access(name: str) -> AccessList:
    from ratelimit_app.access import EMPTY, compile_list

    try:
        return compile_list(_get(name))
    except ImproperlyConfigured as exc:  # the system checks report it
        logger.error("ratelimit: %s: %s (list ignored)", name, exc)
        return EMPTY


conf = Settings()


def settings_rule_names() -> set[str]:
    """Names of the rules in ``RATELIMIT_RULES`` (a database rule may not reuse one)."""
    return {rule.name for rule in conf.SETTINGS_RULES}


@lru_cache(maxsize=8)
def _hash_function(value: Any) -> Callable[[bytes], Any]:
    func = import_string(value) if isinstance(value, str) else value
    if not callable(func):
        raise ImproperlyConfigured(f"RATELIMIT_HASH_ALGORITHM {value!r} is not callable.")
    return func


@lru_cache(maxsize=4)
def _salt(secret: str) -> str:
    return hashlib.sha256(f"django-bucketry ratelimit\x00{secret}".encode()).hexdigest()[:16]


@lru_cache(maxsize=8)
def _networks(values: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    try:
        return tuple(ipaddress.ip_network(v, strict=False) for v in values)
    except ValueError as exc:
        raise ImproperlyConfigured(f"RATELIMIT_TRUSTED_PROXIES: {exc}") from exc


@receiver(setting_changed)
def _clear_caches(*, setting: str, **kwargs: Any) -> None:
    if setting == "ROOT_URLCONF":
        from ratelimit_app.rules import clear_caches

        clear_caches()
    if setting.startswith("RATELIMIT_") or setting in ("CACHES", "SECRET_KEY"):
        vars(conf).clear()
        from ratelimit_app.store import forget

        forget()
        _hash_function.cache_clear()
        _networks.cache_clear()
        from ratelimit_app.backends import reset_backends

        reset_backends()
