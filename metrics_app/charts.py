"""Server-rendered SVG charts for the admin: a bar chart with axes, and a sparkline.

Pure: ``(bucket start, count)`` points in, an SVG string out, to inline in a page; nothing
fetched from the network. It scales to its container, its colours are the admin's CSS
variables (so its light and dark themes apply), each bucket carries a ``<title>`` tooltip,
and every outside text is escaped. Times are UTC, like the buckets.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from html import escape

from django.utils.dateformat import format as date_format
from django.utils.translation import gettext, ngettext, ngettext_lazy, pgettext

from metrics_app.retention import align

__all__ = [
    "Point",
    "bar_chart",
    "count_ticks",
    "describe_step",
    "format_count",
    "format_tick",
    "mark_title",
    "rebin",
    "short_day",
    "sparkline",
    "time_ticks",
]

Point = tuple[datetime, int]

#: Size of the bar chart's drawing, in user units (it scales to its container).
WIDTH, HEIGHT = 880, 300
#: Room for the count labels (left), the time labels (bottom) and half the last time label
#: (right), sized for the larger labels of narrow screens (see ``_STYLE``).
LEFT, RIGHT, TOP, BOTTOM = 78, 44, 20, 42
#: Fewest user units between two time labels at full size.
LABEL_SPACING = 60

MINUTE, HOUR, DAY, WEEK = 60, 3600, 86400, 7 * 86400

#: Time-label intervals in seconds, finest first; weeks start on Mondays.
ROUND_INTERVALS = (
    MINUTE,
    5 * MINUTE,
    10 * MINUTE,
    15 * MINUTE,
    30 * MINUTE,
    HOUR,
    2 * HOUR,
    3 * HOUR,
    6 * HOUR,
    12 * HOUR,
    DAY,
    WEEK,
    2 * WEEK,
)
#: Then intervals in months, then in years.
_MONTH_INTERVALS = (1, 2, 3, 6)
_YEAR_INTERVALS = (1, 2, 5, 10, 20, 50, 100)

_SUFFIXES = ((10**18, "E"), (10**15, "P"), (10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "k"))

# Scoped to the chart's class: an inline <style> applies to the whole HTML document.
_STYLE = """
.bkt-chart{display:block;width:100%;height:auto;max-width:100%;
font-family:var(--font-family-primary,sans-serif);font-size:12px}
.bkt-chart .bkt-grid{stroke:var(--hairline-color,#e8e8e8);stroke-width:1}
.bkt-chart .bkt-axis{stroke:var(--body-quiet-color,#666);stroke-width:1}
.bkt-chart text{fill:var(--body-quiet-color,#666)}
.bkt-chart .bkt-bar{fill:var(--link-fg,#417893)}
.bkt-chart .bkt-hit{fill:transparent}
.bkt-chart .bkt-mark:hover .bkt-hit{fill:var(--hairline-color,#e8e8e8)}
.bkt-chart .bkt-mark:hover .bkt-bar{fill:var(--link-hover-color,#036)}
.bkt-chart .bkt-empty{fill:var(--body-quiet-color,#666);font-size:16px}
@media (max-width:767px){.bkt-chart text{font-size:26px}.bkt-chart .bkt-empty{font-size:30px}
.bkt-chart .bkt-alt{display:none}}
"""


def _n(value: float) -> str:
    """A coordinate with at most two decimals and no trailing zeros."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def format_count(value: int) -> str:
    """A count in full, with thousands separators: ``1,000,000``."""
    return f"{value:,}"


def format_tick(value: int, top: int) -> str:
    """A count-axis label: in full below 10,000 (``2,500``), else with a suffix (``1.5M``).

    ``top`` is the axis's largest tick, so that all the labels of one axis share a style.
    """
    if top < 10_000:
        return format_count(value)
    for unit, suffix in _SUFFIXES:
        if value >= unit:
            amount = (Decimal(value) / unit).quantize(Decimal("0.01")).normalize()
            return f"{amount:f}{suffix}"
    return str(value)


def count_ticks(largest: int, target: int = 5) -> list[int]:
    """Round ticks from 0 to at least ``largest``: steps of 1, 2 or 5 times a power of ten.

    Integer arithmetic throughout, so ``10**18`` is as exact as ``42``. At most ``target``
    steps; an axis for nothing (``largest <= 0``) is ``[0, 1]``.
    """
    if largest <= 0:
        return [0, 1]
    magnitude = 1
    while True:
        for mantissa in (1, 2, 5):
            step = mantissa * magnitude
            if step * target >= largest:
                top = -(-largest // step) * step
                return list(range(0, top + 1, step))
        magnitude *= 10


def _month_start(year: int, month: int) -> datetime:
    year, month = year + (month - 1) // 12, (month - 1) % 12 + 1
    return datetime(year, month, 1, tzinfo=UTC)


def _ticks_every(lo: int, hi: int, seconds: int) -> list[int]:
    first = align(lo, seconds)
    if first < lo:
        first += seconds
    return list(range(first, hi + 1, seconds))


def _ticks_every_months(lo: int, hi: int, months: int) -> list[int]:
    start = datetime.fromtimestamp(lo, tz=UTC)
    index = start.year * 12 + start.month - 1
    index += -index % months  # first month boundary that is a multiple of ``months``
    out: list[int] = []
    while True:
        t = int(_month_start(index // 12, index % 12 + 1).timestamp())
        if t > hi:
            return out
        if t >= lo:
            out.append(t)
        index += months


def time_ticks(lo: int, hi: int, most: int) -> tuple[list[int], str]:
    """At most ``most`` round instants in ``[lo, hi]`` (Unix seconds) and their unit.

    The finest interval that fits: minutes or hours for a day, days or Monday-weeks for a
    week or a month, months for a year, years beyond. The unit is ``"time"``, ``"day"``,
    ``"month"`` or ``"year"``; :func:`_time_label` formats each kind.
    """
    most = max(most, 2)
    for seconds in ROUND_INTERVALS:
        ticks = _ticks_every(lo, hi, seconds)
        if len(ticks) <= most:
            return ticks, "time" if seconds < DAY else "day"
    for months in _MONTH_INTERVALS:
        ticks = _ticks_every_months(lo, hi, months)
        if len(ticks) <= most:
            return ticks, "month"
    for years in _YEAR_INTERVALS:
        ticks = _ticks_every_months(lo, hi, 12 * years)
        if len(ticks) <= most:
            return ticks, "year"
    return [lo, hi], "day"  # pragma: no cover  (a span of more than 100 * most years)


def _time_label(t: int, unit: str) -> str:
    moment = datetime.fromtimestamp(t, tz=UTC)
    if unit == "time" and (moment.hour or moment.minute):
        return f"{moment:%H:%M}"
    if unit in {"time", "day"}:
        return short_day(moment)  # a midnight among hours names its day
    if unit == "month" and moment.month != 1:
        return date_format(moment, "M")
    return str(moment.year)  # January names its year


def short_day(moment: datetime) -> str:
    """A day of the month as the time axis and the zoom control write it: ``"Nov 22"``.

    The format is the language's (``"22 nov."`` in French); Django's catalogs name the month.
    """
    # Translators: a date format for Django's date filter, not words: j is the day of the
    # month, M the month in three letters ("Nov"), b the same in lowercase ("nov"), N the
    # month's usual abbreviation ("nov.", "mars"). "M j" is "Nov 22"; "j N" is "22 nov.".
    return date_format(moment, pgettext("chart day format", "M j"))


def mark_title(start: datetime, count: int) -> str:
    """A bucket's tooltip: ``"2026-11-22 13:05 UTC: 42"``."""
    return f"{start.astimezone(UTC):%Y-%m-%d %H:%M} UTC: {format_count(count)}"


#: The units :func:`describe_step` writes a step in, largest first. The messages are literal
#: (makemessages reads them) and lazy (each page gets its reader's language); ``"n"`` names
#: the number that picks the plural.
_STEP_UNITS = (
    (WEEK, ngettext_lazy("%(n)d week", "%(n)d weeks", "n")),
    (DAY, ngettext_lazy("%(n)d day", "%(n)d days", "n")),
    (HOUR, ngettext_lazy("%(n)d hour", "%(n)d hours", "n")),
    (MINUTE, ngettext_lazy("%(n)d minute", "%(n)d minutes", "n")),
    (1, ngettext_lazy("%(n)d second", "%(n)d seconds", "n")),
)


def describe_step(seconds: int) -> str:
    """``"1 minute"``, ``"5 minutes"``, ``"1 hour"``, ``"1 week"``... for a bucket step."""
    size, message = next(unit for unit in _STEP_UNITS if seconds % unit[0] == 0)  # 1 divides all
    return str(message % {"n": seconds // size})


def _attr(value: str) -> str:
    return escape(value, quote=True)


#: The plot area of the bar chart, inside the room for the labels.
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
#: The y of the time axis.
BASELINE = TOP + PLOT_H


def bar_chart(points: Sequence[Point], step: int, *, title: str) -> str:
    """An SVG bar chart of ``points`` (``(bucket start, count)``, oldest first, ``step`` apart).

    One mark (``<g class="bkt-mark">``) per point, zero counts included, each with a
    ``<title>`` from :func:`mark_title`; the time axis spans the first bucket's start to the
    last bucket's end. Without points, or with only zeros, the axes carry a "No data" label.
    ``title`` (escaped) names the chart for screen readers.
    """
    largest = max((count for _, count in points), default=0)
    ticks = count_ticks(largest)
    parts = [_head(points, step, title, largest), *_count_axis(ticks)]
    if points:
        lo = int(points[0][0].timestamp())
        hi = int(points[-1][0].timestamp()) + step
        # Bars, drawn before the time axis so the axis line stays on top.
        parts += _marks(points, ticks[-1], lo, hi)
        parts += _time_axis(lo, hi)
    parts.append(
        f'<line class="bkt-axis" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{BASELINE}" '
        f'y2="{BASELINE}"/>'
        f'<line class="bkt-axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{BASELINE}"/>'
    )
    if largest <= 0:
        # Outside the f-string: makemessages finds no message inside one.
        empty = escape(gettext("No data"))
        parts.append(
            f'<text class="bkt-empty" x="{_n(LEFT + PLOT_W / 2)}" y="{_n(TOP + PLOT_H / 2)}" '
            f'text-anchor="middle" dominant-baseline="middle">{empty}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _head(points: Sequence[Point], step: int, title: str, largest: int) -> str:
    """The ``<svg>`` opening, its title and description, and the style."""
    description = ngettext(
        "%(n)d bucket of %(step)s, %(total)s in all, at most %(peak)s in one.",
        "%(n)d buckets of %(step)s, %(total)s in all, at most %(peak)s in one.",
        len(points),
    ) % {
        "n": len(points),
        "step": describe_step(step),
        "total": format_count(sum(count for _, count in points)),
        "peak": format_count(largest),
    }
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="bkt-chart" role="img" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" preserveAspectRatio="xMidYMid meet">'
        f"<title>{escape(title)}</title><desc>{escape(description)}</desc>"
        f"<style>{_STYLE}</style>"
    )


def _count_axis(ticks: list[int]) -> list[str]:
    """A grid line and a label per tick."""
    parts = []
    for value in ticks:
        y = _n(BASELINE - value / ticks[-1] * PLOT_H)
        parts.append(
            f'<line class="bkt-grid" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y}" y2="{y}"/>'
            f'<text class="bkt-count" x="{LEFT - 8}" y="{y}" text-anchor="end" '
            f'dominant-baseline="middle">{escape(format_tick(value, ticks[-1]))}</text>'
        )
    return parts


def _x(t: int, lo: int, hi: int) -> float:
    """Where the instant ``t`` falls on a time axis from ``lo`` to ``hi``."""
    return LEFT + (t - lo) / (hi - lo) * PLOT_W


def _marks(points: Sequence[Point], top: int, lo: int, hi: int) -> list[str]:
    """A mark per point: a full-height hit area (a zero is hoverable too), and a bar when
    the count is not zero."""
    slot = PLOT_W / len(points)
    gap = 1.0 if slot >= 4 else 0.0
    parts = ['<g class="bkt-marks">']
    for start, count in points:
        x = _x(int(start.timestamp()), lo, hi)
        mark = [
            f'<g class="bkt-mark"><title>{escape(mark_title(start, count))}</title>',
            f'<rect class="bkt-hit" x="{_n(x)}" y="{TOP}" width="{_n(slot)}" height="{PLOT_H}"/>',
        ]
        if count > 0:
            # At least one unit high, so a 1 beside 10**12 is still seen.
            h = max(count / top * PLOT_H, 1.0)
            mark.append(
                f'<rect class="bkt-bar" x="{_n(x + gap / 2)}" y="{_n(BASELINE - h)}" '
                f'width="{_n(max(slot - gap, 0.1))}" height="{_n(h)}"/>'
            )
        mark.append("</g>")
        parts.append("".join(mark))
    parts.append("</g>")
    return parts


def _time_axis(lo: int, hi: int) -> list[str]:
    """A short tick and a label per round instant; odd labels hide when narrow."""
    instants, unit = time_ticks(lo, hi, PLOT_W // LABEL_SPACING)
    # A label at the very end would stick out of the drawing once labels grow.
    instants = [t for t in instants if _x(t, lo, hi) <= LEFT + PLOT_W - 10]
    parts = []
    for i, t in enumerate(instants):
        tx = _n(_x(t, lo, hi))
        alt = " bkt-alt" if i % 2 else ""
        parts.append(
            f'<line class="bkt-axis" x1="{tx}" x2="{tx}" y1="{BASELINE}" y2="{BASELINE + 5}"/>'
            f'<text class="bkt-time{alt}" x="{tx}" y="{BASELINE + 8}" text-anchor="middle" '
            f'dominant-baseline="hanging">{escape(_time_label(t, unit))}</text>'
        )
    return parts


def rebin(counts: Sequence[int], n: int) -> list[int]:
    """``counts`` summed into ``n`` consecutive groups of (nearly) equal length.

    For a sparkline of evenly spaced buckets: 1,440 minutes become 24 hours. Fewer than
    ``n`` counts are returned as they are.
    """
    if len(counts) <= n:
        return list(counts)
    return [sum(counts[i * len(counts) // n : (i + 1) * len(counts) // n]) for i in range(n)]


def sparkline(counts: Sequence[int], *, title: str, width: int = 100, height: int = 24) -> str:
    """A small inline SVG line of ``counts`` (oldest first), no axes, titled ``title``.

    The line is scaled to the largest count (a flat line along the bottom when all are zero,
    or when there are none); the area under it is shaded.
    """
    peak = max(counts, default=0)
    n = len(counts)
    inner_w, inner_h = width - 2, height - 3
    coords = []
    for i, count in enumerate(counts if n > 1 else [*counts, *counts] or [0, 0]):
        x = 1 + (i / (max(n, 2) - 1)) * inner_w
        y = height - 1.5 - (count / peak * inner_h if peak > 0 else 0)
        coords.append(f"{_n(x)},{_n(y)}")
    line = " ".join(coords)
    base = _n(height - 1.5)
    area = f"M1,{base} L{line.replace(' ', ' L')} L{_n(1 + inner_w)},{base} Z"
    label = _attr(title)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="bkt-sparkline" role="img" '
        f'aria-label="{label}" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" style="display:block;overflow:visible">'
        f"<title>{escape(title)}</title>"
        f'<path d="{area}" style="fill:var(--link-fg,#417893);fill-opacity:.15;stroke:none"/>'
        f'<polyline points="{line}" style="fill:none;stroke:var(--link-fg,#417893);'
        f'stroke-width:1.5;stroke-linejoin:round"/>'
        "</svg>"
    )
