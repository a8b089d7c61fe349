"""Overrides applied to a request's decisions (issue 35): an override changes rates, never
places (a rule's in-flight limit shares its name), and a table changed in place is asked
again. The demo's ``link-pages`` scenario runs through the middleware, six requests at once
held inside the view."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from django.test import RequestFactory, override_settings

from ratelimit_app import store
from ratelimit_app.algorithms.gcra import IN_FLIGHT
from ratelimit_app.algorithms.rates import Rate
from ratelimit_app.config import limits
from ratelimit_app.config.policy import policy
from ratelimit_app.engine.enforce import Decision
from ratelimit_app.identity.addresses import mask_ip
from ratelimit_app.models import Override
from ratelimit_app.overrides import applied
from ratelimit_app.overrides import table as overrides
from ratelimit_app.runtime import RUNTIME
from tests.ratelimit import test_in_flight
from tests.ratelimit.test_in_flight import crowd, fresh  # noqa: F401 (an autouse fixture)

#: The demo's link-pages rule (demo_site/settings.py), on the held view.
LINK_PAGES = {
    "name": "link-pages",
    "path": "/held/",
    "methods": ["GET", "HEAD"],
    "key": "ip",
    "rate": "300/h",
    "cost": 10,
    "concurrent": 3,
    "lease": "30s",
}
ADDRESS = "127.0.0.1"  # the test client's


@pytest.fixture(autouse=True)
def forgotten() -> Iterator[None]:
    applied.forget()
    store.forget()
    yield
    applied.forget()
    store.forget()


def decisions(limit: limits.Limit) -> list[Decision]:
    """The decisions the middleware makes for a rule with ``concurrent``: its rate limit's
    and its in-flight limit's, both under the rule's name."""
    request = RequestFactory().get("/", REMOTE_ADDR=ADDRESS)
    assert limit.inflight is not None
    rate, places = limit.check(request), limit.inflight.check(request)
    assert rate is not None and places is not None
    enforced = policy(limit, name="link-pages", fail_open=True)
    assert enforced.places is not None
    return [Decision(enforced, rate), Decision(enforced.places, places)]


def applying(table: overrides.Table, found: list[Decision]) -> list[Decision]:
    request = RequestFactory().get("/", REMOTE_ADDR=ADDRESS)
    with mock.patch.object(RUNTIME, "snapshot", SimpleNamespace(overrides=table)):
        return list(applied.apply(request, found))


def table(rate: str) -> overrides.Table:
    return overrides.compile_table([overrides.parse("link-pages", ADDRESS, rate)], mask_ip)


def link_pages() -> limits.Limit:
    return limits.build("link-pages", "ip", "300/h", cost=10, concurrent=3, lease="30s")


def test_a_rate_override_leaves_the_places_alone() -> None:
    found = decisions(link_pages())
    places = found[1].check
    kept = applying(table("600/h"), found)
    assert [d.check.algorithm == IN_FLIGHT for d in kept] == [False, True]
    assert kept[0].check.rates == (Rate(600, 3600),)
    assert kept[1].check is places  # still three at once


def test_unlimited_lifts_the_rate_not_the_places() -> None:
    found = decisions(link_pages())
    places = found[1].check
    kept = applying(table("unlimited"), found)
    assert len(kept) == 1 and kept[0].check is places


def test_an_in_flight_limit_alone_is_left_alone() -> None:
    alone = limits.build("link-pages", "ip", None, concurrent=3)
    request = RequestFactory().get("/", REMOTE_ADDR=ADDRESS)
    check = alone.check(request)
    assert check is not None and check.algorithm == IN_FLIGHT
    alone_policy = policy(alone, name="link-pages", fail_open=True)
    kept = applying(table("unlimited"), [Decision(alone_policy, check)])
    assert len(kept) == 1 and kept[0].check is check


def test_a_table_changed_in_place_is_asked_again() -> None:
    """The answers are remembered per table and version: a ``put`` or a ``drop`` is seen
    by the next request."""
    found = table("600/h")
    lim = limits.build("link-pages", "ip", "300/h")
    request = RequestFactory().get("/", REMOTE_ADDR=ADDRESS)

    def rates() -> Any:
        check = lim.check(request)
        assert check is not None
        kept = applying(found, [Decision(policy(lim, name="link-pages", fail_open=True), check)])
        return kept[0].check.rates if kept else None

    assert rates() == (Rate(600, 3600),)
    found.put(overrides.parse("link-pages", ADDRESS, "900/h"), mask_ip)
    assert rates() == (Rate(900, 3600),)
    found.put(overrides.parse("link-pages", ADDRESS, "unlimited"), mask_ip)
    assert rates() is None
    assert found.drop("link-pages", overrides.parse_subject(ADDRESS))
    assert rates() == (Rate(300, 3600),)


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls(test_in_flight.__name__)
def test_the_demo_link_pages_keep_three_at_once(backend_kind: str) -> None:
    """The demo's scenario: an override ``600/h`` for an address, six link pages opened at
    once from it: three are drawn, the others refused."""
    Override.objects.create(limit="link-pages", subject=ADDRESS, rate="600/h")
    with override_settings(RATELIMIT_RULES=[LINK_PAGES]):
        # Read here, not by the requests' threads (whose database connections nobody
        # closes: Python 3.13 warns of each).
        store.current()
        answers = crowd("/held/", 6)
        assert sorted(a.status_code for a in answers) == [200] * 3 + [429] * 3
        assert test_in_flight.GATE.most == 3
        assert store.current().overriding
        admitted = next(a for a in answers if a.status_code == 200)
        assert '"link-pages:600/h"' in admitted["RateLimit-Policy"]  # the override applied
