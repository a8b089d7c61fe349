"""The SVG charts, parsed back: marks equal the data, labels, empty, one bucket, huge counts."""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metrics_app import charts
from metrics_app.charts import HEIGHT, TOP, WIDTH, bar_chart, sparkline

NS = {"svg": "http://www.w3.org/2000/svg"}
PLOT_HEIGHT = HEIGHT - TOP - charts.BOTTOM
#: A Sunday 13:05 UTC.
NOW = datetime(2026, 11, 22, 13, 5, tzinfo=UTC)


def points(n: int, step: int, counts: list[int] | None = None) -> list[charts.Point]:
    """``n`` buckets of ``step`` seconds ending at NOW's bucket, counts 0, 1, 2, 0, 1, 2..."""
    last = int(NOW.timestamp()) // step * step
    starts = [last - (n - 1 - i) * step for i in range(n)]
    values = counts if counts is not None else [i % 3 for i in range(n)]
    return [(datetime.fromtimestamp(t, tz=UTC), c) for t, c in zip(starts, values, strict=True)]


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def marks(root: ET.Element) -> list[ET.Element]:
    return root.findall(".//svg:g[@class='bkt-mark']", NS)


def texts(root: ET.Element, cls: str) -> list[str]:
    return [
        t.text or ""
        for t in root.iter(f"{{{NS['svg']}}}text")
        if cls in (t.get("class") or "").split()
    ]


def bar_of(mark: ET.Element) -> ET.Element | None:
    return mark.find("svg:rect[@class='bkt-bar']", NS)


def test_one_mark_per_bucket_titled_with_its_time_and_count() -> None:
    data = points(48, 1800)
    root = parse(bar_chart(data, 1800, title="a"))
    found = marks(root)
    assert len(found) == len(data)
    titles = [m.findtext("svg:title", namespaces=NS) for m in found]
    assert titles == [f"{t:%Y-%m-%d %H:%M} UTC: {c}" for t, c in data]
    assert titles[-1] == "2026-11-22 13:00 UTC: 2"


def test_bar_heights_are_proportional_and_zero_draws_no_bar() -> None:
    data = points(6, 3600, [0, 1, 5, 10, 3, 0])
    root = parse(bar_chart(data, 3600, title="a"))
    top = 10  # count_ticks(10) == [0, 2, 4, 6, 8, 10]
    bottom = TOP + PLOT_HEIGHT
    xs = []
    for mark, (_, count) in zip(marks(root), data, strict=True):
        bar = bar_of(mark)
        hit = mark.find("svg:rect[@class='bkt-hit']", NS)
        assert hit is not None and float(hit.get("height", 0)) == PLOT_HEIGHT
        xs.append(float(hit.get("x", 0)))
        if count == 0:
            assert bar is None
            continue
        assert bar is not None
        height = float(bar.get("height", 0))
        assert height == pytest.approx(count / top * PLOT_HEIGHT, abs=0.01)
        assert float(bar.get("y", 0)) + height == pytest.approx(bottom, abs=0.01)
    assert xs == sorted(xs) and len(set(xs)) == len(xs)  # left to right, oldest first
    # The buckets fill the plot: the first starts at its left edge, the last ends at its right.
    assert xs[0] == charts.LEFT
    assert xs[-1] + (WIDTH - charts.LEFT - charts.RIGHT) / 6 == pytest.approx(
        WIDTH - charts.RIGHT, abs=0.01
    )


def test_scales_with_its_container_and_takes_colours_from_the_admin_theme() -> None:
    svg = bar_chart(points(10, 60), 60, title="a")
    root = parse(svg)
    assert root.get("viewBox") == f"0 0 {WIDTH} {HEIGHT}"
    assert root.get("width") == "100%"
    assert root.get("height") is None
    style = root.findtext("svg:style", namespaces=NS) or ""
    colours = re.findall(r"(?:fill|stroke):([^;}]+)", style)
    assert colours
    assert all(c.startswith("var(--") or c == "transparent" for c in colours), colours
    assert "@media (max-width:767px)" in style  # larger labels, every other time label hidden
    # Nothing that could load anything: no scripts, no links, no external references.
    assert not re.search(r"<script|href=|url\(|@import|https?://(?!www\.w3\.org/2000/svg)", svg)


def test_count_labels_are_round_ticks() -> None:
    root = parse(bar_chart(points(5, 60, [0, 7, 42, 3, 1]), 60, title="a"))
    assert texts(root, "bkt-count") == ["0", "10", "20", "30", "40", "50"]
    root = parse(bar_chart(points(3, 60, [1200, 4200, 2]), 60, title="a"))
    assert texts(root, "bkt-count") == ["0", "1,000", "2,000", "3,000", "4,000", "5,000"]
    # From 10,000 up, one axis is all suffixes.
    root = parse(bar_chart(points(3, 60, [1200, 9000, 2]), 60, title="a"))
    assert texts(root, "bkt-count") == ["0", "2k", "4k", "6k", "8k", "10k"]


def test_time_labels_fit_the_span() -> None:
    day = parse(bar_chart(points(1440, 60), 60, title="a"))
    labels = texts(day, "bkt-time")
    assert 6 <= len(labels) <= 13
    assert "Nov 22" in labels  # midnight names its day
    assert all(re.fullmatch(r"\d\d:00|[A-Z][a-z]{2} \d{1,2}", x) for x in labels), labels
    week = texts(parse(bar_chart(points(168, 3600), 3600, title="a")), "bkt-time")
    assert week == ["Nov 16", "Nov 17", "Nov 18", "Nov 19", "Nov 20", "Nov 21", "Nov 22"]
    month = texts(parse(bar_chart(points(720, 3600), 3600, title="a")), "bkt-time")
    assert month == ["Oct 26", "Nov 2", "Nov 9", "Nov 16"]  # Mondays
    year = texts(parse(bar_chart(points(53, 7 * 86400), 7 * 86400, title="a")), "bkt-time")
    assert year == [
        "Dec", "2026", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov"
    ]  # fmt: skip


def test_every_other_time_label_can_hide_at_narrow_widths() -> None:
    root = parse(bar_chart(points(168, 3600), 3600, title="a"))
    classes = [
        t.get("class")
        for t in root.iter(f"{{{NS['svg']}}}text")
        if "bkt-time" in t.get("class", "")
    ]
    assert classes[0] == "bkt-time"
    assert classes[1] == "bkt-time bkt-alt"


def test_empty_series_has_axes_and_says_no_data() -> None:
    root = parse(bar_chart([], 60, title="nothing"))
    assert marks(root) == []
    assert texts(root, "bkt-empty") == ["No data"]
    assert texts(root, "bkt-count") == ["0", "1"]
    axes = root.findall(".//svg:line[@class='bkt-axis']", NS)
    assert len(axes) == 2


def test_only_zeros_draws_every_bucket_and_says_no_data() -> None:
    root = parse(bar_chart(points(24, 3600, [0] * 24), 3600, title="a"))
    assert len(marks(root)) == 24
    assert all(bar_of(m) is None for m in marks(root))
    assert texts(root, "bkt-empty") == ["No data"]
    assert texts(root, "bkt-time")  # the period is still on the axis


def test_one_bucket_fills_the_plot() -> None:
    data = points(1, 7 * 86400, [5])
    root = parse(bar_chart(data, 7 * 86400, title="a"))
    (mark,) = marks(root)
    assert mark.findtext("svg:title", namespaces=NS) == f"{data[0][0]:%Y-%m-%d %H:%M} UTC: 5"
    bar = bar_of(mark)
    assert bar is not None
    plot_width = WIDTH - charts.LEFT - charts.RIGHT
    assert float(bar.get("width", 0)) == pytest.approx(plot_width - 1, abs=0.01)
    assert float(bar.get("height", 0)) == pytest.approx(PLOT_HEIGHT, abs=0.01)
    assert texts(root, "bkt-empty") == []


def test_huge_counts() -> None:
    data = points(3, 60, [10**12, 1, 999_999_999_999])
    root = parse(bar_chart(data, 60, title="a"))
    assert texts(root, "bkt-count") == ["0", "200G", "400G", "600G", "800G", "1T"]
    titles = [m.findtext("svg:title", namespaces=NS) for m in marks(root)]
    assert titles[0] is not None and titles[0].endswith(": 1,000,000,000,000")
    tiny = bar_of(marks(root)[1])
    assert tiny is not None and float(tiny.get("height", 0)) == 1.0  # still visible
    assert "1,000,000,000,000" in (root.findtext("svg:desc", namespaces=NS) or "")


def test_names_are_escaped() -> None:
    name = '<script>alert("x")</script> & co'
    svg = bar_chart(points(3, 60), 60, title=name)
    root = parse(svg)
    assert root.findtext("svg:title", namespaces=NS) == name
    assert "<script" not in svg
    assert not list(root.iter("{http://www.w3.org/2000/svg}script"))
    spark = sparkline([1, 2], title=name)
    assert "<script" not in spark
    assert parse(spark).get("aria-label") == name


@pytest.mark.parametrize(
    ("value", "top", "text"),
    [
        (0, 10, "0"),
        (2500, 5000, "2,500"),
        (10_000, 10_000, "10k"),
        (1_500_000, 1_500_000, "1.5M"),
        (250_000_000_000, 10**12, "250G"),
        (10**18, 10**18, "1E"),
    ],
)
def test_format_tick(value: int, top: int, text: str) -> None:
    assert charts.format_tick(value, top) == text


@given(st.integers(min_value=0, max_value=10**18))
def test_count_ticks_are_round_and_cover_the_largest(largest: int) -> None:
    ticks = charts.count_ticks(largest)
    assert ticks[0] == 0 and ticks[-1] >= max(largest, 1)
    step = ticks[1]
    assert all(b - a == step for a, b in itertools.pairwise(ticks))
    assert re.fullmatch(r"[125]0*", str(step))
    assert len(ticks) <= 6
    assert ticks[-1] - step < max(largest, 1)  # no empty step on top


@pytest.mark.parametrize(
    ("span", "unit"),
    [(86400, "time"), (7 * 86400, "day"), (30 * 86400, "day"), (365 * 86400, "month")],
)
def test_time_ticks_are_round_and_few(span: int, unit: str) -> None:
    hi = int(NOW.timestamp())
    ticks, found = charts.time_ticks(hi - span, hi, 13)
    assert found == unit
    assert 3 <= len(ticks) <= 13
    assert all(hi - span <= t <= hi for t in ticks)
    moments = [datetime.fromtimestamp(t, tz=UTC) for t in ticks]
    assert all(m.minute == 0 and m.second == 0 for m in moments)
    if unit != "time":
        assert all(m.hour == 0 for m in moments)
    if unit == "month":
        assert all(m.day == 1 for m in moments)


def test_sparkline() -> None:
    root = parse(sparkline([0, 4, 2, 0], title="a: 6"))
    assert root.findtext("svg:title", namespaces=NS) == "a: 6"
    line = root.find("svg:polyline", NS)
    assert line is not None
    coords = [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]
    assert len(coords) == 4
    ys = [y for _, y in coords]
    assert min(ys) == ys[1] and ys[0] == ys[3] > ys[2] > ys[1]  # higher count, higher point
    flat = parse(sparkline([0, 0, 0], title="z")).find("svg:polyline", NS)
    assert flat is not None
    assert len({p.split(",")[1] for p in flat.get("points", "").split()}) == 1
    for few in ([], [3]):
        one = parse(sparkline(few, title="z")).find("svg:polyline", NS)
        assert one is not None and len(one.get("points", "").split()) == 2


def test_describe_step() -> None:
    assert [charts.describe_step(s) for s in (60, 300, 3600, 86400, 604800, 90)] == [
        "1 minute",
        "5 minutes",
        "1 hour",
        "1 day",
        "1 week",
        "90 seconds",
    ]


def test_rebin_keeps_the_sum_in_order() -> None:
    minutes = list(range(1441))
    hours = charts.rebin(minutes, 24)
    assert len(hours) == 24
    assert sum(hours) == sum(minutes)
    assert hours == sorted(hours)
    assert charts.rebin([1, 2, 3], 24) == [1, 2, 3]
    assert charts.rebin([], 24) == []
