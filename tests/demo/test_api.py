"""The demo's JSON API (demo_site/api.py): shorten, read visits, and the throttles in front."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

import metrics_app
from demo_site.shortener.models import Link
from metrics_app.models import Series
from metrics_app.testing import frozen_clock
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
    # Behind three throttles, checked in one round trip, each shown in the headers.
    policy = answer["RateLimit-Policy"]
    for name in ("drf:anon:30/m", "drf:anon:1000/d", "drf:links:10/m", "drf:user:120/m"):
        assert f'"{name}"' in policy


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


def test_creating_is_throttled_per_client(client: Client) -> None:
    with frozen_ratelimit_clock(T0):
        codes = [create(client, {"url": "https://example.com/"}).status_code for _ in range(11)]
        refused = create(client, {"url": "https://example.com/"})
        other = create(client, {"url": "https://example.com/"}, REMOTE_ADDR="192.0.2.99")
    assert codes == [201] * 10 + [429]
    assert refused.status_code == 429
    assert refused["Retry-After"] == "61"
    assert '"drf:links:10/m";r=0;t=61' in refused["RateLimit"]
    assert refused.json()["detail"] == "Request was throttled. Expected available in 61 seconds."
    assert other.status_code == 201  # another client counts on its own
    assert Link.objects.count() == 11
    metrics_app.flush()
    assert Series.objects.get(name="ratelimit:drf:links").total == 2


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
            "/admin/ratelimit_app/rule/usage/", {"rule": "drf:links", "subject": "127.0.0.1"}
        )
    for scope, rate in (
        ("anon", "30/m;1000/d"),
        ("user", "120/m;10000/d"),
        ("links", "10/m;100/d"),
    ):
        assert f'<option value="drf:{scope}">drf:{scope} — DRF throttle, {rate}</option>' in form
    assert page.status_code == 200
    usage = page.context["usage"]
    assert (usage["count"], usage["limit"], usage["remaining"]) == (3, 10, 7)
    assert "127.0.0.1 under rule drf:links" in page.content.decode()
