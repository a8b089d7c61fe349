"""What a peer's own test suite needs around its test classes, for every suite in
``tests/peers``: a subclass of each counting class per counter server, the cache it counts
in, and strict xfails for the tests that pin a documented difference."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

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


class Difference(NamedTuple):
    """A documented difference a peer's test pins: why it fails here, and the exception its
    failure raises. Any other exception (a fixture that errors, a server CI could not start)
    is then reported as the failure it is, not as the difference."""

    reason: str
    raises: type[BaseException]


def mark_differences(
    items: list[pytest.Item],
    here: Path,
    module: str,
    differences: dict[tuple[str, str], Difference],
) -> None:
    """Strict xfails, with their reasons and the one exception each documents, for the
    peer's tests (collected in ``here``) that pin a documented difference: a pass means the
    difference is gone and the docs are wrong."""
    for item in items:
        if item.path.parent != here:
            continue
        difference = differences.get((peer_class(item, module), item.name))
        if difference is not None:
            item.add_marker(
                pytest.mark.xfail(strict=True, reason=difference.reason, raises=difference.raises)
            )
