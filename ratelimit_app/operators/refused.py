"""The admin page *Refused lately*: per limit, the subjects refused in the last hour and day.

Read from the rows ``metrics_app`` keeps of each limit's most refused subjects
(:class:`metrics_app.models.TopKey`, fed by :mod:`ratelimit_app.operators.metrics`): a bounded
top-k per process, flushed with the metrics, so a flood of distinct subjects costs bounded memory
and rows. Its counts are certain (never above the refusals), so their sums over flushes and
processes, which rank the subjects here, are too. Each subject comes with its counts, first
and last refusal, and the admin's actions: its usage lookup and reset (where
``RATELIMIT_REFUSED_SUBJECTS`` keeps what they need), and the limit's bans.

Served by the rules' admin (``/admin/ratelimit_app/rule/refused/``, linked from the rules
list), read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.apps import apps
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Max, Min, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext_lazy as _

from ratelimit_app.conf import read
from ratelimit_app.operators.metrics import MODES, RETENTION_DAYS, SERIES_PREFIX, mode

#: Subjects shown per limit, most refused in the last day first.
SHOWN = 25
HOUR, DAY = 3600, 86400


@dataclass
class Subject:
    """One refused subject of a limit, as the page shows it: ``hour`` and ``day`` are at
    most its refusals in the last hour and day (:mod:`metrics_app.topk`)."""

    key: str
    label: str
    ref: str
    hour: int
    day: int
    first: datetime
    last: datetime


@dataclass
class Refused:
    """A limit and its subjects refused in the last day."""

    limit: str
    subjects: list[Subject] = field(default_factory=list)


def refused_lately(now: float, shown: int = SHOWN) -> list[Refused]:
    """Each limit with subjects refused in the day before ``now``, by name, each with its
    ``shown`` most refused subjects. A bucket counts in a period when any of it lies in it."""
    from metrics_app.models import TopKey
    from metrics_app.storage import TOP_BUCKET

    rows = TopKey.objects.filter(name__startswith=SERIES_PREFIX, start__gt=now - DAY - TOP_BUCKET)
    names = sorted(set(rows.values_list("name", flat=True)))
    found = []
    for name in names:
        # Every subject of the day, not the first ``shown``: subjects shown alike are
        # merged below, and a network of many addresses refused a few times each may
        # outrank any one address. (The table keeps at most 100 subjects per ten minutes.)
        grouped = (
            rows.filter(name=name)
            .values("key")
            .annotate(
                hour=Sum("count", filter=Q(start__gt=now - HOUR - TOP_BUCKET)),
                day=Sum("count"),
                first=Min("first_seen"),
                last=Max("last_seen"),
                label=Max("label"),
                ref=Max("ref"),
            )
            .order_by("-day", "-last", "key")
        )
        subjects = [
            Subject(
                g["key"], g["label"], g["ref"], g["hour"] or 0, g["day"], g["first"], g["last"]
            )
            for g in grouped
        ]
        found.append(Refused(name.removeprefix(SERIES_PREFIX), merged(subjects)[:shown]))
    return found


def merged(subjects: list[Subject]) -> list[Subject]:
    """``subjects`` with those the page shows alike (one label: the addresses of one
    masked network, the emails of one domain) made one row, most refused first (by the day's
    count, then the last refusal). A row's counts are the sums of its subjects', so they stay
    certain lower bounds; it keeps the subjects' ``ref`` only when they share it (an action
    on the row acts on them all, or is not offered). A subject with no label (hashed) stays
    a row of its own."""
    rows: dict[str, Subject] = {}
    for s in subjects:
        shown = s.label or "\0" + s.key  # (no label starts with NUL)
        row = rows.get(shown)
        if row is None:
            rows[shown] = Subject(s.key, s.label, s.ref, s.hour, s.day, s.first, s.last)
            continue
        row.hour += s.hour
        row.day += s.day
        row.first, row.last = min(row.first, s.first), max(row.last, s.last)
        row.key = min(row.key, s.key)
        if row.ref != s.ref:
            row.ref = ""
    return sorted(rows.values(), key=lambda r: (-r.day, -r.last.timestamp(), r.key))


def _lately() -> list[Refused]:
    from metrics_app import clock  # the clock the rows were written by

    return refused_lately(clock.now())


def _url(name: str) -> str | None:
    try:
        return reverse(name)
    except NoReverseMatch:  # that admin is not registered
        return None


def problems() -> list[str]:
    """What is wrong with the page's settings, as the page says it."""
    found = []
    if read("RATELIMIT_REFUSED_SUBJECTS") not in MODES:
        found.append(
            _("RATELIMIT_REFUSED_SUBJECTS is %(value)r, not one of %(modes)s: subjects hidden.")
            % {"value": read("RATELIMIT_REFUSED_SUBJECTS"), "modes": ", ".join(MODES)}
        )
    return found


def page(request: HttpRequest, site: admin.AdminSite, opts: Any) -> HttpResponse:
    """The page, served by the rules' admin under *Rate limits* (``RuleAdmin.get_urls``):
    staff with ``ratelimit_app.view_rule`` see it; a project without ``metrics_app`` keeps
    no rows, and the page says so."""
    user = request.user
    if not user.has_perm("ratelimit_app.view_rule"):
        raise PermissionDenied
    installed = apps.is_installed("metrics_app")
    context = {
        **site.each_context(request),
        "opts": opts,
        "title": _("Refused lately"),
        "installed": installed,
        "limits": _lately() if installed else [],
        "usage_url": _url("admin:ratelimit_app_rule_usage"),
        "bans_url": _url("admin:ratelimit_app_ban_changelist"),
        "can_look": True,
        "can_reset": user.has_perm("ratelimit_app.reset_counters"),
        "can_see_bans": user.has_perm("ratelimit_app.view_ban"),
        "can_ban": user.has_perm("ratelimit_app.add_ban"),
        "ban_url": _url("admin:ratelimit_app_rule_ban"),
        "mode": mode(),
        "days": RETENTION_DAYS,
        "problems": problems(),
    }
    return TemplateResponse(request, "admin/ratelimit_app/refused_lately.html", context)
