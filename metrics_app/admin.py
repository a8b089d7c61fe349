"""The metrics admin: a read-only list of series with sparklines, and a chart page per series.

Every page needs a staff account with ``metrics_app.view_series`` (a superuser has it);
nobody can add, change or delete a series here, since the data comes from
:func:`metrics_app.record`. Charts are server-rendered SVG (:mod:`metrics_app.charts`); the
period of the chart page is a plain link (``?period=24h|7d|30d|1y``), no JavaScript.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest, HttpResponse
from django.utils import formats
from django.utils.functional import Promise
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from metrics_app import charts, clock, query
from metrics_app.conf import conf
from metrics_app.models import Series
from metrics_app.retention import align

#: Where each list row's sparkline and "last 24 h" count are kept (set per page of results).
RECENT_ATTR = "_metrics_recent"

HOUR, DAY = 3600, 86400

if TYPE_CHECKING:
    SeriesAdminBase = admin.ModelAdmin[Series]
else:  # ModelAdmin is generic only in django-stubs; no runtime monkeypatching needed.
    SeriesAdminBase = admin.ModelAdmin


@dataclass(frozen=True)
class Period:
    """A choice of the chart page: ``?period=<key>`` shows ``length`` up to now."""

    key: str
    length: timedelta
    label: str | Promise


PERIODS: tuple[Period, ...] = (
    Period("24h", timedelta(hours=24), _("24 hours")),
    Period("7d", timedelta(days=7), _("7 days")),
    Period("30d", timedelta(days=30), _("30 days")),
    Period("1y", timedelta(days=365), _("1 year")),
)
DEFAULT_PERIOD = PERIODS[0]


def period_from(request: HttpRequest) -> Period:
    """The period asked for in ``?period=``; the first one when missing or unknown."""
    key = request.GET.get("period")
    return next((p for p in PERIODS if p.key == key), DEFAULT_PERIOD)


def recent_window(now: float) -> tuple[datetime, datetime, int]:
    """``(start, end, step)`` of the list's "last 24 h": a day of hourly buckets up to now.

    Hourly unless the retention stores the last day coarser, or in steps that do not divide
    an hour (then the next multiple of that step). The first bucket is whole, so the sum is
    that of the current hour and the 23 before it.
    """
    stored = conf.RETENTION.expected_step(now - DAY, now)
    step = -(-HOUR // stored) * stored
    buckets = -(-DAY // step)
    last = align(now - 1, step)
    start = last - (buckets - 1) * step
    return datetime.fromtimestamp(start, tz=UTC), datetime.fromtimestamp(now, tz=UTC), step


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


class SeriesChangeList(ChangeList):
    """Reads the sparklines of a whole page of series in one query, after the page's own."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        start, end, step = recent_window(clock.now())
        recent = query.series_many([s.name for s in rows], start, end, step)
        for row in rows:
            setattr(row, RECENT_ATTR, (recent[row.name], step))


@admin.register(Series)
class SeriesAdmin(SeriesAdminBase):
    """Series, busiest first, each with its last day; a chart page per series."""

    list_display = ["name", "total_count", "last_24h", "activity"]
    search_fields = ["name"]
    ordering = ["-total", "name"]
    list_per_page = 50
    fields = ["name", "total", "first_seen", "last_seen"]
    readonly_fields = ["name", "total", "first_seen", "last_seen"]

    # Read-only for everyone, superusers included: series are written by record() only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Series | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Series | None = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Series | None = None) -> bool:
        # The view permission itself, not "view or change" as Django's default allows.
        user = request.user
        return bool(user.is_active and user.is_staff and user.has_perm("metrics_app.view_series"))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return SeriesChangeList

    @admin.display(description=_("total"), ordering="total")
    def total_count(self, obj: Series) -> str:
        return formats.number_format(obj.total, force_grouping=True)

    @admin.display(description=_("last 24 h"))
    def last_24h(self, obj: Series) -> str:
        points, _step = getattr(obj, RECENT_ATTR, ([], HOUR))
        return formats.number_format(sum(c for _, c in points), force_grouping=True)

    @admin.display(description=_("activity, last 24 h"))
    def activity(self, obj: Series) -> SafeString:
        points, step = getattr(obj, RECENT_ATTR, ([], HOUR))
        counts = [c for _, c in points]
        title = gettext(
            "%(name)s: %(total)s in the last 24 hours, at most %(peak)s per %(step)s"
        ) % {
            "name": obj.name,
            "total": charts.format_count(sum(counts)),
            "peak": charts.format_count(max(counts, default=0)),
            "step": charts.describe_step(step),
        }
        # Safe: sparkline() escapes the title and draws nothing else from the data.
        return mark_safe(charts.sparkline(counts, title=title))

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Series | None = None,
    ) -> HttpResponse:
        # Only reached once the permission checks passed, so the chart is never computed for
        # (or shown to) anyone without the view permission.
        if obj is not None:
            context.update(self.chart_context(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def chart_context(self, request: HttpRequest, obj: Series) -> dict[str, Any]:
        """The chart page's extra context: the period links, the chart and its numbers."""
        period = period_from(request)
        # A whole second at or after now: a period of exactly one tier's age then starts
        # inside that tier, so 24 hours get the 1-minute step of the default retention.
        end = datetime.fromtimestamp(math.ceil(clock.now()), tz=UTC)
        points = query.series(obj.name, end - period.length, end)
        step = step_of(points, end)
        counts = [c for _, c in points]
        links = []
        for choice in PERIODS:
            params = request.GET.copy()
            params["period"] = choice.key
            links.append(
                {
                    "label": choice.label,
                    "url": f"?{params.urlencode()}",
                    "active": choice == period,
                }
            )
        title = gettext("%(name)s: events per %(step)s over the last %(period)s") % {
            "name": obj.name,
            "step": charts.describe_step(step),
            "period": period.label,
        }
        return {
            "metrics_periods": links,
            "metrics_period": period,
            "metrics_step": charts.describe_step(step),
            "metrics_period_total": charts.format_count(sum(counts)),
            "metrics_peak": charts.format_count(max(counts, default=0)),
            "metrics_total": charts.format_count(obj.total),
            # Safe: bar_chart() escapes every text it draws (the title holds the name).
            "metrics_chart": mark_safe(charts.bar_chart(points, step, title=title)),
        }
