"""The metrics admin through the Django test client: permissions, the list, the chart page.

Data goes through the real path (``record`` then ``flush``, ``downsample`` for old data), on
a frozen clock; ``series_many`` (the list's one query for a page of sparklines) is tested
against ``series`` here too.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import AbstractBaseUser, Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import metrics_app
from metrics_app import charts, query, rollup
from metrics_app.admin import DEFAULT_PERIOD, PERIODS, step_of
from metrics_app.models import Series
from metrics_app.testing import FrozenClock
from tests.metrics.conftest import T0

pytestmark = [pytest.mark.db_matrix, pytest.mark.django_db]

NS = {"svg": "http://www.w3.org/2000/svg"}
SECRET = "secret:series-7f3a"
SECRET_COUNT = 98_765
HOUR, DAY = 3600, 86400

UserFactory = Callable[[str], AbstractBaseUser | None]


def changelist_url() -> str:
    return reverse("admin:metrics_app_series_changelist")


def change_url(series: Series, period: str | None = None) -> str:
    url = reverse("admin:metrics_app_series_change", args=[series.pk])
    return url if period is None else f"{url}?period={period}"


@pytest.fixture
def data(clock: FrozenClock) -> dict[str, Series]:
    """Four series through record/flush/downsample, as of T0 (a Wednesday, 12:00 UTC).

    * ``shop:home``: 3 events every 10 minutes for the last two days (432 in the last 24 h);
    * ``ratelimit:login``: 2 blocks every hour for the last 12 hours, 5 more 20 days ago;
    * ``old``: 7 events 40 days ago (folded into weeks), none since;
    * ``SECRET``: the series no refused page may mention.
    """
    now = clock.t
    for k in range(2 * 24 * 6):
        metrics_app.record("shop:home", 3, at=now - 600 * (k + 1))
    for k in range(12):
        metrics_app.record("ratelimit:login", 2, at=now - 3600 * k - 60)
    metrics_app.record("ratelimit:login", 5, at=now - 20 * DAY)
    metrics_app.record("old", 7, at=now - 40 * DAY)
    metrics_app.record(SECRET, SECRET_COUNT, at=now - 120)
    metrics_app.flush()
    rollup.downsample()
    return {s.name: s for s in Series.objects.all()}


@pytest.fixture
def make_user(django_user_model: Any) -> UserFactory:
    """Users by kind: anonymous (None), plain, staff, viewer (staff + view), superuser."""

    def make(kind: str) -> AbstractBaseUser | None:
        if kind == "anonymous":
            return None
        if kind == "superuser":
            return django_user_model.objects.create_superuser(kind, f"{kind}@example.com", "pw")
        user = django_user_model.objects.create_user(kind, password="pw")
        user.is_staff = kind in {"staff", "viewer"}
        user.save()
        if kind in {"plain", "viewer"}:  # plain has the permission too: it is not enough
            user.user_permissions.add(
                Permission.objects.get(
                    codename="view_series", content_type__app_label="metrics_app"
                )
            )
        return user

    return make


def client_for(make_user: UserFactory, kind: str) -> Client:
    client = Client()
    user = make_user(kind)
    if user is not None:
        client.force_login(user)
    return client


def chart_of(response: Any) -> ET.Element:
    match = re.search(r'<svg[^>]*class="bkt-chart".*?</svg>', response.content.decode(), re.S)
    assert match, "no chart in the page"
    return ET.fromstring(match.group(0))


def mark_titles(root: ET.Element) -> list[str]:
    return [
        m.findtext("svg:title", default="", namespaces=NS)
        for m in root.findall(".//svg:g[@class='bkt-mark']", NS)
    ]


# -- permissions ---------------------------------------------------------------------------


def pages(data: dict[str, Series]) -> list[str]:
    secret = data[SECRET]
    return [
        changelist_url(),
        f"{changelist_url()}?q=secret",
        change_url(secret),
        *(change_url(secret, p.key) for p in PERIODS),
        reverse("admin:metrics_app_series_history", args=[secret.pk]),
    ]


def assert_no_leak(response: Any) -> None:
    body = response.content.decode()
    for leak in (SECRET, f"{SECRET_COUNT:,}", str(SECRET_COUNT), "bkt-chart", "bkt-sparkline"):
        assert leak not in body, leak
    assert SECRET not in response.get("Location", "")


def assert_every_page_refused(client: Client, data: dict[str, Series], status: int) -> None:
    """Every metrics page answers ``status`` (302: to the login page) and shows no data."""
    for url in pages(data):
        response = client.get(url)
        assert response.status_code == status, url
        if status == 302:
            assert response["Location"].startswith(reverse("admin:login") + "?next="), url
        assert_no_leak(response)


@pytest.mark.parametrize("kind", ["anonymous", "plain"])
def test_anonymous_and_non_staff_are_sent_to_the_login_page(
    data: dict[str, Series], make_user: UserFactory, kind: str
) -> None:
    assert_every_page_refused(client_for(make_user, kind), data, 302)


def test_staff_without_the_view_permission_is_refused(
    data: dict[str, Series], make_user: UserFactory
) -> None:
    client = client_for(make_user, "staff")
    assert_every_page_refused(client, data, 403)
    index = client.get(reverse("admin:index"))
    assert index.status_code == 200
    assert changelist_url() not in index.content.decode()
    assert_no_leak(index)


@pytest.mark.parametrize("kind", ["viewer", "superuser"])
def test_staff_with_the_view_permission_sees_every_page(
    data: dict[str, Series], make_user: UserFactory, kind: str
) -> None:
    client = client_for(make_user, kind)
    for url in pages(data):
        response = client.get(url)
        assert response.status_code == 200, url
        assert SECRET in response.content.decode(), url
    assert changelist_url() in client.get(reverse("admin:index")).content.decode()


def test_the_change_permission_alone_does_not_show_series(
    data: dict[str, Series], django_user_model: Any
) -> None:
    user = django_user_model.objects.create_user("changer", password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="change_series", content_type__app_label="metrics_app")
    )
    client = Client()
    client.force_login(user)
    assert_every_page_refused(client, data, 403)


def test_read_only_even_for_superusers(data: dict[str, Series], make_user: UserFactory) -> None:
    client = client_for(make_user, "superuser")
    home = data["shop:home"]
    assert client.get(reverse("admin:metrics_app_series_add")).status_code == 403
    assert (
        client.get(reverse("admin:metrics_app_series_delete", args=[home.pk])).status_code == 403
    )
    changed = client.post(change_url(home), {"name": "renamed", "total": "0"})
    assert changed.status_code == 403
    assert Series.objects.get(pk=home.pk).name == "shop:home"
    body = client.get(changelist_url()).content.decode()
    assert reverse("admin:metrics_app_series_add") not in body
    assert "action-checkbox" not in body  # no bulk delete
    page = client.get(change_url(home)).content.decode()
    assert 'name="_save"' not in page
    assert reverse("admin:metrics_app_series_delete", args=[home.pk]) not in page


# -- the list ------------------------------------------------------------------------------


def test_list_is_busiest_first_with_last_24h_and_sparklines(
    data: dict[str, Series], make_user: UserFactory
) -> None:
    response = client_for(make_user, "viewer").get(changelist_url())
    rows = list(response.context["cl"].result_list)
    assert [s.name for s in rows] == [SECRET, "shop:home", "ratelimit:login", "old"]
    body = response.content.decode()
    table = body[body.index('id="result_list"') :]
    cells = re.findall(r'<td class="field-last_24h">([^<]*)</td>', table)
    assert cells == ["98,765", "432", "24", "0"]
    totals = re.findall(r'<td class="field-total_count">([^<]*)</td>', table)
    assert totals == ["98,765", "864", "29", "7"]
    sparks = [
        ET.fromstring(svg)
        for svg in re.findall(r'<svg[^>]*class="bkt-sparkline".*?</svg>', table, re.S)
    ]
    assert len(sparks) == 4
    assert [s.findtext("svg:title", namespaces=NS) for s in sparks] == [
        f"{SECRET}: 98,765 in the last 24 hours",
        "shop:home: 432 in the last 24 hours",
        "ratelimit:login: 24 in the last 24 hours",
        "old: 0 in the last 24 hours",
    ]
    # The chart page's 24 hours (1,440 minutes), an hour per point.
    minutes = query.series("ratelimit:login", T0 - timedelta(hours=24), T0)
    assert len(minutes) == 1440
    line = sparks[2].find("svg:polyline", NS)
    assert line is not None
    ys = [float(p.split(",")[1]) for p in line.get("points", "").split()]
    assert len(ys) == 24
    hourly = charts.rebin([c for _, c in minutes], 24)
    assert hourly[-12:] == [2] * 12 and hourly[:12] == [0] * 12
    assert ys[-12:] == [min(ys)] * 12 and ys[:12] == [max(ys)] * 12


def test_list_search_and_ordering(data: dict[str, Series], make_user: UserFactory) -> None:
    client = client_for(make_user, "viewer")
    found = client.get(changelist_url(), {"q": "ratelimit"}).context["cl"].result_list
    assert [s.name for s in found] == ["ratelimit:login"]
    by_name = client.get(changelist_url(), {"o": "0"}).context["cl"].result_list
    assert [s.name for s in by_name] == ["old", "ratelimit:login", SECRET, "shop:home"]
    quietest = client.get(changelist_url(), {"o": "1"}).context["cl"].result_list
    assert [s.name for s in quietest] == ["old", "ratelimit:login", "shop:home", SECRET]


def test_list_queries_do_not_grow_with_the_rows(
    clock: FrozenClock, make_user: UserFactory
) -> None:
    client = client_for(make_user, "viewer")

    def queries_for(n: int) -> tuple[int, int]:
        for i in range(n):
            metrics_app.record(f"s{n}-{i}", i + 1, at=clock.t - 60 * i)
        metrics_app.flush()
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(changelist_url()).status_code == 200
        buckets = [q for q in ctx.captured_queries if "metrics_app_bucket" in q["sql"]]
        return len(ctx.captured_queries), len(buckets)

    few = queries_for(2)
    many = queries_for(30)
    assert few == many
    assert many[1] == 1  # the sparklines of the whole page in one query


# -- the chart page ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("period", "length", "step", "marks"),
    [
        ("24h", timedelta(hours=24), 60, 1440),
        ("7d", timedelta(days=7), HOUR, 168),
        ("30d", timedelta(days=30), HOUR, 720),
        ("1y", timedelta(days=365), 7 * DAY, 53),
    ],
)
def test_chart_marks_are_the_queried_buckets(
    data: dict[str, Series],
    make_user: UserFactory,
    period: str,
    length: timedelta,
    step: int,
    marks: int,
) -> None:
    name = "ratelimit:login"
    response = client_for(make_user, "viewer").get(change_url(data[name], period))
    expected = query.series(name, T0 - length, T0)
    assert len(expected) == marks
    assert int((expected[1][0] - expected[0][0]).total_seconds()) == step
    root = chart_of(response)
    assert mark_titles(root) == [charts.mark_title(t, c) for t, c in expected]
    assert sum(c for _, c in expected) > 0
    body = response.content.decode()
    assert f"in buckets of {charts.describe_step(step)}" in body
    assert f"<strong>{sum(c for _, c in expected):,}</strong>" in body


def test_period_links_are_plain_tabs(data: dict[str, Series], make_user: UserFactory) -> None:
    client = client_for(make_user, "viewer")
    home = data["shop:home"]
    body = client.get(change_url(home, "7d")).content.decode()
    links = re.findall(r'<a href="\?period=(\w+)"( class="selected" aria-current="page")?>', body)
    assert [key for key, _ in links] == ["24h", "7d", "30d", "1y"]
    assert [key for key, current in links if current] == ["7d"]
    assert (
        "<script" not in body[body.index('class="module metrics-chart"') :].split("</section>")[0]
    )
    # A filtered list's filters survive a switch of period.
    filtered = client.get(
        change_url(home), {"_changelist_filters": "q=shop", "period": "30d"}
    ).content.decode()
    assert 'href="?_changelist_filters=q%3Dshop&amp;period=1y"' in filtered


def test_unknown_period_shows_the_first(data: dict[str, Series], make_user: UserFactory) -> None:
    client = client_for(make_user, "viewer")
    home = data["shop:home"]
    default = mark_titles(chart_of(client.get(change_url(home))))
    assert mark_titles(chart_of(client.get(change_url(home, "forever")))) == default
    assert len(default) == 1440


def test_page_of_an_idle_series_says_no_data(
    data: dict[str, Series], make_user: UserFactory
) -> None:
    response = client_for(make_user, "viewer").get(change_url(data["old"]))
    root = chart_of(response)
    assert len(mark_titles(root)) == 1440
    assert "No data" in ET.tostring(root, encoding="unicode")
    year = chart_of(client_for(make_user, "superuser").get(change_url(data["old"], "1y")))
    assert any(t.endswith(": 7") for t in mark_titles(year))


def test_any_name_is_escaped(clock: FrozenClock, make_user: UserFactory) -> None:
    name = '<script>alert("x")</script>'
    metrics_app.record(name, 3, at=clock.t - 60)
    metrics_app.flush()
    client = client_for(make_user, "viewer")
    for url in (changelist_url(), change_url(Series.objects.get(name=name))):
        body = client.get(url).content.decode()
        assert "<script>alert" not in body, url
        assert "&lt;script&gt;alert(" in body, url
    chart_of(client.get(change_url(Series.objects.get(name=name))))  # still well-formed


# -- query.series_many and the helpers -------------------------------------------------------


def test_series_many_equals_series_in_one_query(data: dict[str, Series]) -> None:
    names = ["shop:home", "ratelimit:login", "old", "unknown", "shop:home"]
    start, end = T0 - timedelta(days=3), T0
    with CaptureQueriesContext(connection) as ctx:
        many = query.series_many(names, start, end, HOUR)
    assert len(ctx.captured_queries) == 1
    assert list(many) == ["shop:home", "ratelimit:login", "old", "unknown"]
    for name in many:
        assert many[name] == query.series(name, start, end, HOUR), name
    assert all(c == 0 for _, c in many["unknown"])
    assert len(many["unknown"]) == 72


def test_series_many_edge_cases(data: dict[str, Series]) -> None:
    with CaptureQueriesContext(connection) as ctx:
        assert query.series_many([], T0 - timedelta(hours=1), T0, HOUR) == {}
        assert query.series_many(["old"], T0, T0, HOUR) == {"old": []}
    assert ctx.captured_queries == []
    with pytest.raises(ValueError, match="finer than"):
        query.series_many(["old"], T0 - timedelta(days=60), T0, HOUR)
    with pytest.raises(ValueError, match="positive multiple"):
        query.series_many(["old"], T0 - timedelta(days=1), T0, 90)


def test_periods_end_on_the_next_whole_second(
    data: dict[str, Series], make_user: UserFactory, clock: FrozenClock
) -> None:
    assert DEFAULT_PERIOD.bounds(T0.timestamp() + 0.25) == (
        T0 - timedelta(hours=24) + timedelta(seconds=1),
        T0 + timedelta(seconds=1),
    )
    # A fraction of a second after T0, 24 hours still start inside the 1-minute tier.
    clock.set(T0.timestamp() + 0.25)
    response = client_for(make_user, "viewer").get(change_url(data["shop:home"]))
    assert len(mark_titles(chart_of(response))) == 1441
    assert "in buckets of 1 minute" in response.content.decode()


def test_step_of() -> None:
    pts = [(T0, 1), (T0 + timedelta(hours=1), 2)]
    assert step_of(pts, T0 + timedelta(hours=2)) == HOUR
    monday = datetime(2024, 3, 4, tzinfo=UTC)
    assert step_of([(monday, 1)], T0) == 7 * DAY  # one bucket: the tier that holds it all
    assert step_of([], T0) == 60
