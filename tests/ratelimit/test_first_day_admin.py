"""An operator's first day, in the admin: the rules list shows every control of a rule (8),
*Refused lately* shows one row per subject shown (9), the usage form names an in-flight
limit as ``ratelimit_usage`` does (13), and a DRF throttle's ban of an address shows the
address (14)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import caches
from django.test import Client, override_settings

import metrics_app
from metrics_app import buffer
from metrics_app.testing import frozen_clock as metrics_clock
from ratelimit_app import store
from ratelimit_app.bans import applied as bans
from ratelimit_app.models import Ban, Rule
from ratelimit_app.operators.admin import UsageForm
from ratelimit_app.testing import forget_refusals, frozen_clock

pytestmark = pytest.mark.django_db

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "ratelimit_app.middleware.RatelimitMiddleware",
]
BAN = {"after": 3, "within": "10m", "for": "1h", "max": "4h"}
RULES: list[dict[str, Any]] = [
    {"name": "slots", "path": "/rules/async/", "key": "ip", "concurrent": 3},
    {
        "name": "costly",
        "path": "/rules/named/",
        "key": "ip",
        "rate": "10/m",
        "cost": 5,
        "concurrent": 2,
        "ban": BAN,
        "shadow": True,
    },
    {"name": "by-ip", "path": "/rules/unnamed/", "key": "ip", "rate": "0/m"},
]
RULES_PAGE = "/admin/ratelimit_app/rule/"
REFUSED_PAGE = "/admin/ratelimit_app/rule/refused/"
T0 = 1_800_000_000.0


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    buffer.reset()
    with override_settings(
        ROOT_URLCONF="tests.ratelimit.urls",
        MIDDLEWARE=MIDDLEWARE,
        RATELIMIT_RULES=RULES,
    ):
        store.forget()
        forget_refusals()
        caches["default"].clear()
        yield
    store.forget()
    forget_refusals()
    buffer.reset()


def superuser() -> Client:
    User.objects.create_superuser("root", password="pw")
    client = Client()
    client.login(username="root", password="pw")
    return client


# -- 8: the rules list ------------------------------------------------------------------------


def settings_row(html: str, name: str) -> str:
    start = html.index(f'<td class="rule-name">{name}</td>')
    return html[start : html.index("</tr>", start)]


def test_the_settings_rules_show_their_places_cost_ban_and_dry_run() -> None:
    html = superuser().get(RULES_PAGE).content.decode()
    slots = settings_row(html, "slots")
    assert "<td>3 in flight</td>" in slots  # not an empty rate
    costly = settings_row(html, "costly")
    assert "<td>10/m</td>" in costly
    for mark in ("cost 5", "2 in flight", ">ban 1 h<", "dry run"):
        assert mark in costly
    assert 'title="3 refusals within 10 min ban for 1 h, up to 4 h."' in costly
    assert "<td>-</td>" in settings_row(html, "by-ip")  # no options


def test_the_database_rules_show_their_places_cost_ban_and_dry_run() -> None:
    Rule.objects.create(name="db-slots", path="/db/", key="ip", rate="", concurrent=4)
    Rule.objects.create(
        name="db-costly",
        path="/db2/",
        key="ip",
        rate="5/m",
        cost=3,
        shadow=True,
        ban_after=2,
        ban_within="1h",
        ban_for="30m",
        ban_site=True,
    )
    page = superuser().get(RULES_PAGE)
    html = page.content.decode()
    rows = {
        name: html[html.index(f">{name}</a>") : html.index("</tr>", html.index(f">{name}</a>"))]
        for name in ("db-slots", "db-costly")
    }
    assert '<td class="field-shown_rate">4 in flight</td>' in rows["db-slots"]
    costly = rows["db-costly"]
    assert '<td class="field-shown_rate">5/m</td>' in costly
    for mark in ("cost 3", ">ban 30 min on every path<", "dry run"):
        assert mark in costly


# -- 9: Refused lately ------------------------------------------------------------------------


def test_one_masked_network_is_one_row_with_the_summed_counts() -> None:
    client = Client()
    with metrics_clock(T0):
        for last, n in ((1, 12), (2, 9), (3, 6), (4, 3)):
            for _ in range(n):
                assert client.get("/rules/unnamed/", REMOTE_ADDR=f"203.0.113.{last}").status_code
        for _ in range(20):
            client.get("/rules/unnamed/", REMOTE_ADDR="198.51.100.7")
        metrics_app.flush()
        page = superuser().get(REFUSED_PAGE)
    (limit,) = page.context["limits"]
    rows = [(s.label, s.hour, s.day) for s in limit.subjects]
    # 30 refusals of one /24 outrank the 20 of another address: one row each, by count.
    assert rows == [("203.0.113.0/24", 30, 30), ("198.51.100.0/24", 20, 20)]
    assert page.content.decode().count("203.0.113.0/24") == 1


def test_hashed_subjects_stay_apart() -> None:
    client = Client()
    with override_settings(RATELIMIT_REFUSED_SUBJECTS="hashed"), metrics_clock(T0):
        for last in (1, 2):
            client.get("/rules/unnamed/", REMOTE_ADDR=f"203.0.113.{last}")
        metrics_app.flush()
        page = superuser().get(REFUSED_PAGE)
    (limit,) = page.context["limits"]
    assert len(limit.subjects) == 2 and all(s.label == "" for s in limit.subjects)


# -- 13: the usage form -----------------------------------------------------------------------


def test_the_usage_form_names_an_in_flight_limit_as_the_command_does() -> None:
    choices = dict(UsageForm().fields["rule"].choices)  # type: ignore[attr-defined]
    assert choices["slots"] == "slots — key ip, 3 in flight"
    assert choices["costly"] == "costly — key ip, 10/m, 2 in flight"
    assert choices["by-ip"] == "by-ip — key ip, 0/m"


def test_the_usage_form_speaks_the_admin_s_language() -> None:
    """Item 10: the limits' descriptions are translated with the admin ("key ip" was
    English on a French site)."""
    from django.utils import translation

    with translation.override("fr"):
        choices = dict(UsageForm().fields["rule"].choices)  # type: ignore[attr-defined]
    assert choices["by-ip"] == "by-ip — clé ip, 0/m"
    assert all(" key " not in str(text) for text in choices.values())


# -- 14: a DRF throttle's ban -----------------------------------------------------------------


def test_a_user_or_ip_ban_of_an_address_shows_the_address() -> None:
    assert bans.label("user_or_ip", "198.51.100.0") == "198.51.100.0/24"
    assert bans.label("user_or_ip", "42") == ""  # a user's id stays hidden
    with override_settings(RATELIMIT_REFUSED_SUBJECTS="full"):
        assert bans.label("user_or_ip", "198.51.100.0") == "198.51.100.0"
        assert bans.label("user_or_ip", "42") == ""
    with override_settings(RATELIMIT_REFUSED_SUBJECTS="hashed"):
        assert bans.label("user_or_ip", "198.51.100.0") == ""


def test_the_anonymous_throttle_s_ban_is_listed_by_its_address() -> None:
    pytest.importorskip("rest_framework")
    from ratelimit_app import throttling
    from tests.drf.conftest import api_view, get

    throttle = type(
        "Banning",
        (throttling.AnonRateThrottle,),
        {"scope": "banning", "rate": "1/m", "ban": {"after": 2, "within": "1h", "for": "10m"}},
    )
    view = api_view(throttle)
    with frozen_clock(T0):
        found = [get(view, ip="198.51.100.7") for _ in range(4)]
    assert found[-1].status_code == 429
    (row,) = Ban.objects.filter(limit="drf:banning")
    assert (row.kind, row.label) == ("user_or_ip", "198.51.100.0/24")
    html = superuser().get("/admin/ratelimit_app/ban/").content.decode()
    assert "198.51.100.0/24" in html and "(hashed)" not in html
