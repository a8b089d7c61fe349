"""Backend selection: the cache that ``RATELIMIT_USE_CACHE`` names decides the fast path.

* ``django.core.cache.backends.memcached.PyMemcacheCache``: :mod:`.memcached`;
* ``django_redis.cache.RedisCache``: :mod:`.redis`;
* anything else: :mod:`.cache` (generic Django cache calls).

``RATELIMIT_BACKEND`` (a dotted path to a :class:`~.base.Backend` subclass) overrides the
choice. Backends are built once per process and alias, and rebuilt when settings change.
"""

from __future__ import annotations

import threading
from typing import Any, cast

from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ratelimit_app.backends.base import Backend
from ratelimit_app.conf import conf
from ratelimit_app.exceptions import BackendError

MEMCACHED = "django.core.cache.backends.memcached.PyMemcacheCache"
REDIS = "django_redis.cache.RedisCache"

_backends: dict[str, Backend] = {}
_lock = threading.Lock()


def get_backend(alias: str | None = None) -> Backend:
    """The backend for ``alias`` (default: ``RATELIMIT_USE_CACHE``)."""
    alias = alias or conf.USE_CACHE
    backend = _backends.get(alias)
    if backend is None:
        with _lock:
            backend = _backends.get(alias)
            if backend is None:
                try:
                    backend = _build(alias)
                except ImproperlyConfigured:
                    raise
                except Exception as exc:  # a bad LOCATION: a failure like any other
                    raise BackendError(f"{alias}: cannot connect ({exc!r})") from exc
                _backends[alias] = backend
    return backend


def _build(alias: str) -> Backend:
    config = settings.CACHES.get(alias)
    if config is None:
        raise ImproperlyConfigured(
            f"RATELIMIT_USE_CACHE is {alias!r}, which is not a key of CACHES."
        )
    cache = caches[alias]
    if conf.BACKEND:
        return import_string(conf.BACKEND)(alias, cache)
    path = config.get("BACKEND", "")
    location = config.get("LOCATION", "")
    options = cast(dict[str, Any], config.get("OPTIONS") or {})
    if path == MEMCACHED:
        from ratelimit_app.backends.memcached import MemcachedBackend

        return MemcachedBackend(alias, cache, location, options)
    if path == REDIS:
        from ratelimit_app.backends.redis import RedisBackend

        return RedisBackend(alias, cache, location, options)
    from ratelimit_app.backends.cache import CacheBackend

    return CacheBackend(alias, cache)


def reset_backends() -> None:
    """Forget built backends (settings changed)."""
    with _lock:
        for backend in _backends.values():
            backend.close()
        _backends.clear()
