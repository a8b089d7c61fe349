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

if TYPE_CHECKING:
    SeriesAdminBase = admin.ModelAdmin[Series]
else:  # ModelAdmin is generic only in django-stubs; no runtime monkeypatching needed.
    SeriesAdminBase = admin.ModelAdmin


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
#: Points of a sparkline: the list's last 24 hours, one point per hour.
SPARKLINE_POINTS = 24


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


class SeriesChangeList(ChangeList):
    """Reads the last 24 hours of a whole page of series in one query, after the page's own.

    The same buckets as the chart page's "24 hours", so both pages show the same numbers.
    """

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        now = clock.now()
        start, end = DEFAULT_PERIOD.bounds(now)
        recent = query.series_many([s.name for s in rows], start, end, now=now)
        for row in rows:
            setattr(row, RECENT_ATTR, [count for _, count in recent[row.name]])


@admin.register(Series)
class SeriesAdmin(SeriesAdminBase):
    """Series, busiest first, each with its last day; a chart page per series."""

    list_display = ["name", "total_count", "last_24h", "activity"]
    search_fields = ["name"]
    ordering = ["-total", "name"]
    list_per_page = 50
    fields = ["name", "total_count", "first_seen", "last_seen"]
    readonly_fields = ["name", "total_count", "first_seen", "last_seen"]

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
        return formats.number_format(sum(getattr(obj, RECENT_ATTR, [])), force_grouping=True)

    @admin.display(description=_("activity, last 24 h"))
    def activity(self, obj: Series) -> SafeString:
        counts = getattr(obj, RECENT_ATTR, [])
        title = gettext("%(name)s: %(total)s in the last 24 hours") % {
            "name": obj.name,
            "total": charts.format_count(sum(counts)),
        }
        # Safe: sparkline() escapes the title and draws nothing else from the data.
        return mark_safe(charts.sparkline(charts.rebin(counts, SPARKLINE_POINTS), title=title))

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
        now = clock.now()
        start, end = period.bounds(now)
        points = query.series(obj.name, start, end, now=now)
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
        title = gettext("%(name)s: events per %(step)s in %(period)s") % {
            "name": obj.name,
            "step": charts.describe_step(step),
            "period": period.phrase,
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
