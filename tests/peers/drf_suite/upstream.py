"""The copied DRF test module (see the package docstring), loaded through the import swap."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import sys
import types
import unittest
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

#: The djangorestframework release the text file comes from, and its SHA-256.
VERSION = "3.18.3"
SHA256 = "8f2a7c4becc177b28c0faa5944c6377c4db51dc80f883b349db6333b2d6c308f"
PATH = Path(__file__).with_name("test_throttling.py.txt")
#: The name the copy is imported under (its classes' ``__module__``).
MODULE = "tests.peers.drf_suite.drf_test_throttling"
SWAPPED = "rest_framework.throttling"


def digest() -> str:
    return hashlib.sha256(PATH.read_bytes()).hexdigest()


@cache
def module() -> types.ModuleType:
    """The copy, imported with ``rest_framework.throttling`` being ``ratelimit_app.throttling``
    (only while its imports run: DRF's module is back in ``sys.modules`` after)."""
    from ratelimit_app import throttling

    loader = importlib.machinery.SourceFileLoader(MODULE, str(PATH))
    spec = importlib.util.spec_from_loader(MODULE, loader)
    assert spec is not None
    found = importlib.util.module_from_spec(spec)
    saved = sys.modules.get(SWAPPED)
    sys.modules[SWAPPED] = throttling
    try:
        loader.exec_module(found)
    finally:
        if saved is None:
            sys.modules.pop(SWAPPED, None)
        else:
            sys.modules[SWAPPED] = saved
    return found


def peer_test_cases() -> dict[str, type[unittest.TestCase]]:
    """The test classes the copy defines."""
    return {
        name: obj
        for name, obj in vars(module()).items()
        if isinstance(obj, type)
        and issubclass(obj, unittest.TestCase)
        and obj.__module__ == MODULE
    }


# -- what a peer's suite needs around its classes (django-ratelimit's suite could use it too) --

MEMCACHED = "django.core.cache.backends.memcached.PyMemcacheCache"
REDIS = "django_redis.cache.RedisCache"
#: Counter servers besides local memory: the class-name suffix and the server fixture.
SERVERS = {"OnMemcached": "memcached", "OnRedis": "redis"}


def with_counter_servers(
    cases: dict[str, type], counting: Iterable[str], module: str
) -> dict[str, type]:
    """``cases``, and for each of ``counting`` a subclass per counter server (its
    ``counter_server`` attribute names it; :func:`counter_cache` reads it)."""
    found = dict(cases)
    for name in counting:
        for suffix, server in SERVERS.items():
            found[name + suffix] = type(
                name + suffix, (cases[name],), {"__module__": module, "counter_server": server}
            )
    return found


def counter_cache(request: pytest.FixtureRequest, location: str) -> dict[str, Any]:
    """The cache a peer's test class counts in: our real server for its ``counter_server``,
    else local memory at ``location``."""
    server = getattr(request.cls, "counter_server", None)
    if server == "memcached":
        return {"BACKEND": MEMCACHED, "LOCATION": request.getfixturevalue("memcached_server")}
    if server == "redis":
        return {"BACKEND": REDIS, "LOCATION": request.getfixturevalue("redis_server")}
    return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": location}


def peer_class(item: pytest.Item, module: str) -> str:
    """The name of the peer's own class (defined in ``module``) that an item's test comes
    from, for the subclasses of :func:`with_counter_servers` too."""
    for klass in getattr(getattr(item, "cls", None), "__mro__", ()):
        if klass.__module__ == module:
            return str(klass.__name__)
    return ""


def mark_differences(
    items: list[pytest.Item], here: Path, module: str, differences: dict[tuple[str, str], str]
) -> None:
    """Strict xfails, with their reasons, for the peer's tests (collected in ``here``) that
    pin a documented difference: a pass means the difference is gone and the docs are
    wrong."""
    for item in items:
        if item.path.parent != here:
            continue
        reason = differences.get((peer_class(item, module), item.name))
        if reason is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
