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
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse
from hypothesis import given
from hypothesis import strategies as st

import metrics_app
from metrics_app import charts, query, rollup
from metrics_app.admin import DEFAULT_PERIOD, PERIODS, step_of
from metrics_app.models import Series
from metrics_app.testing import FrozenClock
from metrics_app.views import MAX_BARS, bar_step
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
        f"{change_url(secret)}?zoom=2024-03-06T11:00",
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
        # At most about 150 bars: the finest round width of whole stored buckets that fits.
        ("24h", timedelta(hours=24), 600, 144),
        ("7d", timedelta(days=7), 2 * HOUR, 84),
        ("30d", timedelta(days=30), 6 * HOUR, 120),
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
    expected = query.series(name, T0 - length, T0, step)
    assert len(expected) == marks
    root = chart_of(response)
    assert mark_titles(root) == [charts.mark_title(t, c) for t, c in expected]
    # The same events as in the stored buckets: the bars sum them, losing none.
    stored = query.series(name, T0 - length, T0)
    assert sum(c for _, c in expected) == sum(c for _, c in stored) > 0
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
    assert len(default) == 144


def test_page_of_an_idle_series_says_no_data(
    data: dict[str, Series], make_user: UserFactory
) -> None:
    response = client_for(make_user, "viewer").get(change_url(data["old"]))
    root = chart_of(response)
    assert len(mark_titles(root)) == 144
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
    assert len(mark_titles(chart_of(response))) == 145
    assert "in buckets of 10 minutes" in response.content.decode()


def test_step_of() -> None:
    pts = [(T0, 1), (T0 + timedelta(hours=1), 2)]
    assert step_of(pts, T0 + timedelta(hours=2)) == HOUR
    monday = datetime(2024, 3, 4, tzinfo=UTC)
    assert step_of([(monday, 1)], T0) == 7 * DAY  # one bucket: the tier that holds it all
    assert step_of([], T0) == 60


# -- bar widths, zoom, the object tools ---------------------------------------------------


@pytest.mark.parametrize(
    ("span", "stored", "width"),
    [
        (DAY, 60, 600),  # 145 bars at most, not 1,440
        (DAY + 1, 60, 600),
        (HOUR, 60, 60),  # a zoomed hour: by the minute
        (HOUR, 300, 300),
        (1, 60, 60),
        (7 * DAY, HOUR, 2 * HOUR),  # 168 hourly bars would be too many
        (30 * DAY, HOUR, 6 * HOUR),
        (365 * DAY, 7 * DAY, 7 * DAY),
        (365 * DAY, HOUR, 3 * DAY),
        (DAY, 420, 840),  # 7-minute buckets: no round width is near, 14 minutes
        (10 * 365 * DAY, 7 * DAY, 4 * 7 * DAY),
    ],
)
def test_bar_step(span: int, stored: int, width: int) -> None:
    assert bar_step(span, stored) == width


@given(
    span=st.integers(1, 20 * 365 * DAY),
    stored=st.sampled_from([60, 120, 300, 420, 600, 3600, 5400, DAY, 7 * DAY]),
    most=st.integers(2, 400),
)
def test_bar_step_fits_and_is_never_twice_too_coarse(span: int, stored: int, most: int) -> None:
    width = bar_step(span, stored, most)
    assert width % stored == 0
    # Bars are aligned: a range touches at most this many (one more when it starts inside).
    assert (span - 1) // width + 2 <= most
    # The finest width that fits: a multiple of stored that fits, one stored bucket less not.
    finest = ((span - 1) // (most - 1) // stored + 1) * stored
    assert (span - 1) // finest + 2 <= most
    assert finest == stored or (span - 1) // (finest - stored) + 2 > most
    assert width < 2 * finest or width == finest


def zoom_of(body: str) -> list[tuple[str, str]]:
    """The zoom control's options: (value, label), the selected one marked with a star."""
    select = body[body.index('name="zoom"') : body.index("</select>")]
    return [
        (value, ("*" if selected else "") + label)
        for value, selected, label in re.findall(
            r'<option value="([^"]*)"( selected)?>([^<]*)</option>', select
        )
    ]


def test_zoom_into_an_hour_by_the_minute(data: dict[str, Series], make_user: UserFactory) -> None:
    client = client_for(make_user, "viewer")
    name = "ratelimit:login"  # 2 events at minute 59 of each of the last 12 hours
    body = client.get(change_url(data[name])).content.decode()
    options = zoom_of(body)
    # Every hour of the day is offered, newest first (the minutes of the oldest are partly
    # folded into 5 minutes by now: still finer than the 10-minute bars).
    assert options[0] == ("", "the whole period")
    assert options[1] == ("2024-03-06T11:00", "Mar 6, 11:00")
    assert options[-1] == ("2024-03-05T12:00", "Mar 5, 12:00")
    assert len(options) == 1 + 24
    # The form keeps the period and nothing else of the page, and is not the admin's POST.
    assert '<form id="metrics-zoom" method="get" action="" hidden></form>' in body
    assert '<input type="hidden" form="metrics-zoom" name="period" value="24h">' in body

    zoomed = client.get(change_url(data[name]), {"period": "24h", "zoom": "2024-03-06T09:00"})
    hour = datetime(2024, 3, 6, 9, tzinfo=UTC)
    expected = query.series(name, hour, hour + timedelta(hours=1))
    assert len(expected) == 60 and expected[59] == (hour + timedelta(minutes=59), 2)
    assert mark_titles(chart_of(zoomed)) == [charts.mark_title(t, c) for t, c in expected]
    text = zoomed.content.decode()
    assert "<strong>2</strong> events in 09:00–10:00 UTC, Mar 6, in buckets of 1 minute" in text
    assert ("2024-03-06T09:00", "*Mar 6, 09:00") in zoom_of(text)
    # An hour before, an hour after, and back: links that keep the period.
    assert 'href="?period=24h&amp;zoom=2024-03-06T08%3A00" rel="prev"' in text
    assert 'href="?period=24h&amp;zoom=2024-03-06T10%3A00" rel="next"' in text
    assert 'href="?period=24h" class="metrics-zoom-out"' in text
    # A period tab leaves the zoom.
    assert 'href="?period=7d"' in text


def test_the_newest_hour_ends_now(
    data: dict[str, Series], make_user: UserFactory, clock: FrozenClock
) -> None:
    clock.set(T0.timestamp() + 30 * 60)  # 12:30
    zoomed = client_for(make_user, "viewer").get(
        change_url(data["shop:home"]), {"zoom": "2024-03-06T12:00"}
    )
    titles = mark_titles(chart_of(zoomed))
    assert len(titles) == 30 and titles[-1].startswith("2024-03-06 12:29 UTC")
    assert "12:00–12:30 UTC, Mar 6" in zoomed.content.decode()
    assert 'rel="next"' not in zoomed.content.decode()


@pytest.mark.parametrize(
    "zoom",
    [
        "",
        "2024-03-04T09:00",  # not in the last 24 hours
        "2024-03-06T12:00",  # the hour that starts now
        "9999-12-31T23:00",
        "0001-01-01T00:00",
        "2024-03-06 09:00",
        "2024-03-06T09:00:00",
        "1709715600",
        "<script>alert(1)</script>",
        "2024-02-30T09:00",
        "x" * 5000,
    ],
)
def test_a_zoom_that_is_not_offered_shows_the_whole_period(
    data: dict[str, Series], make_user: UserFactory, zoom: str
) -> None:
    client = client_for(make_user, "viewer")
    whole = mark_titles(chart_of(client.get(change_url(data["shop:home"]))))
    response = client.get(change_url(data["shop:home"]), {"zoom": zoom})
    assert response.status_code == 200
    assert mark_titles(chart_of(response)) == whole
    assert "<script>alert" not in response.content.decode()


def test_a_year_offers_the_hours_stored_finer_than_an_hour(
    data: dict[str, Series], make_user: UserFactory
) -> None:
    client = client_for(make_user, "viewer")
    # Minutes for a day and 5 minutes for the day before (the default retention): 48 hours.
    options = zoom_of(client.get(change_url(data["shop:home"], "1y")).content.decode())
    assert len(options) == 1 + 48
    assert options[-1][0] == "2024-03-04T12:00"
    zoomed = client.get(
        change_url(data["shop:home"]), {"period": "1y", "zoom": "2024-03-05T01:00"}
    )
    # Three events every 10 minutes, in 5-minute buckets: what the retention keeps there.
    assert [c for _, c in chart_points(zoomed)] == [3, 0] * 6
    assert "in buckets of 5 minutes" in zoomed.content.decode()


def chart_points(response: Any) -> list[tuple[str, int]]:
    titles = mark_titles(chart_of(response))
    return [(t.rsplit(": ", 1)[0], int(t.rsplit(": ", 1)[1].replace(",", ""))) for t in titles]


def test_coarser_buckets_than_the_retention_promises_still_draw(
    clock: FrozenClock, make_user: UserFactory
) -> None:
    # Folded into hours under a short retention, then read under a longer one: the day
    # holds hourly rows where the retention now promises minutes, and 10-minute bars
    # cannot split them. The page draws hours instead of failing.
    with override_settings(METRICS_RETENTION="1m:1h,1h:31d"):
        for k in range(1, 6):
            metrics_app.record("moved", k, at=clock.t - k * HOUR)
        metrics_app.flush()
        rollup.downsample()
    with override_settings(METRICS_RETENTION="1m:2d,1h:31d"):
        response = client_for(make_user, "viewer").get(
            change_url(Series.objects.get(name="moved"))
        )
    assert response.status_code == 200
    points = chart_points(response)
    assert len(points) == 24 and sum(c for _, c in points) == 15
    assert "in buckets of 1 hour" in response.content.decode()


def test_the_chart_page_reads_its_bars_in_one_query(
    data: dict[str, Series], make_user: UserFactory
) -> None:
    client = client_for(make_user, "viewer")
    for params in ({}, {"period": "7d"}, {"period": "30d"}, {"zoom": "2024-03-06T09:00"}):
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(change_url(data["shop:home"]), params)
        buckets = [q for q in ctx.captured_queries if "metrics_app_bucket" in q["sql"]]
        assert len(buckets) == 1, params
        # The stored buckets summed into at most MAX_BARS bars, none drawn per stored bucket.
        assert 50 <= len(mark_titles(chart_of(response))) <= MAX_BARS, params


def test_any_query_string_is_escaped_in_the_controls(
    data: dict[str, Series], make_user: UserFactory
) -> None:
    hostile = '"><script>alert(1)</script>'
    response = client_for(make_user, "viewer").get(
        change_url(data["shop:home"]), {hostile: hostile, "period": hostile, "zoom": hostile}
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert "<script>alert(1)" not in body
    # Kept (escaped) in the zoom form and the links, as the admin's list filters are.
    assert 'name="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in body
    assert len(mark_titles(chart_of(response))) == 144  # the default period, whole


def test_no_history_button_on_read_only_series(
    data: dict[str, Series], make_user: UserFactory
) -> None:
    home = data["shop:home"]
    body = client_for(make_user, "superuser").get(change_url(home)).content.decode()
    assert reverse("admin:metrics_app_series_history", args=[home.pk]) not in body
    assert 'class="object-tools"' not in body
    assert "historylink" not in body
