"""The demo's JSON API (demo_site/api.py): shorten, read visits, and the throttles in front."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client, override_settings

import metrics_app
from demo_site.shortener.models import Link
from metrics_app.testing import frozen_clock
from ratelimit_app.backends import reset_backends
from ratelimit_app.testing import forget_refusals
from ratelimit_app.testing import frozen_clock as frozen_ratelimit_clock

NOW = datetime(2026, 11, 22, 13, 5, tzinfo=UTC)
T0 = 1_800_000_000


@pytest.fixture(autouse=True)
def no_refusals_remembered(site: None) -> Iterator[None]:
    """Each test starts with no refusal in this process's memory (the site fixture applies
    the demo's settings, REST_FRAMEWORK included)."""
    forget_refusals()
    yield
    forget_refusals()


def create(client: Client, body: Any, **extra: Any) -> Any:
    return client.post("/api/links/", json.dumps(body), content_type="application/json", **extra)


def test_a_link_is_created(client: Client) -> None:
    answer = create(client, {"url": "https://example.com/a/long/page"})
    assert answer.status_code == 201
    data = answer.json()
    link = Link.objects.get(key=data["key"])
    assert link.url == data["url"] == "https://example.com/a/long/page"
    assert answer["Location"] == data["short_url"] == f"http://testserver/s/{link.key}"
    assert data["visits_url"] == f"http://testserver/api/links/{link.key}/visits/"
    # Behind two throttles, checked in one round trip, each shown in the headers, and the
    # budget of link creation (the form's: a limit without a rule's name).
    policy = answer["RateLimit-Policy"]
    for name in ("drf:anon:30/m", "drf:anon:1000/d", "drf:user:120/m", "10/m", "100/d"):
        assert f'"{name}"' in policy
    assert '"10/m";r=9;t=' in answer["RateLimit"]


@pytest.mark.parametrize(
    "body",
    [
        {"url": "javascript:alert(1)"},
        {"url": ""},
        {"url": 5},
        {"url": "x" * 3000},
        {"nothing": True},
        ["https://example.com/"],
        "https://example.com/",
        None,
    ],
)
def test_a_bad_body_is_a_400(client: Client, body: Any) -> None:
    answer = create(client, body)
    assert answer.status_code == 400
    assert "url" in answer.json()
    assert not Link.objects.exists()


def test_malformed_json_is_a_400(client: Client) -> None:
    answer = client.post("/api/links/", "{nope", content_type="application/json")
    assert answer.status_code == 400
    assert "JSON parse error" in answer.json()["detail"]


def test_creating_is_limited_per_client(client: Client) -> None:
    with frozen_ratelimit_clock(T0):
        codes = [create(client, {"url": "https://example.com/"}).status_code for _ in range(11)]
        refused = create(client, {"url": "https://example.com/"})
        other = create(client, {"url": "https://example.com/"}, REMOTE_ADDR="192.0.2.99")
    assert codes == [201] * 10 + [429]
    assert refused.status_code == 429
    # DRF's 429 (not the 403 a Ratelimited raised in a DRF view becomes), with the wait.
    wait = int(refused["Retry-After"])
    assert 55 <= wait <= 61
    assert f'"10/m";r=0;t={wait}' in refused["RateLimit"]
    assert refused.json()["detail"] == (
        f"Request was throttled. Expected available in {wait} seconds."
    )
    assert other.status_code == 201  # another client counts on its own
    assert Link.objects.count() == 11


class TestOneBudgetForCreating:
    """The form and the API create links from one budget, per account (per address when
    logged out): 10 a minute, whichever door is used."""

    @staticmethod
    def form(client: Client, n: int) -> int:
        response = client.post("/", {"url": f"https://example.com/form/{n}"})
        return response.status_code

    def test_anonymous_clients(self, client: Client) -> None:
        with frozen_ratelimit_clock(T0):
            by_form = [self.form(client, n) for n in range(5)]
            by_api = [
                create(client, {"url": "https://example.com/"}).status_code for _ in range(5)
            ]
            assert by_form == [302] * 5
            assert by_api == [201] * 5
            page = client.post("/", {"url": "https://example.com/more"})
            answer = create(client, {"url": "https://example.com/more"})
        assert page.status_code == answer.status_code == 429
        assert b"Your link was not created" in page.content
        assert answer.json()["detail"].startswith("Request was throttled.")
        assert Link.objects.count() == 10

    def test_an_account_whichever_door(self, django_user_model: Any) -> None:
        user = django_user_model.objects.create_user("ann", password="a long pass phrase")
        session = Client()
        session.force_login(user)
        token = base64.b64encode(b"ann:a long pass phrase").decode()
        with frozen_ratelimit_clock(T0):
            # The same account from two addresses: one budget, counted by the account.
            by_form = [self.form(session, n) for n in range(4)]
            by_api = [
                create(
                    Client(),
                    {"url": "https://example.com/"},
                    REMOTE_ADDR=f"192.0.2.{n + 10}",
                    HTTP_AUTHORIZATION=f"Basic {token}",
                ).status_code
                for n in range(6)
            ]
            refused_api = create(
                Client(), {"url": "https://example.com/"}, HTTP_AUTHORIZATION=f"Basic {token}"
            ).status_code
            refused_form = self.form(session, 99)
        assert by_form == [302] * 4
        assert by_api == [201] * 6
        assert refused_api == refused_form == 429
        assert Link.objects.filter(created_by=user).count() == 10


def test_creating_fails_closed_as_the_form_does(
    client: Client, demo_settings: dict[str, Any]
) -> None:
    """With the counters down and RATELIMIT_FAIL_OPEN off, both doors answer 503 (the
    limit cannot be checked), never a 429 that blames the client."""
    dead = {
        **demo_settings["CACHES"],
        "dead": {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": "127.0.0.1:9",  # the discard port: connection refused
        },
    }
    # No throttles: the budget's own answer, not theirs (they would fail closed too).
    api = {**demo_settings["REST_FRAMEWORK"], "DEFAULT_THROTTLE_CLASSES": []}
    with override_settings(
        CACHES=dead, RATELIMIT_USE_CACHE="dead", RATELIMIT_FAIL_OPEN=False, REST_FRAMEWORK=api
    ):
        reset_backends()
        try:
            answer = create(client, {"url": "https://example.com/"})
            page = client.post("/", {"url": "https://example.com/"})
        finally:
            reset_backends()
    assert answer.status_code == page.status_code == 503
    assert "cannot be checked right now" in answer.json()["detail"]
    assert not Link.objects.exists()


def test_a_links_visits(client: Client) -> None:
    key = create(client, {"url": "https://example.com/"}).json()["key"]
    with frozen_clock(NOW):
        for _ in range(3):
            assert client.get(f"/s/{key}").status_code == 302
        metrics_app.flush()
        day = client.get(f"/api/links/{key}/visits/")
        week = client.get(f"/api/links/{key}/visits/?period=7d")
    assert day.status_code == week.status_code == 200
    data = day.json()
    assert (data["key"], data["total"], data["period"], data["period_total"]) == (key, 3, "24h", 3)
    assert data["step"] == 60  # the minute buckets of the last day
    assert {"start": NOW.isoformat(), "count": 3} in data["visits"]
    assert len(data["visits"]) == 24 * 60 + 1
    assert (week.json()["period"], week.json()["period_total"]) == ("7d", 3)


def test_an_unknown_link_is_a_404(client: Client) -> None:
    answer = client.get("/api/links/nope/visits/")
    assert answer.status_code == 404
    assert answer.json() == {"detail": "No Link matches the given query."}


def test_reading_is_throttled_for_anonymous_clients(client: Client) -> None:
    with frozen_ratelimit_clock(T0):
        key = create(client, {"url": "https://example.com/"}).json()["key"]
        codes = [client.get(f"/api/links/{key}/visits/").status_code for _ in range(30)]
    # 30 a minute for the anonymous client: the create above was the first.
    assert codes == [200] * 29 + [429]


def test_the_admins_usage_lookup_offers_and_reads_the_throttles(
    client: Client, admin_client: Client
) -> None:
    with frozen_ratelimit_clock(T0):
        for _ in range(3):
            assert create(client, {"url": "https://example.com/"}).status_code == 201
        form = admin_client.get("/admin/ratelimit_app/rule/usage/").content.decode()
        page = admin_client.post(
            "/admin/ratelimit_app/rule/usage/", {"rule": "drf:anon", "subject": "127.0.0.1"}
        )
    for scope, rate in (("anon", "30/m;1000/d"), ("user", "120/m;10000/d")):
        assert f'<option value="drf:{scope}">drf:{scope} — DRF throttle, {rate}</option>' in form
    assert page.status_code == 200
    usage = page.context["usage"]
    assert (usage["count"], usage["limit"], usage["remaining"]) == (3, 30, 27)
    assert "127.0.0.1 under rule drf:anon" in page.content.decode()


class TestScanning:
    """The API's visits tell whether a key exists, as /s/ and /links/ do: one budget."""

    def test_the_api_is_refused_once_the_pages_are(self, client: Client) -> None:
        Link.objects.create(key="abc", url="https://example.com/")
        with frozen_ratelimit_clock(T0):
            codes = [client.get(f"/s/guess{n}").status_code for n in range(30)]
            unknown = client.get("/api/links/nope/visits/")
            known = client.get("/api/links/abc/visits/")
        assert codes == [404] * 30
        assert unknown.status_code == known.status_code == 429
        assert "abc" not in known.content.decode()

    def test_the_apis_unknown_keys_count_with_the_pages(self, client: Client) -> None:
        with frozen_ratelimit_clock(T0):
            codes = [
                client.get(f"/api/links/guess{n}/visits/").status_code
                if n % 2
                else client.get(f"/links/guess{n}/").status_code
                for n in range(30)
            ]
            assert codes == [404] * 30
            assert client.get("/s/guess").status_code == 429

    def test_creating_does_not_use_up_the_budget(self, client: Client) -> None:
        with frozen_ratelimit_clock(T0):
            bad = [create(client, {"url": "javascript:alert(1)"}).status_code for _ in range(10)]
            codes = [client.get(f"/s/guess{n}").status_code for n in range(31)]
        assert bad == [400] * 10
        assert codes == [404] * 30 + [429]
