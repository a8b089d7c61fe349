"""Quotas on the calendar (:mod:`ratelimit_app.algorithms.calendar`): periods that end at a
fixed instant of a zone, across month ends, leap days and changes of daylight-saving time,
and a quota's count on every backend (exact under concurrency, reset, renewed when its
period ends). The stateful model test (``test_model``) drives quotas on every backend too.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ratelimit_app.algorithms import calendar, windows
from ratelimit_app.algorithms.calendar import Quota
from ratelimit_app.algorithms.rates import Rate, normalize
from ratelimit_app.core import get_usage, reset
from ratelimit_app.testing import frozen_clock

#: Zones whose days are not all 24 hours: a change at 02:00 (Paris, New York), midnight
#: skipped (Santiago), a 30-minute change (Lord Howe), a whole day skipped (Apia, 2011), an
#: offset of 5:45 (Kathmandu).
ZONES = (
    "UTC",
    "Europe/Paris",
    "America/New_York",
    "America/Santiago",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Asia/Kathmandu",
)
T_2000, T_2040 = 946_684_800, 2_208_988_800


def at(zone: str, *fields: int) -> float:
    return datetime(*fields, tzinfo=ZoneInfo(zone)).timestamp()  # type: ignore[arg-type]


def q(spec: str, zone: str = "UTC") -> Quota:
    return calendar.quota(spec, zone)


@settings(max_examples=400, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    unit=st.sampled_from(sorted(calendar.UNITS)),
    t=st.floats(T_2000, T_2040) | st.integers(T_2000, T_2040).map(float),
)
# Half a microsecond before midnight: datetime rounds it up to the next day.
@example(zone="UTC", unit="day", t=2208988799.9999995)
def test_a_period_holds_its_instant_and_the_next_starts_where_it_ends(
    zone: str, unit: str, t: float
) -> None:
    quota = q(f"5/{unit}", zone)
    i = calendar.index(quota, t)
    start, end = calendar.bounds(quota, i)
    assert start <= t < end
    assert end - start <= quota.seconds  # (a quota's seconds: its longest period)
    assert calendar.index(quota, start) == i
    assert calendar.index(quota, end - 0.001) == i
    after = calendar.index(quota, end)
    assert after > i and calendar.bounds(quota, after)[0] == end  # nothing between them
    assert calendar.renews(quota, t) == end


def test_days_of_23_and_25_hours_count_every_hit_once() -> None:
    day = q("5/day", "Europe/Paris")
    spring = calendar.index(day, at("Europe/Paris", 2024, 3, 31, 12))
    autumn = calendar.index(day, at("Europe/Paris", 2024, 10, 27, 12))
    start, end = calendar.bounds(day, spring)
    assert (end - start, calendar.bounds(day, autumn)[1] - calendar.bounds(day, autumn)[0]) == (
        23 * 3600,
        25 * 3600,
    )
    assert start == at("Europe/Paris", 2024, 3, 31) and end == at("Europe/Paris", 2024, 4, 1)
    # 02:30 never happens on that day; 02:30 in October happens twice, one day either way.
    fold = datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Paris")).timestamp()
    assert calendar.index(day, fold) == autumn == calendar.index(day, fold - 3600)


def test_a_skipped_midnight_and_a_skipped_day() -> None:
    santiago = q("5/day", "America/Santiago")  # 2024-09-08: 00:00 became 01:00
    i = calendar.index(santiago, at("America/Santiago", 2024, 9, 8, 12))
    start, end = calendar.bounds(santiago, i)
    assert datetime.fromtimestamp(start, ZoneInfo("America/Santiago")).hour == 1
    assert end - start == 23 * 3600
    apia = q("5/day", "Pacific/Apia")  # 2011-12-30 never happened there
    i = calendar.index(apia, at("Pacific/Apia", 2011, 12, 29, 12))
    after = calendar.index(apia, calendar.bounds(apia, i)[1])
    assert after - i == 2  # the 29th is followed by the 31st
    assert calendar.bounds(apia, i)[1] == calendar.bounds(apia, after)[0]


def test_months_end_on_the_first_and_february_knows_leap_years() -> None:
    month = q("5/month", "Europe/Paris")
    last = at("Europe/Paris", 2024, 1, 31, 23, 59, 59)
    first = at("Europe/Paris", 2024, 2, 1)
    assert calendar.index(month, last) + 1 == calendar.index(month, first)
    assert calendar.renews(month, last) == first
    feb = calendar.bounds(month, calendar.index(month, first))
    assert (feb[1] - feb[0]) / 86400 == 29
    utc = q("5/month")
    feb23 = calendar.bounds(utc, calendar.index(utc, at("UTC", 2023, 2, 10)))
    assert (feb23[1] - feb23[0]) / 86400 == 28
    dec = calendar.bounds(utc, calendar.index(utc, at("UTC", 2025, 12, 31, 23)))
    assert dec[1] == at("UTC", 2026, 1, 1)
    leap_day = q("5/day")
    assert calendar.renews(leap_day, at("UTC", 2024, 2, 29, 8)) == at("UTC", 2024, 3, 1)


def test_weeks_start_on_monday_across_a_year_end() -> None:
    week = q("5/week", "Europe/Paris")
    thursday = at("Europe/Paris", 2026, 1, 1, 10)  # ISO week 1 of 2026 starts on 2025-12-29
    start, end = calendar.bounds(week, calendar.index(week, thursday))
    assert start == at("Europe/Paris", 2025, 12, 29) and end == at("Europe/Paris", 2026, 1, 5)
    sunday_night = at("Europe/Paris", 2026, 1, 4, 23, 59)
    assert calendar.index(week, sunday_night) == calendar.index(week, thursday)


@pytest.mark.parametrize(
    ("spec", "zone", "error"),
    [
        ("10/year", "UTC", "'<count>/day'"),
        ("10/months", "UTC", "'<count>/month'"),
        ("ten/month", "UTC", "'<count>/month'"),
        ("10/month", "Mars/Olympus", "is not a zone"),
        ("10/month", "../etc/passwd", "is not a zone"),
        (10, "UTC", "not a string"),
        (f"{10**10}/day", "UTC", "over"),
    ],
)
def test_a_quota_that_is_none_is_refused_naming_it(spec: Any, zone: str, error: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=error):
        calendar.quota(spec, zone)


def test_a_quota_is_not_the_rate_of_the_same_count() -> None:
    day, rolling = q("10/day"), Rate(10, 86400)
    assert day != rolling and day.text == "10/day (UTC)"
    assert day != q("10/day", "Europe/Paris") and day == q(" 10/day ")
    assert normalize((rolling, day)) == (rolling, day)
    plan = windows.plan((rolling, day), at("UTC", 2024, 5, 5, 10), 60)
    assert sum(1 for r in plan.reads if r.startswith(":q")) == 1


def check(rf: RequestFactory, group: str, quota: Any, ip: str = "192.0.2.9") -> dict[str, Any]:
    found = get_usage(
        rf.get("/", REMOTE_ADDR=ip), group=group, key="ip", rate=quota, increment=True
    )
    assert found is not None
    return found


@pytest.mark.usefixtures("backend_kind")
def test_a_quota_counts_to_its_period_end_and_starts_over(rf: RequestFactory, group: str) -> None:
    quota = q("3/month", "Europe/Paris")
    before_end = at("Europe/Paris", 2024, 2, 29, 23, 59, 30)
    with frozen_clock(before_end) as clock:
        seen = [check(rf, group, quota) for _ in range(4)]
        assert [u["should_limit"] for u in seen] == [False, False, False, True]
        assert seen[-1]["retry_after"] == 30 and seen[-1]["reset"] == 30  # at midnight
        assert seen[2]["remaining"] == 0 and seen[0]["rate"] == "3/month (Europe/Paris)"
        assert (seen[0]["renews"], seen[0]["renews_in"]) == ("2024-03-01T00:00:00+01:00", 30)
        assert seen[0]["rates"][0]["renews"] == seen[0]["renews"]
        clock.advance(30)  # March 1st, 00:00 in Paris: a new count
        march = check(rf, group, quota)
        assert (march["count"], march["should_limit"]) == (1, False)
        # March has 31 days, less the hour of the change to summer time.
        assert march["reset"] == 31 * 86400 - 3600


@pytest.mark.usefixtures("backend_kind")
def test_a_reset_gives_a_quota_back(rf: RequestFactory, group: str) -> None:
    quota = q("2/day")
    with frozen_clock(at("UTC", 2024, 7, 1, 12)):
        assert [check(rf, group, quota)["should_limit"] for _ in range(3)] == [False, False, True]
        assert reset(group, "192.0.2.9", key="ip", rate=quota)
        assert check(rf, group, quota)["count"] == 1


@pytest.mark.parametrize("kind", ["memcached", "redis"])
def test_a_quota_is_exact_under_concurrency(
    kind: str, request: pytest.FixtureRequest, rf: RequestFactory, group: str
) -> None:
    """Eight threads spend one subject's quota of 25 at once: exactly 25 are admitted."""
    from django.test import override_settings

    from ratelimit_app.backends import reset_backends
    from tests.ratelimit.conftest import cache_config

    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "rl": cache_config(kind, request),
    }
    quota = q("25/week", "America/New_York")
    admitted: list[bool] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def spend() -> None:
        start.wait()
        for _ in range(10):
            ok = not check(rf, group, quota)["should_limit"]
            with lock:
                admitted.append(ok)

    with override_settings(CACHES=caches, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        try:
            with frozen_clock(at("America/New_York", 2024, 11, 3, 1, 30)):  # a repeated hour
                threads = [threading.Thread(target=spend) for _ in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert admitted.count(True) == 25 and len(admitted) == 80
                assert check(rf, group, quota)["should_limit"]
        finally:
            reset_backends()


# -- every door: a rule, @ratelimit, get_usage -------------------------------------------


@pytest.fixture
def site() -> Any:
    from django.test import override_settings

    from tests.ratelimit.conftest import MIDDLEWARE

    with override_settings(ROOT_URLCONF="tests.ratelimit.urls", MIDDLEWARE=MIDDLEWARE):
        yield


@pytest.mark.usefixtures("backend_kind", "site")
def test_a_rules_quota_beside_its_rate_refuses_until_the_period_renews() -> None:
    from django.test import Client

    from tests.ratelimit.conftest import rules

    client = Client()
    quota_rule = {
        "name": "monthly",
        "path": "/rules/named/",
        "key": "ip",
        "rate": "100/m",
        "quota": "2/month",
        "timezone": "Europe/Paris",
    }
    end = at("Europe/Paris", 2024, 4, 1)
    with rules(quota_rule), frozen_clock(end - 90) as clock:
        first = client.get("/rules/named/")
        assert first.status_code == 200
        assert '"monthly:2/month (Europe/Paris)";q=2;w=' in first["RateLimit-Policy"]
        assert '"monthly:100/m";q=100;w=60' in first["RateLimit-Policy"]
        assert client.get("/rules/named/").status_code == 200
        refused = client.get("/rules/named/")
        assert refused.status_code == 429
        assert int(refused["Retry-After"]) == 90  # the 1st of April, 00:00 in Paris
        assert refused["RateLimit"] == '"monthly:2/month (Europe/Paris)";r=0;t=90'
        clock.advance(90)
        assert client.get("/rules/named/").status_code == 200


@pytest.mark.usefixtures("backend_kind")
def test_a_decorators_quota_and_get_usage_count_the_same_period(
    rf: RequestFactory, group: str
) -> None:
    from django.http import HttpResponse

    from ratelimit_app.decorators import ratelimit

    @ratelimit(group=group, key="ip", quota="2/day", timezone="Asia/Kathmandu")
    def view(request: Any) -> HttpResponse:
        return HttpResponse("ok")

    with frozen_clock(at("Asia/Kathmandu", 2024, 6, 1, 23, 0)):
        assert [view(rf.get("/")).status_code for _ in range(2)] == [200, 200]
        usage = get_usage(
            rf.get("/"), group=group, key="ip", quota="2/day", timezone="Asia/Kathmandu"
        )
        assert usage is not None
        assert (usage["count"], usage["remaining"], usage["reset"]) == (2, 0, 3600)
        assert usage["should_limit"] and usage["rate"] == "2/day (Asia/Kathmandu)"


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"quota": "10/year"}, "field 'quota'"),
        ({"quota": "10/month", "timezone": "Nowhere/Else"}, "is not a zone"),
        ({"quota": "10/month", "algorithm": "leaky_bucket"}, "calendar periods"),
        ({"quota": "10/month", "rate": "myapp.rates.for_user"}, "beside a rate from code"),
        ({"quota": "10/month", "timezone": 3}, "expected a zone's name"),
        ({"timezone": "Europe/Paris"}, "field 'timezone'.*without a quota"),
    ],
)
def test_a_rule_with_a_quota_that_is_none_is_refused_naming_the_field(
    fields: dict[str, Any], error: str
) -> None:
    from ratelimit_app.config.rules import parse_rule

    raw = {"name": "q", "path": "/q/", "key": "ip", "rate": "5/m", **fields}
    with pytest.raises(ImproperlyConfigured, match=error):
        parse_rule(raw)


@pytest.mark.usefixtures("backend_kind", "site")
def test_ratelimit_reset_gives_a_rules_quota_back() -> None:
    """A paid invoice: the operator resets a customer, whose quota starts over now."""
    import io

    from django.core.management import call_command
    from django.test import Client

    from tests.ratelimit.conftest import rules

    client = Client()
    plan = {"name": "plan", "path": "/rules/named/", "key": "ip", "quota": "2/week"}
    with rules(plan), frozen_clock(at("UTC", 2024, 12, 31, 12)):
        assert [client.get("/rules/named/").status_code for _ in range(3)] == [200, 200, 429]
        out = io.StringIO()
        call_command("ratelimit_reset", "plan", "127.0.0.1", stdout=out)
        assert "Reset 127.0.0.1 for rule plan" in out.getvalue()
        assert client.get("/rules/named/").status_code == 200


# -- overrides: a partner's own quota -----------------------------------------------------


def test_an_overrides_quota_takes_the_zone_of_the_limit_it_overrides() -> None:
    rest, quotas = calendar.split("100/m; 1000000/month")
    assert rest == "100/m" and quotas == (Quota(1000000, calendar.UNITS["month"], "month", ""),)
    assert quotas[0].text == "1000000/month"
    paris = calendar.zoned(quotas, "Europe/Paris")
    assert paris == (q("1000000/month", "Europe/Paris"),)
    day = calendar.split("10/day")[1]
    assert calendar.zoned(day, None) == (Rate(10, 86400),)  # "10/day" as ever, without one
    assert calendar.zoned(quotas, None) is None  # a month's needs a limit with a quota


@pytest.mark.django_db
@pytest.mark.usefixtures("backend_kind", "site")
def test_a_partners_override_gives_it_a_quota_of_its_own() -> None:
    from django.core.exceptions import ValidationError
    from django.test import Client

    from ratelimit_app import store
    from ratelimit_app.models import Override
    from ratelimit_app.overrides import applied
    from ratelimit_app.testing import forget_refusals
    from tests.ratelimit.conftest import rules

    plan = {
        "name": "plan",
        "path": "/rules/named/",
        "key": "ip",
        "rate": "100/m",
        "quota": "2/month",
        "timezone": "Europe/Paris",
    }
    flat = {"name": "flat", "path": "/rules/unnamed/", "key": "ip", "rate": "100/m"}
    client = Client()
    with rules(plan, flat), frozen_clock(at("Europe/Paris", 2024, 5, 31, 23, 59, 50)) as clock:
        partner = Override(limit="plan", subject="127.0.0.1", rate="100/m;5/month")
        partner.full_clean()
        partner.save()
        store.forget()
        applied.forget()
        forget_refusals()
        seen = [client.get("/rules/named/") for _ in range(6)]
        assert [r.status_code for r in seen] == [200] * 5 + [429]
        assert seen[-1]["Retry-After"] == "10"
        assert '"plan:5/month (Europe/Paris)";r=0;t=10' in seen[-1]["RateLimit"]
        from ratelimit_app.runtime import RUNTIME

        memo = RUNTIME.part(applied._Memo).answers
        checks = {id(found) for _, found in memo.values()}
        client.get("/rules/named/")
        assert len(memo) == 1 and {id(found) for _, found in memo.values()} == checks
        clock.advance(10)  # June: the partner's 5 again
        assert [client.get("/rules/named/").status_code for _ in range(6)][-2:] == [200, 429]
        # A quota by the month overrides a limit's quota: "flat" has none to override.
        wrong = Override(limit="flat", subject="127.0.0.1", rate="5/month")
        with pytest.raises(ValidationError, match="this limit has none"):
            wrong.full_clean()
    store.forget()
    applied.forget()


@pytest.mark.django_db
@pytest.mark.usefixtures("backend_kind", "site")
def test_a_database_rules_quota_counts_and_its_mistakes_are_named() -> None:
    from django.core.exceptions import ValidationError
    from django.test import Client

    from ratelimit_app import store
    from ratelimit_app.models import Rule
    from ratelimit_app.operators.admin import options, rate_text

    rule = Rule(name="db-plan", path="/rules/named/", key="ip", quota="2/week", timezone="UTC")
    rule.full_clean()
    rule.save()
    assert rule.as_dict()["quota"] == "2/week" and "rate" not in rule.as_dict()
    assert rate_text(rule.as_dict()) == "2/week"
    store.forget()
    client = Client()
    try:
        with frozen_clock(at("UTC", 2024, 3, 3, 23, 59, 58)):  # a Sunday: the week ends soon
            statuses = [client.get("/rules/named/").status_code for _ in range(3)]
            assert statuses == [200, 200, 429]
        in_force = store.current().rules.rules
        described = next(r for r in in_force if r.name == "db-plan").describe()
        assert (described["rate"], described["quota"], described["timezone"]) == (
            "",
            "2/week",
            "UTC",
        )
        beside = Rule(name="db-both", path="/x/", key="ip", rate="5/m", quota="9/day")
        assert "quota 9/day" in options(beside.as_dict())
        wrong = Rule(name="db-wrong", path="/x/", key="ip", rate="5/m", quota="2/fortnight")
        with pytest.raises(ValidationError) as raised:
            wrong.full_clean()
        assert "2/fortnight" in str(raised.value.message_dict["quota"])
    finally:
        Rule.objects.all().delete()
        store.forget()


def test_a_time_zone_without_a_quota_is_a_mistake_at_every_door(rf: RequestFactory) -> None:
    from ratelimit_app.decorators import ratelimit, registry

    with pytest.raises(ImproperlyConfigured, match="without a quota"):
        get_usage(rf.get("/"), group="tz-alone", key="ip", rate="5/m", timezone="UTC")
    before = dict(registry)  # (the decorator's mistake is reported by E010: not to others)
    try:

        @ratelimit(key="ip", rate="5/m", timezone="UTC")
        def view(request: Any) -> Any:
            return None

        with pytest.raises(ImproperlyConfigured, match="without a quota"):
            view(rf.get("/"))
    finally:
        registry.clear()
        registry.update(before)
