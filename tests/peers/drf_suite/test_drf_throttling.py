"""DRF 3.18.3's throttling test classes, collected here from the copy (:mod:`.upstream`).

Each class runs as DRF wrote it, with our counters in local memory (its ``cache`` is the
default cache, which its ``setUp`` clears); the classes that count also run with the counters
on our real memcached and Redis (the ``...OnMemcached`` and ``...OnRedis`` subclasses).
:mod:`.conftest` applies the settings and marks the documented differences.
"""

from __future__ import annotations

from importlib.metadata import version

from tests.peers import suites
from tests.peers.drf_suite import upstream

#: The copy's classes that count requests (their ``setUp`` clears the cache).
COUNTING = (
    "ThrottlingTests",
    "ScopedRateThrottleTests",
    "IdWithXffBasicTests",
    "XffSpoofingTests",
    "XffUniqueMachinesTest",
)


def _classes() -> dict[str, type]:
    return suites.with_counter_servers(upstream.peer_test_cases(), COUNTING, __name__)


globals().update(_classes())


def test_the_copy_is_the_installed_release() -> None:
    """The copied tests are those of the DRF release installed: upgrade the copy with DRF."""
    assert version("djangorestframework") == upstream.VERSION
    assert upstream.digest() == upstream.SHA256


def test_the_copy_runs_against_our_throttles() -> None:
    """The swap took: the copy's throttle classes are ours, and DRF's module is DRF's again."""
    import rest_framework.throttling

    from ratelimit_app import throttling

    copy = upstream.module()
    assert copy.UserRateThrottle is throttling.UserRateThrottle
    assert issubclass(copy.User3SecRateThrottle, throttling.SimpleRateThrottle)
    assert rest_framework.throttling.UserRateThrottle is not throttling.UserRateThrottle
