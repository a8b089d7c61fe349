"""Backend selection: the cache that ``RATELIMIT_USE_CACHE`` names decides the fast path.

* ``django.core.cache.backends.memcached.PyMemcacheCache``: :mod:`.memcached`;
* ``django_redis.cache.RedisCache``: :mod:`.redis`;
* ``django.core.cache.backends.dummy.DummyCache``: :mod:`.dummy` (never limits);
* anything else: :mod:`.cache` (generic Django cache calls).

``RATELIMIT_BACKEND`` (a :class:`~.base.Backend` subclass or its dotted path) overrides the
choice. Every backend is built the same way, ``cls(alias, cache)`` (:func:`build`), once per
process and alias, and kept in the runtime (:class:`Built`): rebuilt when settings change.

A mistake in the settings (an alias not in ``CACHES``, a ``RATELIMIT_BACKEND`` that cannot
be imported, is no backend, or cannot be built that way) raises ``ImproperlyConfigured`` and
is reported by the system checks; only a backend that fails to start (a bad server address)
is a :class:`~ratelimit_app.exceptions.BackendError`, which fails open or closed.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

from django.conf import settings
from django.core.cache import InvalidCacheBackendError, caches
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ratelimit_app.backends.base import Backend
from ratelimit_app.conf import conf
from ratelimit_app.exceptions import BackendError
from ratelimit_app.runtime import RUNTIME

MEMCACHED = "django.core.cache.backends.memcached.PyMemcacheCache"
REDIS = "django_redis.cache.RedisCache"
DUMMY = "django.core.cache.backends.dummy.DummyCache"

_lock = threading.Lock()


class Built(dict[str, Backend]):
    """The backends built in this process, by cache alias: a part of the runtime, closed
    when it is forgotten."""

    def close(self) -> None:
        for backend in self.values():
            backend.close()
        self.clear()


def get_backend(alias: str | None = None) -> Backend:
    """The backend for ``alias`` (default: ``RATELIMIT_USE_CACHE``).

    Raises ``ImproperlyConfigured`` for a configuration mistake (``InvalidCacheBackendError``
    when the alias is not in ``CACHES``, as Django's ``caches[alias]`` does), and
    ``BackendError`` when the backend cannot start.
    """
    alias = alias or conf.USE_CACHE
    found = RUNTIME.parts.get(Built) or RUNTIME.part(Built)
    backend = found.get(alias)
    if backend is None:
        with _lock:
            backend = found.get(alias)
            if backend is None:
                backend = found[alias] = build(backend_class(alias), alias)
    return backend


def missing_cache(alias: str, caches: Any) -> str:
    """What is wrong when ``alias`` is not in ``caches`` (the ``CACHES`` setting), and the fix
    (the system check and the request-time error say the same)."""
    if not caches:
        return (
            f"RATELIMIT_USE_CACHE is {alias!r}, but CACHES is empty: add a {alias!r} cache to "
            "CACHES, or set RATELIMIT_USE_CACHE to the alias of a cache that exists."
        )
    return (
        f"RATELIMIT_USE_CACHE is {alias!r}, which is not in CACHES (it has "
        f"{', '.join(map(repr, caches))}): add a {alias!r} cache to CACHES, or set "
        "RATELIMIT_USE_CACHE to one of those."
    )


def backend_class(alias: str) -> type[Backend]:
    """The class that counts on cache ``alias``: ``RATELIMIT_BACKEND``'s when set, else the
    one the cache's ``BACKEND`` selects. Raises ``ImproperlyConfigured``."""
    config = settings.CACHES.get(alias)
    if config is None:
        raise InvalidCacheBackendError(missing_cache(alias, settings.CACHES))
    if conf.BACKEND:
        return configured_class(conf.BACKEND)
    path = config.get("BACKEND", "")
    if path == MEMCACHED:
        from ratelimit_app.backends.memcached import MemcachedBackend

        return MemcachedBackend
    if path == REDIS:
        from ratelimit_app.backends.redis import RedisBackend

        return RedisBackend
    if path == DUMMY:
        from ratelimit_app.backends.dummy import DummyBackend

        return DummyBackend
    from ratelimit_app.backends.cache import CacheBackend

    return CacheBackend


def configured_class(value: object) -> type[Backend]:
    """The class ``RATELIMIT_BACKEND`` names (a class or its dotted path), checked: it can
    be imported, is a concrete :class:`~.base.Backend` subclass, and can be built as
    ``cls(alias, cache)``. Raises ``ImproperlyConfigured`` naming the setting (the system
    check ``ratelimit_app.E018`` reports the same at start-up)."""
    cls: object = value
    if isinstance(value, str):
        try:
            cls = import_string(value)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"RATELIMIT_BACKEND = {value!r} cannot be imported: {exc}"
            ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ImproperlyConfigured(
            f"RATELIMIT_BACKEND = {value!r} is not a subclass of "
            "ratelimit_app.backends.base.Backend."
        )
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise ImproperlyConfigured(
            f"RATELIMIT_BACKEND = {value!r} does not implement {missing} (see the Backend "
            "contract in docs/backends)."
        )
    try:
        inspect.signature(cls).bind("alias", "cache")
    except TypeError as exc:
        raise ImproperlyConfigured(
            f"RATELIMIT_BACKEND = {value!r} cannot be built as cls(alias, cache): {exc}."
        ) from exc
    return cls


def build(cls: type[Backend], alias: str) -> Backend:
    """A backend of class ``cls`` for the cache ``alias`` (in ``CACHES``): ``cls(alias,
    cache)``, every backend's one construction (one that needs the cache's ``LOCATION`` and
    ``OPTIONS`` reads them with :func:`~.base.cache_settings`).

    A failure of the constructor is a :class:`~ratelimit_app.exceptions.BackendError` (a
    server address that cannot be used is a failure like any other: it fails open or
    closed), except ``ImproperlyConfigured``, which is raised as it is.
    """
    try:
        return cls(alias, caches[alias])
    except ImproperlyConfigured:
        raise
    except Exception as exc:
        raise BackendError(f"{alias}: cannot connect ({exc!r})") from exc


def reset_backends() -> None:
    """Close and forget the backends built (the next use builds them again)."""
    with _lock:
        RUNTIME.drop(Built)
