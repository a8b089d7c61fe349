"""What a chart page shows for a request: its period, bar width, zoomed hour and points.

Shared by the admin's series page and any site page that charts a series (the demo's
``/links/<key>/``), so both read the same buckets and offer the same controls. The query
string (``?period=``, ``?zoom=``) holds every choice, so the URL of a chart is the chart.
At most :data:`MAX_BARS` bars, each a whole number of stored buckets (:func:`bar_step`): a
lone event stays visible, and a total is the same at every width.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.http import HttpRequest, HttpResponse
from django.utils.functional import Promise
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from metrics_app import charts, clock, query
from metrics_app.conf import conf
from metrics_app.retention import align

__all__ = [
    "BAR_STEPS",
    "DEFAULT_PERIOD",
    "MAX_BARS",
    "PERIODS",
    "ZOOM",
    "Chart",
    "Period",
    "bar_step",
    "chart",
    "period_from",
    "period_links",
    "prometheus",
    "read",
    "step_of",
    "zoom_hours",
]

MINUTE, HOUR, DAY, WEEK = charts.MINUTE, charts.HOUR, charts.DAY, charts.WEEK

#: The most bars a chart draws: a day fits in ten-minute bars (145), not in minutes (1,440).
MAX_BARS = 150
#: Bar widths a chart chooses from, in seconds, finest first: the round intervals of the time
#: axis's labels (so bars start where labels stand), and two and three days and four weeks,
#: for long ranges of hourly buckets.
BAR_STEPS = tuple(sorted({*charts.ROUND_INTERVALS, 2 * DAY, 3 * DAY, 4 * WEEK}))
#: What a zoomed chart shows: one hour, in the finest buckets stored for it.
ZOOM = HOUR
#: How ``?zoom=`` writes the hour (UTC), minutes included so that the URL reads as a time.
ZOOM_FORMAT = "%Y-%m-%dT%H:%M"


@dataclass(frozen=True)
class Period:
    """A choice of the chart page: ``?period=<key>`` shows ``length`` up to now.

    ``label`` names its tab, ``phrase`` ends "N events in ...".
    """

    key: str
    length: timedelta
    label: str | Promise
    phrase: str | Promise

    def bounds(self, now: float) -> tuple[datetime, datetime]:
        """``(start, end)`` of the period as of ``now``.

        The end is the first whole second at or after ``now``, so a period exactly as long as
        a tier's age starts inside that tier: 24 hours get the 1-minute buckets of the default
        retention (a fraction of a second earlier would be the 5-minute tier's).
        """
        end = datetime.fromtimestamp(math.ceil(now), tz=UTC)
        return end - self.length, end


PERIODS: tuple[Period, ...] = (
    Period("24h", timedelta(hours=24), _("24 hours"), _("the last 24 hours")),
    Period("7d", timedelta(days=7), _("7 days"), _("the last 7 days")),
    Period("30d", timedelta(days=30), _("30 days"), _("the last 30 days")),
    Period("1y", timedelta(days=365), _("1 year"), _("the last year")),
)
DEFAULT_PERIOD = PERIODS[0]


def period_from(request: HttpRequest) -> Period:
    """The period asked for in ``?period=``; the first one when missing or unknown."""
    key = request.GET.get("period")
    return next((p for p in PERIODS if p.key == key), DEFAULT_PERIOD)


def step_of(points: list[charts.Point], end: datetime) -> int:
    """The step of ``points`` as :func:`metrics_app.query.series` chose it.

    Two points or more: their spacing. One point covers the whole range, so its step is the
    finest stored precision aligned with it that reaches ``end``.
    """
    if len(points) >= 2:
        return int((points[1][0] - points[0][0]).total_seconds())
    precisions = conf.RETENTION.precisions
    if not points:
        return precisions[0]
    first = int(points[0][0].timestamp())
    return next(
        (p for p in precisions if align(first, p) == first and first + p >= end.timestamp()),
        precisions[-1],
    )


def bar_step(span: int, stored: int, most: int = MAX_BARS) -> int:
    """The bar width, in seconds, for ``span`` seconds stored in ``stored``-second buckets.

    A whole number of stored buckets that draws at most ``most`` bars (``most`` >= 2): the
    finest width of :data:`BAR_STEPS` that does, unless even that is twice as coarse as the
    finest multiple of ``stored`` that does (a precision such as 7 minutes, which few round
    widths are multiples of); then that multiple. Never more than twice as coarse as needed.
    """
    # ``span`` seconds touch at most (span - 1) // w + 2 aligned buckets of w seconds (one
    # more than they fill when they start inside one): that is <= most  <=>
    # w > (span - 1) / (most - 1). The first such multiple of ``stored``:
    fit = ((max(span, 1) - 1) // (most - 1) // stored + 1) * stored
    rounder = next((w for w in BAR_STEPS if w >= fit and w % stored == 0), None)
    return rounder if rounder is not None and rounder < 2 * fit else fit


def read(name: str, start: datetime, end: datetime, now: float) -> tuple[list[charts.Point], int]:
    """The bars of ``name`` over ``[start, end)`` and their width, as :func:`bar_step` chooses.

    The width starts from what the retention keeps for ``start`` (the oldest and coarsest
    part). Buckets coarser than that in the range (folded under a retention that has since
    changed) make that width unanswerable: then the width is chosen from the step
    :func:`metrics_app.query.series` finds for the range itself, so the page still draws.
    """
    span = int((end - start).total_seconds())
    step = bar_step(span, conf.RETENTION.expected_step(start.timestamp(), now))
    try:
        return query.series(name, start, end, step, now=now), step
    except ValueError:
        points = query.series(name, start, end, now=now)
    stored = step_of(points, end)
    step = bar_step(span, stored)
    if step == stored:
        return points, step
    try:
        return query.series(name, start, end, step, now=now), step
    except ValueError:  # a wider range met coarser rows still: the stored step is drawable
        return points, stored


def zoom_hours(start: datetime, end: datetime, step: int, now: float) -> list[int]:
    """The hours of ``[start, end)`` (Unix seconds of their starts, newest first) that a
    zoom shows in narrower bars than ``step``, the period's.

    Those stored finer than an hour: the last two days with the default retention (minutes,
    then 5 minutes); older hours are single buckets, and tiers only coarsen with age.
    """
    retention = conf.RETENTION
    lo, hi = int(start.timestamp()), math.ceil(end.timestamp())
    hours = []
    t = align(hi - 1, ZOOM)
    while t + ZOOM > lo:
        stored = retention.expected_step(t, now)
        if stored >= ZOOM or bar_step(ZOOM, stored) >= step:
            break
        hours.append(t)
        t -= ZOOM
    return hours


@dataclass(frozen=True)
class Choice:
    """A link or an option of the chart's controls."""

    label: str
    #: A URL (``?...``) for links, the ``zoom`` value for options.
    value: str
    active: bool = False


@dataclass(frozen=True)
class Chart:
    """What a chart page draws and offers; build it with :func:`chart`.

    The controls: ``periods`` (links, one active), ``zooms`` (the hours offered, as options
    of a ``GET`` form whose other fields are ``hidden``), and while zoomed, ``earlier`` and
    ``later`` (the next hours offered, or None) and ``whole`` (back to the whole period).
    """

    name: str
    period: Period
    start: datetime
    end: datetime
    step: int
    points: list[charts.Point]
    #: The hour shown, or None for the whole period.
    zoom: datetime | None
    periods: list[Choice]
    zooms: list[Choice]
    hidden: list[tuple[str, str]]
    earlier: str | None
    later: str | None
    whole: str

    @property
    def phrase(self) -> str:
        """Ends "N events in ...": the period's phrase, or the hour's."""
        if self.zoom is None:
            return str(self.period.phrase)
        # The hours are built outside the message: makemessages cannot read a \N{...} escape.
        return gettext("%(hours)s UTC, %(day)s") % {
            "hours": f"{self.start:%H:%M}\N{EN DASH}{self.end:%H:%M}",
            "day": charts.short_day(self.start),
        }

    @property
    def step_text(self) -> str:
        """The bar width in words: ``"10 minutes"``."""
        return charts.describe_step(self.step)

    @property
    def total(self) -> int:
        """The events of the bars drawn."""
        return sum(count for _, count in self.points)

    @property
    def busiest(self) -> charts.Point | None:
        """The first bar with the largest count, or None when every bar is zero."""
        peak = max(self.points, key=lambda point: point[1], default=None)
        return peak if peak is not None and peak[1] > 0 else None

    def svg(self, title: str) -> SafeString:
        """The bar chart, titled ``title`` (escaped, as every text the chart draws)."""
        return mark_safe(charts.bar_chart(self.points, self.step, title=title))


def _url(request: HttpRequest, **changes: str | None) -> str:
    """The query string of ``request`` with ``changes`` (None removes a field)."""
    params = request.GET.copy()
    for key, value in changes.items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = value
    return f"?{params.urlencode()}"


def period_links(request: HttpRequest) -> list[Choice]:
    """A link per period, the one asked for active; a period shows all of itself (no zoom).

    The query string's other fields stay (the admin's list filters, for one)."""
    period = period_from(request)
    return [
        Choice(str(p.label), _url(request, period=p.key, zoom=None), p == period) for p in PERIODS
    ]


def _zoom_value(t: int) -> str:
    return f"{datetime.fromtimestamp(t, tz=UTC):{ZOOM_FORMAT}}"


def _zoom_label(t: int) -> str:
    moment = datetime.fromtimestamp(t, tz=UTC)
    return f"{charts.short_day(moment)}, {moment:%H:%M}"


def _asked_zoom(request: HttpRequest) -> int | None:
    """The hour in ``?zoom=``, or None when missing or not a time as :data:`ZOOM_FORMAT`."""
    text = request.GET.get("zoom", "")
    try:
        moment = datetime.strptime(text, ZOOM_FORMAT).replace(tzinfo=UTC)
        return align(moment.timestamp(), ZOOM)
    except (ValueError, OverflowError, OSError):  # not a time, or one no timestamp holds
        return None


def chart(request: HttpRequest, name: str, *, now: float | None = None) -> Chart:
    """The chart of series ``name`` that ``request`` asks for (see the module docstring).

    ``now`` (default: the clock, read once) is the time the period ends at and the tiers'
    ages count from. One query reads the bars (more only in the rare case :func:`read`
    describes).
    """
    if now is None:
        now = clock.now()
    period = period_from(request)
    start, end = period.bounds(now)
    span = int((end - start).total_seconds())
    period_step = bar_step(span, conf.RETENTION.expected_step(start.timestamp(), now))
    hours = zoom_hours(start, end, period_step, now)
    asked = _asked_zoom(request)
    zoom = asked if asked in hours else None

    def hour_url(t: int) -> str | None:
        return _url(request, zoom=_zoom_value(t)) if t in hours else None

    if zoom is not None:
        start = datetime.fromtimestamp(zoom, tz=UTC)
        end = min(end, start + timedelta(seconds=ZOOM))
    points, step = read(name, start, end, now)
    form = request.GET.copy()
    form["period"] = period.key
    form.pop("zoom", None)
    return Chart(
        name=name,
        period=period,
        start=start,
        end=end,
        step=step,
        points=points,
        zoom=None if zoom is None else start,
        periods=period_links(request),
        zooms=[Choice(_zoom_label(t), _zoom_value(t), t == zoom) for t in hours],
        hidden=[(key, value) for key, values in form.lists() for value in values],
        earlier=None if zoom is None else hour_url(zoom - ZOOM),
        later=None if zoom is None else hour_url(zoom + ZOOM),
        whole=_url(request, zoom=None),
    )


#: The environment variable of prometheus-client's multiprocess mode: the directory where
#: every worker writes its counts.
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"


def prometheus(request: HttpRequest) -> HttpResponse:
    """Prometheus's text format of this process's default registry, or, under
    ``PROMETHEUS_MULTIPROC_DIR``, of every worker (prometheus-client's
    ``MultiProcessCollector``), for a project that serves no ``/metrics`` yet.

    It serves whoever the project routes to it: docs/observability.rst shows how to keep it
    internal. A missing extra or directory is a 501 or 503 that says so, not a 500.
    """
    try:
        from prometheus_client import REGISTRY, CollectorRegistry, exposition, multiprocess
    except ImportError:
        return _unavailable(
            501, "prometheus-client is not installed: pip install 'django-bucketry[prometheus]'"
        )
    registry = REGISTRY
    directory = os.environ.get(MULTIPROC_DIR)
    if directory:
        if not os.path.isdir(directory):
            return _unavailable(503, f"{MULTIPROC_DIR}={directory!r} is not a directory.")
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
    encoder, content_type = exposition.choose_encoder(request.headers.get("Accept", ""))
    response = HttpResponse(encoder(registry), content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response


def _unavailable(status: int, message: str) -> HttpResponse:
    return HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")
