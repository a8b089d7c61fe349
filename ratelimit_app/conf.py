"""Typed access to the ``RATELIMIT_*`` settings.

Nothing is read at import. A value is read from ``django.conf.settings`` on first use and
remembered as a plain attribute, because the limiter reads about ten settings per request and
Django's settings object is slow to ask. The values are the first part of the runtime
(:data:`ratelimit_app.runtime.RUNTIME`), forgotten with the rest when ``setting_changed``
is sent, so ``override_settings`` and pytest-django's ``settings`` fixture just work.

Of the package it imports only :mod:`ratelimit_app.runtime`.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ratelimit_app.runtime import RUNTIME

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "RATELIMIT_ENABLE": True,
        "RATELIMIT_USE_CACHE": "default",
        "RATELIMIT_VIEW": None,
        "RATELIMIT_FAIL_OPEN": False,
        "RATELIMIT_FALLBACK": None,
        "RATELIMIT_IP_META_KEY": None,
        "RATELIMIT_IPV4_MASK": 32,
        "RATELIMIT_IPV6_MASK": 64,
        "RATELIMIT_HASH_ALGORITHM": hashlib.sha256,
        "RATELIMIT_CACHE_PREFIX": "rl:",
        "RATELIMIT_EXCEPTION_CLASS": "ratelimit_app.exceptions.Ratelimited",
        "RATELIMIT_TRUSTED_PROXIES": (),
        "RATELIMIT_BACKEND": None,
        "RATELIMIT_RULES": (),
        "RATELIMIT_ALLOW": (),
        "RATELIMIT_DENY": (),
        "RATELIMIT_FAILURE_STATUSES": (400, 401, 403),
        "RATELIMIT_REFUSED_SUBJECTS": "masked",
        "RATELIMIT_TELEMETRY": "auto",
    }
)


def read(name: str) -> Any:
    """The setting ``name`` (one of :data:`DEFAULTS`), or its default."""
    return getattr(settings, name, DEFAULTS[name])


def require_installed(what: str) -> None:
    """Raise ``ImproperlyConfigured`` naming the fix when ``ratelimit_app`` is not in
    ``INSTALLED_APPS``: an app that is not installed runs no system check, so ``check``
    would pass and the first request would fail on its models."""
    if not apps.is_installed("ratelimit_app"):
        raise ImproperlyConfigured(
            f"{what} needs 'ratelimit_app' in INSTALLED_APPS: add it there (its models, "
            "admin and system checks come with it), then run `python manage.py migrate`."
        )


#: The middleware's dotted path, as ``MIDDLEWARE`` names it.
MIDDLEWARE_PATH = "ratelimit_app.middleware.RatelimitMiddleware"
#: Our DRF throttles' module (importing it imports Django REST framework).
THROTTLING = "ratelimit_app.throttling"


def drf_throttles_named() -> list[str]:
    """The classes of :mod:`ratelimit_app.throttling` that
    ``REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]`` names, as dotted paths (read without
    importing Django REST framework)."""
    config = getattr(settings, "REST_FRAMEWORK", None)
    if not isinstance(config, dict):
        return []
    named = config.get("DEFAULT_THROTTLE_CLASSES") or ()
    if isinstance(named, str):
        named = [named]
    return [c for c in named if isinstance(c, str) and c.startswith(THROTTLING + ".")]


class Settings:
    """One attribute per setting; see ``docs/settings`` for their meaning.

    A setting is computed on first use and then kept as a plain attribute of the instance
    (``functools.cached_property``), so the request path reads it without a call;
    :meth:`ratelimit_app.runtime.Runtime.forget` forgets them all.
    """

    @functools.cached_property
    def ENABLE(self) -> bool:
        return bool(read("RATELIMIT_ENABLE"))

    @functools.cached_property
    def USE_CACHE(self) -> str:
        return str(read("RATELIMIT_USE_CACHE"))

    @functools.cached_property
    def VIEW(self) -> str | Callable[..., Any] | None:
        return read("RATELIMIT_VIEW")

    @functools.cached_property
    def FAIL_OPEN(self) -> bool:
        return bool(read("RATELIMIT_FAIL_OPEN"))

    @functools.cached_property
    def FALLBACK(self) -> bool:
        """True: the limits count in each process's memory while the counters are down
        (``RATELIMIT_FALLBACK = "memory"``)."""
        value = read("RATELIMIT_FALLBACK")
        if value is None or value is False:
            return False
        if value == "memory" and type(value) is str:
            return True
        raise ImproperlyConfigured(
            f'RATELIMIT_FALLBACK is {value!r}: set it to "memory" (count in each process\'s '
            "memory while the counters are down) or None (fail open or closed, as "
            "RATELIMIT_FAIL_OPEN says)."
        )

    @functools.cached_property
    def IP_META_KEY(self) -> str | Callable[..., Any] | None:
        return read("RATELIMIT_IP_META_KEY")

    @functools.cached_property
    def IPV4_MASK(self) -> int:
        return read("RATELIMIT_IPV4_MASK")

    @functools.cached_property
    def IPV6_MASK(self) -> int:
        return read("RATELIMIT_IPV6_MASK")

    @functools.cached_property
    def HASH(self) -> Callable[[bytes], Any]:
        return _hash_function(read("RATELIMIT_HASH_ALGORITHM"))

    @functools.cached_property
    def CACHE_PREFIX(self) -> str:
        return str(read("RATELIMIT_CACHE_PREFIX"))

    @functools.cached_property
    def SALT(self) -> str:
        """Mixed into every hashed key; derived from ``SECRET_KEY``, never stored."""
        try:
            secret = str(settings.SECRET_KEY)
        except ImproperlyConfigured:  # an empty SECRET_KEY: a script, not a site
            secret = ""
        return _salt(secret)

    @functools.cached_property
    def EXCEPTION_CLASS(self) -> type[Exception]:
        value = read("RATELIMIT_EXCEPTION_CLASS")
        return import_string(value) if isinstance(value, str) else value

    @functools.cached_property
    def TRUSTED_PROXIES(self) -> tuple[IPNetwork, ...]:
        return _networks(tuple(read("RATELIMIT_TRUSTED_PROXIES")))

    @functools.cached_property
    def BACKEND(self) -> str | None:
        return read("RATELIMIT_BACKEND")

    @functools.cached_property
    def REFUSED_SUBJECTS(self) -> object:
        """``RATELIMIT_REFUSED_SUBJECTS`` as set (read on every refusal a flood makes: an
        unset setting costs Django's settings two ``AttributeError`` a read)."""
        return read("RATELIMIT_REFUSED_SUBJECTS")

    @functools.cached_property
    def FAILURE_STATUSES(self) -> frozenset[int]:
        return frozenset(read("RATELIMIT_FAILURE_STATUSES"))

    @functools.cached_property
    def MIDDLEWARE_INSTALLED(self) -> bool:
        """``RatelimitMiddleware`` is in ``MIDDLEWARE``: it keeps the configuration snapshot
        (database rules, overrides, bans) fresh; without it, the checks do."""
        return MIDDLEWARE_PATH in (getattr(settings, "MIDDLEWARE", None) or ())


#: The values read: the runtime's first part.
conf = RUNTIME.settings = Settings()


def _hash_function(value: Any) -> Callable[[bytes], Any]:
    func = import_string(value) if isinstance(value, str) else value
    if not callable(func):
        raise ImproperlyConfigured(f"RATELIMIT_HASH_ALGORITHM {value!r} is not callable.")
    return func


def _salt(secret: str) -> str:
    return hashlib.sha256(f"django-bucketry ratelimit\x00{secret}".encode()).hexdigest()[:16]


def _networks(values: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    try:
        return tuple(ipaddress.ip_network(v, strict=False) for v in values)
    except ValueError as exc:
        raise ImproperlyConfigured(f"RATELIMIT_TRUSTED_PROXIES: {exc}") from exc
