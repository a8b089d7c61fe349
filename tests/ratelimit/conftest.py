"""Fixtures for ratelimit_app: one cache per backend, on real servers; and the helpers
several test modules share (:func:`rules`, :class:`ReferenceMeter`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest
from django.core.cache import caches
from django.test import RequestFactory, override_settings

from ratelimit_app.backends import get_backend, reset_backends
from ratelimit_app.backends.base import Op

BACKENDS = ("locmem", "memcached", "redis")
_unique = itertools.count()


def cache_config(kind: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if kind == "memcached":
        return {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": request.getfixturevalue("memcached_server"),
        }
    if kind == "redis":
        return {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": request.getfixturevalue("redis_server"),
        }
    return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "rl-tests"}


@pytest.fixture(params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test using it runs against local memory, real memcached and real Redis."""
    kind: str = request.param
    config = cache_config(kind, request)
    caches_setting = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    caches_setting["rl"] = config
    with override_settings(CACHES=caches_setting, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        yield kind
        caches["rl"].clear()
    reset_backends()


@pytest.fixture
def backend(backend_kind: str) -> Any:
    return get_backend()


@pytest.fixture
def rf() -> RequestFactory:
    return RequestFactory()


@pytest.fixture
def group() -> str:
    """A fresh group per test, so counters of other tests never interfere."""
    return f"test-group-{next(_unique)}"


def several_memcached(*addresses: str) -> Any:
    """Settings that count on several memcached servers (alias "rl")."""
    config = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": list(addresses),
    }
    return override_settings(
        CACHES={"default": config, "rl": config},
        RATELIMIT_USE_CACHE="rl",
    )


@pytest.fixture
def two_memcached(memcached_server: str) -> Iterator[list[Any]]:
    """The session's memcached address and a second server (a ``Server``: stop it to
    simulate a lost node)."""
    from tests.servers import start_memcached

    second = start_memcached()
    yield [memcached_server, second]
    second.stop()


#: The middleware of the tests that go through RatelimitMiddleware (a session, a user).
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "ratelimit_app.middleware.RatelimitMiddleware",
]


@pytest.fixture
def rules_site() -> Iterator[None]:
    """The test views (tests/ratelimit/urls.py) behind :data:`MIDDLEWARE`, with no
    configuration snapshot and no remembered refusal from an earlier test."""
    from ratelimit_app import store
    from ratelimit_app.testing import forget_refusals

    store.forget()
    forget_refusals()
    with override_settings(ROOT_URLCONF="tests.ratelimit.urls", MIDDLEWARE=MIDDLEWARE):
        yield
    store.forget()
    forget_refusals()


class RoundTrips:
    """Counts the round trips (``execute`` calls) of the backend in force, and those that
    write sliding windows (count, or take back)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = self.writing = 0
        backend = get_backend()
        execute = backend.execute

        def counting(ops: Any, now_us: int) -> Any:
            self.count += 1
            self.writing += any(
                isinstance(op, Op) and (op.increment or op.undo is not None) for op in ops
            )
            return execute(ops, now_us)

        monkeypatch.setattr(backend, "execute", counting)


def rules(*items: dict[str, Any], **settings: Any) -> Any:
    """``override_settings`` with ``items`` as ``RATELIMIT_RULES`` (and any other settings)."""
    return override_settings(RATELIMIT_RULES=list(items), **settings)


class ReferenceMeter:
    """A leaky bucket as a level that drains, in exact fractions: the reference that
    :mod:`ratelimit_app.algorithms.gcra` must agree with on every decision and every figure.

    Written independently of that module, as the algorithm is usually stated: a level and
    the time it was last set, draining continuously at the leak rate; a request is admitted
    when the level plus one does not exceed the capacity, and only an admitted request fills
    the bucket.
    """

    def __init__(self, count: int, seconds: int, capacity: int) -> None:
        self.leak = Fraction(count, seconds)  # requests per second
        self.capacity = capacity
        self.level = Fraction(0)
        self.since: Fraction | None = None

    def level_at(self, t: Fraction) -> Fraction:
        """The level at ``t``; a clock behind ``since`` sees a fuller bucket."""
        if self.since is None:
            return Fraction(0)
        return max(Fraction(0), self.level - (t - self.since) * self.leak)

    def fits(self, t: Fraction) -> bool:
        return self.leak > 0 and self.level_at(t) + 1 <= self.capacity

    def request(self, t: Fraction, count: bool = True) -> bool:
        """Admit (and fill) when one more fits; a look or a refusal changes nothing."""
        ok = self.fits(t)
        if ok and count:
            self.level, self.since = self.level_at(t) + 1, t
        return ok

    def figures(self, t: Fraction) -> tuple[Fraction, int, Fraction, Fraction]:
        """(level, whole requests that fit, seconds until one fits, seconds until empty)."""
        level = self.level_at(t)
        remaining = max(0, math.floor(self.capacity - level))
        wait = max(Fraction(0), (level + 1 - self.capacity) / self.leak)
        return level, remaining, wait, level / self.leak


@pytest.fixture
def module_prefix(request: pytest.FixtureRequest) -> Iterator[None]:
    """``RATELIMIT_CACHE_PREFIX`` set to the test module's ``PREFIX``: a module whose
    expected keys are built from that literal fails when a backend ignores the setting."""
    with override_settings(RATELIMIT_CACHE_PREFIX=request.module.PREFIX):
        yield
