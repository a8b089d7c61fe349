"""The operators' controls through the admin's rule form (a database rule), and what each
costs in round trips: a cost, an override or a ban none, an in-flight limit one (the release);
on local memory, real memcached and real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from ratelimit_app import store
from ratelimit_app.models import Ban, Override, Rule
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import RoundTrips

T0 = 1_800_000_000.0
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "ratelimit_app.middleware.RatelimitMiddleware",
]
PATH = "/rules/named/"

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("backend_kind")]


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.ratelimit.urls", MIDDLEWARE=MIDDLEWARE):
        store.forget()
        forget_refusals()
        yield
    store.forget()
    forget_refusals()


def admin_client() -> Client:
    user = User.objects.create_superuser("boss", password="pw")
    client = Client()
    client.force_login(user)
    return client


def rule_form(**fields: Any) -> dict[str, Any]:
    return {
        "name": "db-rule",
        "enabled": "on",
        "path": PATH,
        "url_name": "",
        "methods": "",
        "key": "ip",
        "rate": "10/m",
        "count": "all",
        "algorithm": "sliding_window",
        "burst": "",
        "cost": "1",
        "concurrent": "",
        "lease": "",
        "block": "on",
        "fail_open": "on",
        "ban_after": "",
        "ban_within": "",
        "ban_for": "",
        "ban_max": "",
        "note": "",
        **fields,
    }


def saved(**fields: Any) -> Rule:
    response = admin_client().post("/admin/ratelimit_app/rule/add/", rule_form(**fields))
    assert response.status_code == 302, response.context["adminform"].form.errors
    return Rule.objects.get(name="db-rule")


def statuses(n: int, ip: str = "192.0.2.50") -> list[int]:
    client = Client()
    return [client.get(PATH, REMOTE_ADDR=ip).status_code for _ in range(n)]


def test_a_cost_saved_in_the_admin_counts() -> None:
    assert saved(cost="4").cost == 4
    with frozen_clock(T0):
        assert statuses(4) == [200, 200, 429, 429]


def test_a_dry_run_saved_in_the_admin_refuses_nothing() -> None:
    saved(rate="1/m", shadow="on")
    with frozen_clock(T0):
        assert statuses(3) == [200, 200, 200]


def test_an_in_flight_limit_saved_in_the_admin_needs_no_rate() -> None:
    rule = saved(rate="", concurrent="1", lease="30s")
    assert (rule.concurrent, rule.lease) == (1, "30s")
    with frozen_clock(T0):
        assert statuses(3) == [200, 200, 200]  # one at a time, each given back


def test_a_ban_saved_in_the_admin_bans() -> None:
    saved(rate="1/m", ban_after="2", ban_within="10m", ban_for="1h", ban_site="on")
    with frozen_clock(T0):
        assert statuses(4) == [200, 429, 429, 429]
    assert Ban.objects.get().site


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"cost": "0"}, "cost", "greater than or equal to 1"),
        ({"lease": "30s"}, "lease", "set concurrent too"),
        ({"concurrent": "2", "lease": "9h"}, "lease", "1s to 1h"),
        ({"ban_after": "3", "ban_within": "10m"}, "ban_after", "'for' is missing"),
        ({"rate": ""}, "rate", "expected a rate"),
    ],
)
def test_a_bad_control_is_a_form_error_naming_the_field(
    fields: dict[str, Any], field: str, words: str
) -> None:
    response = admin_client().post("/admin/ratelimit_app/rule/add/", rule_form(**fields))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert words in " ".join(errors[field])
    assert not Rule.objects.exists()


# -- round trips ------------------------------------------------------------------------------


def trips_of(
    monkeypatch: pytest.MonkeyPatch, n: int, ip: str = "192.0.2.60"
) -> tuple[list[int], int]:
    """Statuses of ``n`` requests after a warm one (the configuration loaded), and the round
    trips they made."""
    client = Client()
    client.get("/rules/unnamed/", REMOTE_ADDR="192.0.2.99")  # loads the snapshot
    trips = RoundTrips(monkeypatch)
    found = [client.get(PATH, REMOTE_ADDR=ip).status_code for _ in range(n)]
    return found, trips.count


def rule(**fields: Any) -> dict[str, Any]:
    return {"name": "r", "path": PATH, "key": "ip", "rate": "2/m", **fields}


def test_a_cost_adds_no_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(RATELIMIT_RULES=[rule(rate="10/m", cost=3)]), frozen_clock(T0):
        assert trips_of(monkeypatch, 2) == ([200, 200], 2)


def test_an_override_adds_no_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    Override.objects.create(limit="r", subject="192.0.2.60", rate="100/m")
    with override_settings(RATELIMIT_RULES=[rule()]), frozen_clock(T0):
        assert trips_of(monkeypatch, 3) == ([200, 200, 200], 3)  # 2/m for the others


def test_a_ban_adds_no_round_trip_to_a_subject_never_banned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ban = {"after": 5, "within": "1h", "for": "1h"}
    with frozen_clock(T0):
        with override_settings(RATELIMIT_RULES=[rule()]):
            plain = trips_of(monkeypatch, 3, ip="192.0.2.61")
        forget_refusals()
        with override_settings(RATELIMIT_RULES=[rule(ban=ban)]):
            banning = trips_of(monkeypatch, 3, ip="192.0.2.62")
    # Admitted: one round trip each; the refusal: the check, then its take-back (and, with a
    # ban, its strike in that same trip).
    assert plain == banning == ([200, 200, 429], 4)


def test_an_in_flight_limit_adds_one_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(RATELIMIT_RULES=[rule(rate="10/m", concurrent=2)]), frozen_clock(T0):
        assert trips_of(monkeypatch, 2) == ([200, 200], 4)
