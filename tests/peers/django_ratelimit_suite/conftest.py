"""Settings and import aliases for django-ratelimit's own tests (``test_django_ratelimit``).

The peer's ``test_settings.py`` names four caches; they are applied with ``override_settings``
around each of its tests:

* ``default``: local memory (or, for the ``...OnMemcached`` / ``...OnRedis`` classes, our
  real throwaway servers from ``tests/conftest.py``);
* ``connection-errors`` (pymemcache) and ``connection-errors-redis`` (django-redis): a
  loopback port that was free when the session started and that nothing listens on, so the
  connection is refused at once (the peer names a host that does not resolve);
* ``instant-expiration``: a ``DummyCache``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from ratelimit_app.decorators import registry
from tests.peers import suites
from tests.peers.django_ratelimit_suite.aliases import PEER_TESTS, aliases, swapped

HERE = Path(__file__).parent

#: The peer's tests that check a deliberate, documented difference: expected to fail with
#: the exception named, and strictly (a pass would mean the difference is gone, and the docs
#: are wrong; another exception is a failure of its own).
DIFFERENCES = {
    ("FunctionsTests", "test_not_increment_after_increment"): suites.Difference(
        "deliberate difference: a refused hit is taken back, not counted, so two counted "
        "hits against '1/m' leave a count of 1 (docs/migrating.rst, 'Refused requests are "
        "not counted')",
        AssertionError,
    ),
}


def _is_peer(item: pytest.Item) -> bool:
    return item.path.parent == HERE and item.path.name.startswith("test_")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    suites.mark_differences(items, HERE, PEER_TESTS, DIFFERENCES)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[Any]:
    """The peer's names are ours for each of its tests (set-up and tear-down included), and
    what its views add to the decorators' registry is forgotten after."""
    if not _is_peer(item):
        return (yield)
    # Its tests decorate views with mistakes on purpose (no key): the system checks of the
    # rest of the session must not see them.
    views = dict(registry)
    try:
        with swapped(aliases()):
            return (yield)
    finally:
        registry.clear()
        registry.update(views)


@pytest.fixture(autouse=True)
def peer_settings(request: pytest.FixtureRequest, closed_port: int) -> Iterator[None]:
    """django-ratelimit's ``test_settings.py`` caches, on our servers."""
    caches = {
        "default": suites.counter_cache(request, "peer"),
        "connection-errors": {"BACKEND": suites.MEMCACHED, "LOCATION": f"127.0.0.1:{closed_port}"},
        "connection-errors-redis": {
            "BACKEND": suites.REDIS,
            "LOCATION": f"redis://127.0.0.1:{closed_port}/0",
            "OPTIONS": {"IGNORE_EXCEPTIONS": True},
        },
        "instant-expiration": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"},
    }
    with override_settings(CACHES=caches, RATELIMIT_USE_CACHE="default"):
        yield
