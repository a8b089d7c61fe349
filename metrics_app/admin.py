"""The metrics admin: a read-only list of series with sparklines, and a chart page per series.

Every page needs a staff account with ``metrics_app.view_series`` (a superuser has it);
nobody can add, change or delete a series here, since the data comes from
:func:`metrics_app.record`, and there is no history to show. Charts are server-rendered SVG
(:mod:`metrics_app.charts`); what the chart page shows, its period (``?period=``), bar width
and zoomed hour (``?zoom=``), is :mod:`metrics_app.views`'s, chosen with plain links and a
``GET`` form, no JavaScript.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import formats
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from metrics_app import charts, clock, query, views
from metrics_app.models import Series

# Public here too: sites import the chart periods from the admin (demo_site/api.py does).
from metrics_app.views import DEFAULT_PERIOD, PERIODS, Period, period_from, step_of

__all__ = [
    "DEFAULT_PERIOD",
    "PERIODS",
    "RECENT_ATTR",
    "SPARKLINE_POINTS",
    "Period",
    "SeriesAdmin",
    "SeriesChangeList",
    "period_from",
    "step_of",
]

#: Where each list row's sparkline and "last 24 h" count are kept (set per page of results).
RECENT_ATTR = "_metrics_recent"

if TYPE_CHECKING:
    SeriesAdminBase = admin.ModelAdmin[Series]
else:  # ModelAdmin is generic only in django-stubs; no runtime monkeypatching needed.
    SeriesAdminBase = admin.ModelAdmin


#: Points of a sparkline: the list's last 24 hours, one point per hour.
SPARKLINE_POINTS = 24


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

    def get_queryset(self, request: HttpRequest) -> QuerySet[Series]:
        # Series live where the database routers put them (db_for_read), which need not be
        # the admin's own database.
        return super().get_queryset(request).using(router.db_for_read(Series))

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
        """The chart page's extra context: the chart (:func:`metrics_app.views.chart`), its
        controls and its numbers."""
        chart = views.chart(request, obj.name)
        title = gettext("%(name)s: events per %(step)s in %(period)s") % {
            "name": obj.name,
            "step": chart.step_text,
            "period": chart.phrase,
        }
        busiest = chart.busiest
        return {
            "metrics": chart,
            "metrics_period_total": charts.format_count(chart.total),
            "metrics_peak": charts.format_count(busiest[1] if busiest else 0),
            "metrics_total": charts.format_count(obj.total),
            # bar_chart() escapes every text it draws (the title holds the name).
            "metrics_chart": chart.svg(title),
        }
