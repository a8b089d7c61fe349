"""The metrics admin in a real browser: log in, the list, a series, its periods, themes, widths.

Each test saves screenshots under ``tests/artifacts/`` (``metrics-*.png``). The data goes
through ``record``/``flush``/``downsample`` on a frozen clock that the live server shares (it
runs in a thread of this process), so the pages and the screenshots are the same every run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from unittest import mock

import pytest

import metrics_app
from metrics_app import buffer, charts, query, rollup, views
from metrics_app.admin import PERIODS
from metrics_app.models import Series
from metrics_app.testing import frozen_clock, manual_flush
from tests.admin.conftest import pixels, screenshot

if TYPE_CHECKING:
    from playwright.sync_api import Page

#: A Sunday afternoon, UTC.
NOW = datetime(2026, 11, 22, 13, 5, tzinfo=UTC)
MINUTE, HOUR, DAY = 60, 3600, 86400
HOSTILE = "api:<script>alert(1)</script>"

# What the chart's CSS resolves to: the admin's --link-fg and --link-hover-color, light/dark.
LIGHT_BAR, DARK_BAR, LIGHT_HOVER = "rgb(65, 120, 147)", "rgb(129, 212, 250)", "rgb(0, 51, 102)"


def wave(t: float) -> float:
    """Shop traffic per minute: quiet at night (UTC), busy in the afternoon, busier on
    weekdays, growing over the year and for a few weeks before Christmas."""
    moment = datetime.fromtimestamp(t, tz=UTC)
    daily = max(0.0, 6 + 5 * math.sin((t / HOUR % 24 - 9) / 24 * 2 * math.pi))
    growth = 1 + 0.8 * (t - NOW.timestamp() + 365 * DAY) / (365 * DAY)
    season = 1.6 if moment.month == 12 and moment.day < 25 else 1.0
    return daily * growth * season * (1.3 if moment.weekday() < 5 else 1.0)


@pytest.fixture(autouse=True)
def metrics(transactional_db: None) -> Iterator[None]:
    """A frozen clock, no flusher thread and no broker, and a year of data in five series.

    * ``shop:home``: a daily wave, per minute for a day, per 5 minutes for the day before,
      per hour for the year before (so every tier holds some of it after downsampling);
    * ``ratelimit:login``: bursts of 429s, one this morning and one every ten days;
    * ``bulk:import``: billions an hour, now and then (huge counts);
    * ``HOSTILE``: a name that must be shown, never run;
    * ``idle``: one count 200 days ago.
    """
    buffer.reset()
    with (
        manual_flush(),
        mock.patch.object(query, "DOWNSAMPLE_ON_READ", False),
        frozen_clock(NOW) as clock,
    ):
        now = int(clock.t)
        for t in range(now - DAY, now, MINUTE):
            metrics_app.record("shop:home", round(wave(t)), at=t)
        for t in range(now - 2 * DAY, now - DAY, 5 * MINUTE):
            metrics_app.record("shop:home", round(5 * wave(t)), at=t)
        for t in range(now - 365 * DAY, now - 2 * DAY, HOUR):
            metrics_app.record("shop:home", round(60 * wave(t)), at=t)
        morning = now - (now % DAY) + 9 * HOUR
        for k in range(40):
            metrics_app.record("ratelimit:login", 40 - abs(20 - k), at=morning + k * MINUTE)
        for days in range(10, 365, 10):
            metrics_app.record("ratelimit:login", 30 + days % 70, at=now - days * DAY)
        for days in (0, 3, 45, 120):
            metrics_app.record("bulk:import", 3_000_000_000 + days, at=now - days * DAY - HOUR)
        metrics_app.record(HOSTILE, 3, at=now - 2 * HOUR)
        metrics_app.record("idle", 1, at=now - 200 * DAY)
        metrics_app.flush()
        rollup.downsample()
        yield
    buffer.reset()


@pytest.fixture
def watched(staff_page: Page, live_server: Any) -> Iterator[Page]:
    """``staff_page``, failing the test on any request off the live server or any dialog."""
    offsite: list[str] = []
    dialogs: list[str] = []

    def route(request_route: Any) -> None:
        url = request_route.request.url
        if url.startswith(live_server.url) or url.startswith("data:"):
            request_route.continue_()
        else:
            offsite.append(url)
            request_route.abort()

    staff_page.route("**/*", route)
    staff_page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    yield staff_page
    assert offsite == [], "the admin pages must not reach the network"
    assert dialogs == [], "a series name ran as script"


def open_series(page: Page, live_server: Any, name: str, period: str | None = None) -> None:
    pk = Series.objects.get(name=name).pk
    suffix = "" if period is None else f"?period={period}"
    page.goto(f"{live_server.url}/admin/metrics_app/series/{pk}/change/{suffix}")


def mark_titles(page: Page) -> list[str]:
    return page.eval_on_selector_all(
        "svg.bkt-chart g.bkt-mark > title", "els => els.map(e => e.textContent)"
    )


def expected_titles(name: str, length: timedelta) -> list[str]:
    points, _ = views.read(name, NOW - length, NOW, NOW.timestamp())
    return [charts.mark_title(t, c) for t, c in points]


def layout(page: Page) -> dict[str, Any]:
    """Where the chart and its visible labels are drawn, in CSS pixels."""
    return page.evaluate(
        """() => {
        const svg = document.querySelector('svg.bkt-chart');
        const box = svg.getBoundingClientRect();
        const frame = svg.parentElement.getBoundingClientRect();
        const visible = sel => [...svg.querySelectorAll(sel)]
            .filter(e => getComputedStyle(e).display !== 'none')
            .map(e => { const r = e.getBoundingClientRect();
                        return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,
                                height: r.height, text: e.textContent}; });
        return {
            chartLeft: box.left, chartRight: box.right, frameRight: frame.right,
            chartTop: box.top, chartBottom: box.bottom,
            innerWidth: window.innerWidth,
            pageWidth: document.documentElement.scrollWidth,
            times: visible('text.bkt-time').sort((a, b) => a.left - b.left),
            counts: visible('text.bkt-count'),
        };
    }"""
    )


def assert_labels_readable(geometry: dict[str, Any], min_px: float) -> None:
    times = geometry["times"]
    assert len(times) >= 3, times
    assert geometry["counts"], "no count labels"
    for label in times + geometry["counts"]:
        assert label["height"] >= min_px, label
        # Inside the drawing: nothing clipped at its edges.
        assert geometry["chartLeft"] <= label["left"], label
        assert label["right"] <= geometry["chartRight"], label
        assert geometry["chartTop"] <= label["top"], label
        assert label["bottom"] <= geometry["chartBottom"], label
    for a, b in itertools.pairwise(times):
        assert a["right"] + 2 <= b["left"], f"labels overlap: {a} and {b}"


def colour(page: Page, selector: str, prop: str) -> str:
    return page.eval_on_selector(selector, f"e => getComputedStyle(e).{prop}")


def test_log_in_and_see_the_series_list(watched: Page, live_server: Any) -> None:
    page = watched
    page.get_by_role("link", name="Series").first.click()
    page.wait_for_url("**/admin/metrics_app/series/")
    rows = page.locator("#result_list tbody tr")
    names = [rows.nth(i).locator("th").inner_text() for i in range(rows.count())]
    assert names == ["bulk:import", "shop:home", "ratelimit:login", HOSTILE, "idle"]
    sparks = page.locator("#result_list svg.bkt-sparkline")
    assert sparks.count() == 5
    first = sparks.first
    assert first.is_visible()
    assert first.locator("title").text_content() == page.locator(
        "#result_list tbody tr:first-child svg.bkt-sparkline"
    ).get_attribute("aria-label")
    last_24h = page.locator("#result_list td.field-last_24h")
    assert last_24h.nth(2).inner_text() == "1,200"  # the morning's burst of 429s
    screenshot(page, "metrics-series-list")
    page.fill("#searchbar", "ratelimit")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=ratelimit")
    assert page.locator("#result_list tbody tr").count() == 1


def test_open_a_series_and_switch_periods(watched: Page, live_server: Any) -> None:
    page = watched
    page.goto(f"{live_server.url}/admin/metrics_app/series/")
    page.get_by_role("link", name="shop:home").click()
    page.wait_for_url("**/change/")
    assert page.locator(".breadcrumbs").inner_text().split("›")[-1].strip() == "shop:home"
    assert page.locator("svg.bkt-chart").is_visible()
    for period in PERIODS:
        if period.key != "24h":
            page.get_by_role("link", name=str(period.label), exact=True).click()
            page.wait_for_url(f"**period={period.key}")
        current = page.locator(".metrics-periods a[aria-current=page]")
        assert current.inner_text() == str(period.label)
        titles = mark_titles(page)
        assert titles == expected_titles("shop:home", period.length)
        assert len(titles) <= views.MAX_BARS
        assert page.locator("svg.bkt-chart rect.bkt-bar").count() > len(titles) // 2
        assert_labels_readable(layout(page), min_px=10)
        screenshot(page, f"metrics-chart-{period.key}")


def test_hovering_a_bar_shows_its_bucket(watched: Page, live_server: Any) -> None:
    page = watched
    open_series(page, live_server, "ratelimit:login")
    points = query.series("ratelimit:login", NOW - timedelta(hours=24), NOW, 600)
    peak = max(range(len(points)), key=lambda i: points[i][1])
    assert points[peak][1] == sum(40 - abs(20 - k) for k in range(20, 30)) == 355
    # Hover the middle of the tallest bar, then ask the page what is under the pointer.
    bar = page.locator("svg.bkt-chart g.bkt-mark").nth(peak).locator("rect.bkt-bar")
    box = bar.bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    under = page.evaluate(
        "([x, y]) => document.elementFromPoint(x, y).closest('g.bkt-mark')"
        ".querySelector('title').textContent",
        [x, y],
    )
    assert (
        under == charts.mark_title(*points[peak]) == f"{points[peak][0]:%Y-%m-%d %H:%M} UTC: 355"
    )
    hovered = page.locator("svg.bkt-chart g.bkt-mark:hover rect.bkt-bar")
    assert hovered.count() == 1
    assert hovered.evaluate("e => getComputedStyle(e).fill") == LIGHT_HOVER
    screenshot(page, "metrics-chart-hover", full_page=False)


def test_light_and_dark_themes(watched: Page, live_server: Any) -> None:
    page = watched
    open_series(page, live_server, "shop:home", "7d")
    assert colour(page, "rect.bkt-bar", "fill") == LIGHT_BAR
    assert colour(page, "text.bkt-count", "fill") == "rgb(102, 102, 102)"
    page.emulate_media(color_scheme="dark")
    page.reload()
    assert colour(page, "body", "backgroundColor") == "rgb(18, 18, 18)"
    assert colour(page, "rect.bkt-bar", "fill") == DARK_BAR
    assert colour(page, "text.bkt-count", "fill") == "rgb(208, 208, 208)"
    assert colour(page, "line.bkt-grid", "stroke") == "rgb(39, 39, 39)"
    screenshot(page, "metrics-chart-dark")
    page.goto(f"{live_server.url}/admin/metrics_app/series/")
    assert colour(page, "svg.bkt-sparkline polyline", "stroke") == DARK_BAR
    screenshot(page, "metrics-series-list-dark")


def test_narrow_viewport(watched: Page, live_server: Any) -> None:
    page = watched
    page.set_viewport_size({"width": 420, "height": 900})
    for period in ("24h", "1y"):
        open_series(page, live_server, "shop:home", period)
        geometry = layout(page)
        assert geometry["chartLeft"] >= 0
        assert geometry["chartRight"] <= geometry["frameRight"] + 0.5
        assert geometry["chartRight"] <= geometry["innerWidth"]
        assert geometry["pageWidth"] <= geometry["innerWidth"], "the page scrolls sideways"
        assert_labels_readable(geometry, min_px=9)
        screenshot(page, f"metrics-chart-narrow-{period}")
    page.goto(f"{live_server.url}/admin/metrics_app/series/")
    # The admin scrolls a wide result table inside its box; the page itself must not.
    assert page.evaluate("document.documentElement.scrollWidth") <= 420
    assert page.locator("#result_list svg.bkt-sparkline").count() == 5
    screenshot(page, "metrics-series-list-narrow")


def test_huge_counts_and_hostile_names(watched: Page, live_server: Any) -> None:
    page = watched
    open_series(page, live_server, "bulk:import", "1y")
    counts = page.eval_on_selector_all("text.bkt-count", "els => els.map(e => e.textContent)")
    assert counts[-1].endswith("G"), counts
    assert any(t.endswith(": 3,000,000,045") for t in mark_titles(page))
    screenshot(page, "metrics-chart-huge")
    open_series(page, live_server, HOSTILE)
    assert HOSTILE in page.locator(".breadcrumbs").inner_text()
    assert page.locator("svg.bkt-chart > title").text_content().startswith(HOSTILE)


def test_zoom_into_an_hour_and_back(watched: Page, live_server: Any) -> None:
    page = watched
    open_series(page, live_server, "ratelimit:login")
    assert len(mark_titles(page)) == 145  # ten-minute bars
    screenshot(page, "metrics-chart-zoom-control", full_page=False)
    # The morning's burst of 429s, 09:00 to 09:40: pick 09:00 and press Show.
    page.select_option("#metrics-zoom-hour", "2026-11-22T09:00")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**zoom=2026-11-22T09%3A00")
    assert "period=24h" in page.url  # a GET of the zoom form, not the admin's POST
    titles = mark_titles(page)
    hour = datetime(2026, 11, 22, 9, tzinfo=UTC)
    expected = query.series("ratelimit:login", hour, hour + timedelta(hours=1))
    assert titles == [charts.mark_title(t, c) for t, c in expected]
    assert len(titles) == 60  # by the minute
    summary = page.locator(".metrics-summary").inner_text()
    assert "1,200 events in 09:00\N{EN DASH}10:00 UTC, Nov 22, in buckets of 1 minute" in summary
    assert page.locator("#metrics-zoom-hour").input_value() == "2026-11-22T09:00"
    assert page.locator("svg.bkt-chart rect.bkt-bar").count() == 40
    screenshot(page, "metrics-chart-zoomed")
    page.get_by_role("link", name="← hour before").click()
    page.wait_for_url("**zoom=2026-11-22T08%3A00")
    assert page.locator("svg.bkt-chart rect.bkt-bar").count() == 0
    page.get_by_role("link", name="back to 24 hours").click()
    page.wait_for_url("**?period=24h")
    assert len(mark_titles(page)) == 145


def drawn(page: Page, index: int, colour: tuple[int, int, int]) -> tuple[int, int]:
    """How many rows and columns of the bar slot ``index`` show ``colour`` on screen."""
    slot = page.locator("svg.bkt-chart g.bkt-mark").nth(index).locator("rect.bkt-hit")
    box = slot.bounding_box()
    assert box is not None
    shot = page.screenshot(clip=box)
    rows = pixels(shot)
    hits = [
        (y, x)
        for y, row in enumerate(rows)
        for x, pixel in enumerate(row)
        if all(abs(a - b) <= 24 for a, b in zip(pixel, colour, strict=True))
    ]
    return len({y for y, _ in hits}), len({x for _, x in hits})


@pytest.mark.parametrize("width", [1280, 420])
def test_a_lone_event_stays_visible(watched: Page, live_server: Any, width: int) -> None:
    page = watched
    page.set_viewport_size({"width": width, "height": 900})
    now = int(NOW.timestamp())
    # One event, five hours before a bucket of 5,000: a bar of 1/5000 of the chart's height.
    metrics_app.record("lone", 1, at=now - 5 * HOUR)
    metrics_app.record("lone", 5000, at=now - HOUR)
    metrics_app.flush()
    open_series(page, live_server, "lone")
    titles = mark_titles(page)
    assert len(titles) == 145
    lone = next(i for i, t in enumerate(titles) if t.endswith(": 1"))
    rgb = tuple(int(c) for c in LIGHT_BAR[4:-1].split(", "))
    tall, wide = drawn(page, lone, rgb)  # type: ignore[arg-type]
    screenshot(page, f"metrics-chart-lone-event-{width}", full_page=False)
    # At least two whole pixels each way, in the bar's own colour, at any width.
    assert tall >= 2 and wide >= 2, (tall, wide)


def test_no_history_button(watched: Page, live_server: Any) -> None:
    page = watched
    open_series(page, live_server, "shop:home")
    assert page.get_by_role("link", name="History").count() == 0
    assert page.locator(".object-tools").count() == 0
    screenshot(page, "metrics-series-no-history", full_page=False)
