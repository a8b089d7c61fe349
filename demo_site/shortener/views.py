"""The shortener's pages: the form and recent links, the redirect, and a chart per link.

The redirect is counted with metrics_app's own decorator; the charts are the admin's
(:func:`metrics_app.views.chart`: the same periods, bar widths and zoom). An unknown key is
answered with the site's own 404 page, under ``DEBUG`` too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect, render
from django.urls import get_resolver, get_urlconf, reverse
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_safe

from demo_site.shortener.forms import LinkForm
from demo_site.shortener.keys import KeyspaceExhausted, create_link
from demo_site.shortener.models import Link
from metrics_app import charts, clock, query, views
from metrics_app.admin import SPARKLINE_POINTS
from metrics_app.buffer import flusher
from metrics_app.decorators import count_visits
from metrics_app.models import Series
from ratelimit_app import responses
from ratelimit_app.decorators import ratelimit
from ratelimit_app.exceptions import Ratelimited

logger = logging.getLogger(__name__)

#: Links a client may create: per account when logged in, else per IP address.
CREATE_RATE = "10/m;100/d"
#: ... and at most 1,000 a calendar month (``TIME_ZONE``'s), renewed on the 1st.
CREATE_QUOTA = "1000/month"
#: The limit on creating links, one budget whichever door is used: the form here (its
#: decorator) and the API's POST (``demo_site.api``, through ``get_usage``) count with
#: these same arguments, so they count in the same counters.
CREATE_LIMIT: dict[str, Any] = {
    "group": "shortener:create",
    "key": "user_or_ip",
    "rate": CREATE_RATE,
    # A plan's quota on the calendar beside the rates: renewed on the 1st (docs/quotas).
    "quota": CREATE_QUOTA,
    "method": "POST",
}
#: Links listed on the home page.
RECENT_LINKS = 10


def bounds(period: views.Period) -> tuple[datetime, datetime]:
    """``period``'s ``(start, end)`` for a query that runs now.

    A second ahead of the clock: ``query.series`` reads the clock again, and had a whole
    second passed in between, a 24-hour range would start just outside the minute tier
    (``Period.bounds`` ends on the next whole second) and come back in 5-minute buckets.
    """
    return period.bounds(clock.now() + 1)


@dataclass(frozen=True)
class LinkRow:
    """A row of the home page's list: a link, its visits and a sparkline of its last day."""

    link: Link
    short_url: str
    total: int
    last_day: int
    sparkline: SafeString


def short_url(request: HttpRequest, key: str) -> str:
    """The absolute ``/s/<key>`` URL of a key, on the host the request came to."""
    return request.build_absolute_uri(reverse("shortener:follow", args=[key]))


def recent_rows(request: HttpRequest) -> list[LinkRow]:
    """The newest links with their totals and last 24 hours: two queries for the lot."""
    links = list(Link.objects.all()[:RECENT_LINKS])
    names = [link.series_name for link in links]
    start, end = bounds(views.DEFAULT_PERIOD)
    recent = query.series_many(names, start, end)
    totals = dict(Series.objects.filter(name__in=names).values_list("name", "total"))
    rows = []
    for link in links:
        counts = [count for _, count in recent[link.series_name]]
        title = f"/s/{link.key}: {charts.format_count(sum(counts))} visits in the last 24 hours"
        rows.append(
            LinkRow(
                link=link,
                short_url=short_url(request, link.key),
                total=totals.get(link.series_name, 0),
                last_day=sum(counts),
                # Safe: sparkline() escapes its title and draws nothing else from the data.
                sparkline=mark_safe(
                    charts.sparkline(charts.rebin(counts, SPARKLINE_POINTS), title=title)
                ),
            )
        )
    return rows


def _index(request: HttpRequest, form: LinkForm, status: int = 200) -> HttpResponse:
    context = {
        "form": form,
        "rows": recent_rows(request),
        "create_rate": CREATE_RATE,
        "create_quota": CREATE_QUOTA,
    }
    return render(request, "shortener/index.html", context, status=status)


def not_found(request: HttpRequest) -> HttpResponse:
    """The site's own 404 page (its ``handler404``), for a key that names no link.

    Called, not raised: under ``DEBUG`` an ``Http404`` shows Django's technical page, and
    the demo runs with ``DEBUG`` on. The status is the same 404 either way, so the
    ``shorturl-scan`` rule counts it.
    """
    handler: Callable[..., HttpResponse] = get_resolver(get_urlconf()).resolve_error_handler(404)
    return handler(request, Http404())


@require_http_methods(["GET", "HEAD", "POST"])
def index(request: HttpRequest) -> HttpResponse:
    """``/``: the form (POST creates a link and shows its page) and the newest links.

    Creating is limited by a decorator, 10 a minute and 100 a day per user (or per IP when
    anonymous), and 1,000 a calendar month renewed on the 1st, in one budget with the API's
    POST (:data:`CREATE_LIMIT`); reading is not.
    An invalid URL is shown again with its error (400); so is a URL refused by the limit
    (429), saying that no link was created and when to try again.
    """
    if request.method != "POST":
        return _index(request, LinkForm())
    form = LinkForm(request.POST)
    try:
        return _create(request, form)
    except Ratelimited as refused:
        return _not_created(request, form, refused)


@ratelimit(**CREATE_LIMIT)
def _create(request: HttpRequest, form: LinkForm) -> HttpResponse:
    """Every POST counts, valid or not: a client cannot probe the form for free."""
    if not form.is_valid():
        return _index(request, form, status=400)
    try:
        created = create_link(form.cleaned_data["url"], user=request.user)
    except KeyspaceExhausted as exc:
        logger.error("shortener: %s", exc)
        form.add_error(None, "No free short key was found. Please try again.")
        return _index(request, form, status=503)
    messages.success(request, "Your short link is ready.")
    return redirect("shortener:link", key=created.key)


def _not_created(request: HttpRequest, form: LinkForm, refused: Ratelimited) -> HttpResponse:
    """The form again, the URL as typed, saying no link was created: a 429 with the
    headers of ratelimit_app's own answer (``Retry-After``, ``RateLimit``...).

    A client that asked for JSON, or a project's ``RATELIMIT_VIEW``, gets that answer.
    """
    answer = responses.too_many_requests(request, refused, refused.usage)
    if answer.status_code != 429 or responses.wants_json(request):
        return answer
    wait = int(answer["Retry-After"])
    rate = (refused.usage or {}).get("rate") or CREATE_RATE
    form.add_error(
        None,
        f"Your link was not created: links are limited to {rate} per account (per address "
        f"when logged out). Try again in {wait} second{'' if wait == 1 else 's'}.",
    )
    page = _index(request, form, status=429)
    for name in ("Retry-After", "RateLimit-Policy", "RateLimit"):
        if name in answer:
            page[name] = answer[name]
    return page


@count_visits(series="shorturl:{key}")
@never_cache
@require_safe
def follow(request: HttpRequest, key: str) -> HttpResponse:
    """``/s/<key>``: redirect (302) to the link's URL, counted in ``shorturl:<key>``.

    Only redirects served count (``count_visits`` skips statuses from 400): an unknown key is
    a 404 that creates no series, and the ``shorturl-scan`` rule counts it against the
    client. ``never_cache``: a browser that cached the redirect would not be counted again.
    """
    target = Link.objects.filter(key=key).values_list("url", flat=True).first()
    if target is None:
        return not_found(request)
    return HttpResponseRedirect(target)


#: The status of a link, read by scripts: one request a second per address on average.
STATUS_RATE = "60/m"


@require_safe
@ratelimit(key="ip", rate=STATUS_RATE)
async def link_status(request: HttpRequest, key: str) -> HttpResponse:
    """``/api/links/<key>/status/``: where a short link leads, for a script. An async view:
    its limit is checked on the event loop, its round trip awaited (docs/deployment, ASGI),
    and the link read with Django's async ORM. An unknown key is a 404 that the
    ``shorturl-scan`` rule counts, as on the link's page."""
    found = await Link.objects.filter(key=key).afirst()
    if found is None:
        return JsonResponse({"error": "no such link"}, status=404)
    return JsonResponse({"key": key, "url": found.url, "short_url": short_url(request, key)})


@require_safe
def link(request: HttpRequest, key: str) -> HttpResponse:
    """``/links/<key>/``: a link's visits, as the admin charts them (24 hours, 7 days, 30
    days or a year, ``?period=``, and an hour of them by the minute, ``?zoom=``).

    Visits reach the chart when the web process flushes its buffer, every 10 seconds. An
    unknown key is a 404 that the ``shorturl-scan`` rule counts, as on ``/s/``: this page
    tells which keys exist, too.
    """
    found = Link.objects.filter(key=key).first()
    if found is None:
        return not_found(request)
    context: dict[str, Any] = {
        "link": found,
        "short_url": short_url(request, key),
        "total": query.total(found.series_name),
        "periods": views.period_links(request),
        "flush_interval": flusher.FLUSH_INTERVAL,
        "series_admin_url": _series_admin_url(request, found.series_name),
    }
    try:
        chart = views.chart(request, found.series_name)
    except ValueError as exc:  # a range the stored buckets cannot answer: say so, no 500
        logger.warning("shortener: no chart for %s: %s", found.series_name, exc)
        context["chart_error"] = "This period cannot be drawn right now; try another one."
        return render(request, "shortener/link.html", context)
    title = f"Visits to /s/{key} per {chart.step_text} in {chart.phrase}"
    # Safe: bar_chart() escapes every text it draws.
    context.update(chart=chart, svg=chart.svg(title))
    return render(request, "shortener/link.html", context)


def _series_admin_url(request: HttpRequest, name: str) -> str | None:
    """The admin page of the series, for a user who may see it."""
    user = request.user
    if not (user.is_active and user.is_staff and user.has_perm("metrics_app.view_series")):
        return None
    pk = Series.objects.filter(name=name).values_list("pk", flat=True).first()
    if pk is None:
        return None
    return reverse("admin:metrics_app_series_change", args=[pk])
