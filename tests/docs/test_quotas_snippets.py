"""docs/quotas.rst's snippets, run as printed: the rule's quota beside its rate, and the
decorator, the DRF throttle and ``get_usage`` with theirs."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.http import HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path

from ratelimit_app.algorithms.calendar import Quota
from ratelimit_app.algorithms.rates import Rate
from ratelimit_app.config.rules import parse_rule
from ratelimit_app.testing import frozen_clock
from tests.docs.snippets import snippet
from tests.ratelimit.conftest import MIDDLEWARE

RUNS = [("quotas", 0), ("quotas", 1)]


def run(index: int, *needles: str, **names: Any) -> dict[str, Any]:
    shown = snippet("quotas", index, *needles)
    namespace: dict[str, Any] = {"__name__": "docs_quotas", **names}
    exec(compile(shown.code, shown.where, "exec"), namespace)  # (our own docs)
    return namespace


def api(request: Any) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("api/search/", api)]


def test_the_rules_quota_renews_on_the_first_in_paris() -> None:
    rules = run(0, '"quota": "10000/month"')["RATELIMIT_RULES"]
    limit = parse_rule(rules[0]).limit
    assert limit.static_rates == (
        Rate(20, 1),
        Quota(10000, 31 * 86400 + 3600, "month", "Europe/Paris"),
    )
    first = datetime(2026, 3, 1, tzinfo=ZoneInfo("Europe/Paris")).timestamp()
    client = Client(HTTP_X_API_KEY="k-1")
    with (
        override_settings(RATELIMIT_RULES=rules, ROOT_URLCONF=__name__, MIDDLEWARE=MIDDLEWARE),
        frozen_clock(first - 10),
    ):
        answer = client.get("/api/search/")
    assert answer.status_code == 200
    # (An API key is no requester's own counter: an admitted answer shows none.)
    assert "RateLimit" not in answer


def test_the_decorator_throttle_and_get_usage_count_their_quotas() -> None:
    request = RequestFactory().get("/", HTTP_X_API_KEY="k-2")
    zone = ZoneInfo(settings.TIME_ZONE)
    noon = datetime(2026, 3, 10, 12, tzinfo=zone).timestamp()
    with frozen_clock(noon):
        names = run(1, 'quota="10000/month"', 'quota="500/day"', request=request)
        assert names["search"](request) is None  # (the snippet's view returns nothing)
    usage = names["usage"]
    # Nothing counted yet: all 500 left, renewed at midnight (12 hours from noon).
    assert (usage["remaining"], usage["renews_in"]) == (500, 12 * 3600)
    assert usage["renews"] == "2026-03-11T00:00:00+00:00"
    throttle = names["PlanThrottle"]()
    assert throttle.limit().static_rates[-1] == Quota(
        10000, 31 * 86400 + 3600, "month", "Europe/Paris"
    )
