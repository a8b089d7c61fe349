"""Settings and hygiene for DRF's own throttling tests (``test_drf_throttling``).

* ``default`` cache: local memory, or, for the ``...OnMemcached`` / ``...OnRedis`` classes,
  our real throwaway servers (``tests/conftest.py``); the limiter counts there.
* Before each test, the refusals this process remembers are forgotten: the copy's
  ``setUp`` clears the cache, which a suite should pair with
  :func:`ratelimit_app.testing.forget_refusals`.
* After each test, what the copy changes on classes and settings and never puts back is put
  back: ``SimpleRateThrottle.scope`` (its ``setUp`` writes our class), the ``timer`` and
  ``rate`` of its throttles, ``NonTimeThrottle.called``, and ``api_settings.NUM_PROXIES``.
  Its classes run more than once here (on each counter server), so a leak would change
  the later runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from ratelimit_app import throttling
from ratelimit_app.backends import reset_backends
from ratelimit_app.testing import forget_refusals
from tests.peers import suites
from tests.peers.drf_suite import upstream

HERE = Path(__file__).parent

#: The copy's tests that pin a documented difference of sliding windows: expected to fail
#: with the exception named, strictly (a pass would mean the difference is gone and
#: docs/drf.rst is wrong; another exception is a failure of its own).
EDGE = (
    "a hit made at t leaves the window at t + W + W/60, not at t + W: the oldest fine bucket "
    "counts in full, so no window of W seconds ever admits more than N; at exactly t + W DRF "
    "admits and we refuse (docs/drf.rst, 'A hit leaves the window one bucket later')"
)
RETRY = (
    "Retry-After is the exact wait, rounded up: W + W/60 after the oldest hit, so '2' for "
    "'3/sec' and '61' for '3/min' where DRF says '1' and '60' (docs/drf.rst, 'A hit leaves "
    "the window one bucket later')"
)
NOT_COUNTED = (
    "a request refused by one throttle of the view is counted by none (DRF counts it in the "
    "throttles that admit it): after 24 requests at once, 3/sec and 6/min hold 3 here, so "
    "3/sec refuses with Retry-After '2' where DRF's 6/min, holding 6, says '60' (docs/drf.rst, "
    "'A refused request counts nowhere')"
)
HISTORY = (
    "pins DRF's list of timestamps (throttle.history), which sliding windows do not keep "
    "(docs/drf.rst, 'No history list')"
)
# Each difference shows as one of the copy's plain ``assert`` statements failing.
DIFFERENCES = {
    ("ThrottlingTests", "test_request_throttling_expires"): suites.Difference(
        EDGE, AssertionError
    ),
    # Fails first on Retry-After ('2', not '1'), then on the edge (at t=1 the window still
    # holds the three hits of t=0), then on the refused request DRF's 6/min counted.
    ("ThrottlingTests", "test_request_throttling_multiple_throttles"): suites.Difference(
        RETRY + "; " + EDGE + "; " + NOT_COUNTED, AssertionError
    ),
    ("ThrottlingTests", "test_throttle_rate_change_negative"): suites.Difference(
        NOT_COUNTED, AssertionError
    ),
    ("ThrottlingTests", "test_seconds_fields"): suites.Difference(RETRY, AssertionError),
    ("ThrottlingTests", "test_minutes_fields"): suites.Difference(RETRY, AssertionError),
    ("ThrottlingTests", "test_next_rate_remains_constant_if_followed"): suites.Difference(
        EDGE, AssertionError
    ),
    ("ScopedRateThrottleTests", "test_scoped_rate_throttle"): suites.Difference(
        EDGE, AssertionError
    ),
    ("SimpleRateThrottleTests", "test_wait_returns_none_if_there_are_no_available_requests"): (
        suites.Difference(HISTORY, AssertionError)
    ),
}

#: Class attributes the copy writes on throttle classes.
WRITTEN = ("timer", "rate", "scope", "called", "THROTTLE_RATES")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    suites.mark_differences(items, HERE, upstream.MODULE, DIFFERENCES)


def _throttle_classes() -> list[type]:
    copy = upstream.module()
    found: list[type] = [throttling.SimpleRateThrottle]
    for obj in vars(copy).values():
        if isinstance(obj, type) and obj.__module__ == upstream.MODULE:
            found.append(obj)
    return found


def _snapshot(classes: list[type]) -> list[tuple[type, dict[str, Any]]]:
    return [(c, {k: vars(c)[k] for k in WRITTEN if k in vars(c)}) for c in classes]


def _restore(saved: list[tuple[type, dict[str, Any]]]) -> None:
    for cls, attrs in saved:
        for name in WRITTEN:
            if name in attrs:
                setattr(cls, name, attrs[name])
            elif name in vars(cls):
                delattr(cls, name)


@pytest.fixture(autouse=True)
def drf_suite(request: pytest.FixtureRequest) -> Iterator[None]:
    """The copy's cache on our servers, no remembered refusal, and nothing leaked after."""
    from rest_framework.settings import api_settings

    saved = _snapshot(_throttle_classes())
    with override_settings(
        CACHES={"default": suites.counter_cache(request, "drf")}, RATELIMIT_USE_CACHE="default"
    ):
        reset_backends()
        forget_refusals()
        try:
            yield
        finally:
            _restore(saved)
            vars(api_settings).pop("NUM_PROXIES", None)
            api_settings._cached_attrs.discard("NUM_PROXIES")
            forget_refusals()
    reset_backends()
