"""A throttle's ``cost`` and ``get_cost`` (hits a request counts) and ``shadow`` (a dry run),
behind real DRF views on local memory, memcached and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from ratelimit_app import throttling
from ratelimit_app.signals import ratelimited
from ratelimit_app.testing import frozen_clock
from tests.drf.conftest import api_view, get, statuses

T0 = 1_800_000_000.0

pytestmark = pytest.mark.usefixtures("backend_kind")


def throttle(scope: str, **attrs: Any) -> type:
    return type(f"T_{scope}", (throttling.AnonRateThrottle,), {"scope": scope, **attrs})


def test_a_throttles_cost_counts_that_many_hits(scope: str) -> None:
    view = api_view(throttle(scope, rate="10/m", cost=4))
    with frozen_clock(T0):
        assert statuses(view, 4) == [200, 200, 429, 429]


class ByItems(throttling.AnonRateThrottle):
    rate = "10/m"

    def get_cost(self, request: Any, view: Any) -> int:
        return int(request.query_params.get("items", "1"))


def test_get_cost_weighs_each_request(scope: str) -> None:
    view = api_view(type("T", (ByItems,), {"scope": scope}))

    def status(items: int) -> int:
        return int(get(view, QUERY_STRING=f"items={items}").status_code)

    with frozen_clock(T0):
        assert [status(7), status(4), status(3), status(0), status(1)] == [
            200,
            429,  # 11 > 10: refused, counted nowhere
            200,  # 10
            200,  # free: not throttled
            429,
        ]


def test_a_get_cost_that_answers_nonsense_names_the_throttle(scope: str) -> None:
    bad = type("Bad", (ByItems,), {"scope": scope, "get_cost": lambda self, r, v: "x"})
    with pytest.raises(ImproperlyConfigured, match=r"Bad.*'x'"):
        get(api_view(bad))


@pytest.fixture
def shadow_signals() -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def receive(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    ratelimited.connect(receive)
    yield sent
    ratelimited.disconnect(receive)


def test_a_shadow_throttle_admits_and_reports(
    scope: str, shadow_signals: list[dict[str, Any]]
) -> None:
    view = api_view(throttle(scope, rate="2/m", shadow=True))
    with frozen_clock(T0):
        assert statuses(view, 5) == [200] * 5
    assert [(s["rule"], s.get("shadow")) for s in shadow_signals] == [(f"drf:{scope}", True)] * 3


def test_a_throttles_quota_refuses_until_its_period_renews(scope: str) -> None:
    """``quota`` beside the rate: both must allow, and a spent quota's wait is the seconds
    until its period (here a day in Paris) renews."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    view = api_view(throttle(scope, rate="100/m", quota="2/day", timezone="Europe/Paris"))
    midnight = datetime(2024, 10, 28, tzinfo=ZoneInfo("Europe/Paris")).timestamp()
    with frozen_clock(midnight - 45) as clock:
        assert statuses(view, 2) == [200, 200]
        refused = get(view)
        assert refused.status_code == 429 and refused["Retry-After"] == "45"
        clock.advance(45)
        assert statuses(view, 3) == [200, 200, 429]


def test_a_throttle_with_a_quota_that_is_none_names_the_throttle(scope: str) -> None:
    bad = throttle(scope, rate="100/m", quota="2/fortnight")
    with pytest.raises(ImproperlyConfigured, match=r"T_.*2/fortnight"):
        get(api_view(bad))
