"""docs/metrics.rst, the metrics group of docs/admin.rst and docs/celery.rst's schedule and
bucket query, run as printed against the test database.

What each block promises happens: recorded counts are read back after ``metrics_app.flush()``
(``at`` counts in its own minute); ``count_visits`` counts a redirect and not a 404, and
``only=`` keeps made-up slugs from creating series; ``series_many`` returns the recorded
visits; the chart view renders the page's ``visits.html`` with its SVG; the group the admin
page creates lets its members see the metrics admin; ``metrics_app.tasks.BEAT_SCHEDULE`` is
the dict the Celery page prints; the shell query of that page lists buckets per resolution.

The names a page assumes its reader already has (``some_aware_dt``, ``Link``, ``Page``,
``now``, Django's shortcuts) are given to the block; everything else is the block's own.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.shortcuts import get_object_or_404, redirect, render
from django.test import Client, RequestFactory, override_settings
from django.urls import URLPattern, path, reverse
from django.utils import timezone

import metrics_app
from demo_site.shortener.models import Link
from metrics_app import buffer, clock, query, rollup, tasks
from metrics_app.buffer import flusher
from metrics_app.models import Bucket, Series
from tests.docs.snippets import DOCS, Snippet, snippet

RUNS: list[tuple[str, int]] = [
    ("metrics", 0),
    ("metrics", 1),
    ("metrics", 2),
    ("metrics", 3),
    ("metrics", 4),
    ("admin", 0),
    ("celery", 3),
    ("celery", 4),
    ("settings", 1),
    ("deployment", 2),
]

MINUTE = timedelta(minutes=1)


def run(block: Snippet, **names: Any) -> dict[str, Any]:
    """The names ``block`` defines, executed as printed with ``names`` already defined."""
    namespace: dict[str, Any] = {"__name__": "docs_snippet", **names}
    exec(compile(block.code, block.where, "exec"), namespace)
    return namespace


def last_value(block: Snippet, namespace: dict[str, Any]) -> Any:
    """What a shell prints after ``block``: the value of its last line, an expression."""
    last = ast.parse(block.code).body[-1]
    assert isinstance(last, ast.Expr), f"{block.where} no longer ends with an expression"
    return eval(compile(ast.Expression(last.value), block.where, "eval"), namespace)


@contextmanager
def routed(*patterns: URLPattern) -> Iterator[None]:
    """The project's URLconf is ``patterns``."""
    urlconf = ModuleType("docs_snippet_urls")
    urlconf.urlpatterns = list(patterns)  # type: ignore[attr-defined]
    with override_settings(ROOT_URLCONF=urlconf):
        yield


@pytest.fixture
def metrics_db(db: None) -> Iterator[None]:
    """An empty buffer, and no broker call from a query that finds old buckets."""
    buffer.reset()
    with mock.patch.object(query, "DOWNSAMPLE_ON_READ", False):
        yield
    buffer.reset()


def minute_of(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def test_recorded_counts_are_read_back_after_a_flush(metrics_db: None) -> None:
    """Recording: one visit, three sign-ups, an import in the minute of ``at``."""
    some_aware_dt = timezone.now() - timedelta(hours=2, seconds=17)
    run(
        snippet("metrics", 0, 'record("shorturl:aB3x")', "at=some_aware_dt"),
        some_aware_dt=some_aware_dt,
    )
    assert query.total("shorturl:aB3x") == 0  # buffered, not written yet
    assert metrics_app.flush() == 3
    assert query.total("shorturl:aB3x") == 1
    assert query.total("signups") == 3
    assert query.total("imports") == 1
    start = minute_of(some_aware_dt)
    assert query.series("imports", start - MINUTE, start + 2 * MINUTE, step=60) == [
        (start - MINUTE, 0),
        (start, 1),
        (start + MINUTE, 0),
    ]


def short_links() -> dict[str, Any]:
    """The page's redirect view, defined as printed (the reader has ``Link`` and Django's
    shortcuts)."""
    return run(
        snippet("metrics", 1, '@count_visits(series="shorturl:{key}")', "get_object_or_404"),
        Link=Link,
        get_object_or_404=get_object_or_404,
        redirect=redirect,
    )


def test_a_redirect_counts_and_a_404_creates_no_series(metrics_db: None) -> None:
    """Short URLs: a served redirect is a visit; a guessed key is a 404 and no series."""
    Link.objects.create(key="aB3x", url="https://example.com/docs")
    with routed(path("s/<str:key>", short_links()["follow"])):
        client = Client()
        served = client.get("/s/aB3x")
        assert served.status_code == 302
        assert served["Location"] == "https://example.com/docs"
        assert client.get("/s/aB3x").status_code == 302
        assert client.get("/s/guess1").status_code == 404
    metrics_app.flush()
    assert query.total("shorturl:aB3x") == 2
    assert not Series.objects.filter(name="shorturl:guess1").exists()


class Page:
    """The reader's model of pages, as far as the block uses it: ``Page.objects.filter(
    slug=...).exists()``, over the slugs of pages that exist."""

    slugs = frozenset({"about", "pricing"})

    class objects:  # a model's manager
        @staticmethod
        def filter(slug: str) -> SimpleNamespace:
            return SimpleNamespace(exists=lambda: slug in Page.slugs)


def test_only_counts_the_slugs_that_exist(metrics_db: None) -> None:
    """``only=page_exists``: a view that answers any slug counts the existing pages only."""
    names = short_links()  # the block before it imports count_visits
    names = run(
        snippet("metrics", 2, "def page_exists(request, slug)", "only=page_exists"),
        **names,
        Page=Page,
    )
    view = names["page"]
    request = RequestFactory().get("/pages/")
    for slug in ("about", "about", "pricing", "wp-login.php", "admin.php"):
        view(request, slug=slug)  # as the URL resolver calls it, by keyword
    metrics_app.flush()
    assert query.total("page:about") == 2
    assert query.total("page:pricing") == 1
    assert set(Series.objects.values_list("name", flat=True)) == {"page:about", "page:pricing"}


def test_series_many_sums_the_recorded_visits(metrics_db: None) -> None:
    """``series_many`` over the last 24 hours: each name's visits, in one query."""
    recorded = timezone.now()
    for at, name in [
        (recorded - timedelta(hours=20), "shorturl:docs"),
        (recorded - timedelta(minutes=5), "shorturl:docs"),
        (recorded, "shorturl:docs"),
        (recorded - timedelta(hours=1), "shorturl:shop"),
        (recorded - timedelta(hours=30), "shorturl:shop"),  # before the range
    ]:
        metrics_app.record(name, at=at)
    metrics_app.flush()
    names = run(
        snippet("metrics", 3, "query.series_many(", "visits = {"),
        now=recorded + timedelta(seconds=1),
        timedelta=timedelta,
    )
    assert names["visits"] == {"shorturl:docs": 3, "shorturl:shop": 1}
    assert set(names["lines"]) == {"shorturl:docs", "shorturl:shop"}


def printed_template() -> str:
    """``visits.html`` as docs/metrics.rst prints it, after the view."""
    text = (DOCS / "metrics.rst").read_text(encoding="utf-8")
    intro = text.index("and in ``visits.html``")
    block = text[text.index("::\n\n", intro) + 4 :]
    lines: list[str] = []
    indent = len(block) - len(block.lstrip(" "))
    for line in block.splitlines():
        if line.strip() and len(line) - len(line.lstrip(" ")) < indent:
            break
        lines.append(line)
    template = textwrap.dedent("\n".join(lines)).strip() + "\n"
    assert "{{ svg }}" in template, f"docs/metrics.rst's visits.html has no svg:\n{template}"
    return template


def test_the_chart_view_renders_the_visits_page(metrics_db: None) -> None:
    """``views.chart`` in a site's view, with the page's ``visits.html``: the SVG of the
    recorded visits, the zoom control, and a zoom into their hour."""
    now = clock.now()
    for seconds in (0, 65, 130):
        metrics_app.record("shorturl:docs", at=now - seconds)
    metrics_app.flush()
    names = run(
        snippet("metrics", 4, 'views.chart(request, f"shorturl:{key}")', '"visits.html"'),
        render=render,
    )
    engine = {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "OPTIONS": {
            "loaders": [
                ("django.template.loaders.locmem.Loader", {"visits.html": printed_template()}),
                "django.template.loaders.app_directories.Loader",
            ],
        },
    }
    with routed(path("links/<str:key>/", names["visits"])), override_settings(TEMPLATES=[engine]):
        whole = Client().get("/links/docs/")
        assert whole.status_code == 200
        chart = whole.context["chart"]
        assert (chart.total, chart.step_text, chart.phrase) == (
            3,
            "10 minutes",
            "the last 24 hours",
        )
        page = whole.content.decode()
        assert "<svg" in page and "Visits per 10 minutes in the last 24 hours" in page
        assert '<form id="zoom" method="get" hidden></form>' in page
        assert 'name="zoom" form="zoom"' in page  # the zoom control, naming that form
        hour = f"{datetime.fromtimestamp(now, tz=UTC):%Y-%m-%dT%H}:00"  # the last visit's
        assert hour in [option.value for option in chart.zooms]
        zoomed = Client().get("/links/docs/", {"zoom": hour})
    assert zoomed.status_code == 200
    assert zoomed.context["chart"].step_text == "1 minute"
    assert zoomed.context["chart"].total == sum(
        1
        for s in (0, 65, 130)
        if f"{datetime.fromtimestamp(now - s, tz=UTC):%Y-%m-%dT%H}:00" == hour
    )
    assert "Visits per 1 minute in" in zoomed.content.decode()


def test_the_metrics_viewers_group_sees_the_metrics_admin(metrics_db: None) -> None:
    """docs/admin.rst's group: its staff members may view series, and the admin shows them."""
    names = run(snippet("admin", 0, 'name="metrics viewers"', 'codename="view_series"'))
    member = User.objects.create_user("viewer", is_staff=True)
    member.groups.add(names["viewers"])
    outsider = User.objects.create_user("outsider", is_staff=True)
    assert member.has_perm("metrics_app.view_series")
    assert not outsider.has_perm("metrics_app.view_series")
    metrics_app.record("signups", 4)
    metrics_app.flush()
    client = Client()
    changelist = reverse("admin:metrics_app_series_changelist")
    client.force_login(outsider)
    assert client.get(changelist).status_code == 403
    client.force_login(member)
    answer = client.get(changelist)
    assert answer.status_code == 200
    assert "signups" in answer.content.decode()
    run(snippet("admin", 0))  # a second run changes nothing
    assert list(names["viewers"].permissions.values_list("codename", flat=True)) == ["view_series"]


def test_the_printed_beat_schedule_is_the_tasks_one() -> None:
    """docs/celery.rst prints ``BEAT_SCHEDULE``; ``beat_schedule()`` is it with the Redis
    buffer, and without its flush otherwise."""
    shown = snippet("celery", 3, '"metrics-downsample"', '"metrics-flush-redis-buffer"')
    printed = eval(compile(shown.code, shown.where, "eval"))
    assert printed == tasks.BEAT_SCHEDULE
    with override_settings(METRICS_BUFFER="redis"):
        assert tasks.beat_schedule() == printed
    with override_settings(METRICS_BUFFER="memory"):
        without = {k: v for k, v in printed.items() if k != "metrics-flush-redis-buffer"}
        assert tasks.beat_schedule() == without


def test_the_shell_query_counts_buckets_per_resolution(metrics_db: None) -> None:
    """docs/celery.rst's shell query: after a flush and a downsample, minute buckets and the
    hour bucket that three-day-old counts were folded into."""
    now = clock.now()
    metrics_app.record("shorturl:docs", at=now)
    metrics_app.record("shorturl:docs", at=now - 60)
    metrics_app.record("shorturl:docs", at=now - 3 * 86400)
    metrics_app.flush()
    result = rollup.downsample()
    assert result.folded >= 1
    shown = snippet("celery", 4, 'annotate(n=Count("id"))', 'order_by("resolution")')
    names = run(shown)
    rows = list(last_value(shown, names))
    assert rows == [{"resolution": 60, "n": 2}, {"resolution": 3600, "n": 1}]
    assert Bucket.objects.count() == 3


def test_the_tests_flush_by_hand(metrics_db: None) -> None:
    """docs/settings.rst: under ``manual_flush()`` no flusher thread starts, and the
    snippet's own flush writes its count."""
    shown = snippet("settings", 1, "from metrics_app.testing import manual_flush")
    threads: list[object] = []
    real_flush = metrics_app.flush

    def flush(**kwargs: Any) -> int | None:
        threads.append(buffer.current().flusher.thread)  # when the snippet flushes
        return real_flush(**kwargs)

    with (
        mock.patch.object(flusher, "FLUSH_INTERVAL", 10.0),  # as outside the test suite
        mock.patch.object(metrics_app, "flush", flush),
    ):
        run(shown)
        assert threads == [None]  # the buffer had started, with no thread
        thread = buffer.current().flusher.thread
        assert thread is not None and thread.is_alive()  # leaving the block starts it
    assert query.total("signups") == 1


def test_the_router_puts_the_metrics_tables_on_their_own_database() -> None:
    """docs/deployment.rst's router: metrics_app's models read, write and migrate on
    ``"metrics"``, every other app as before."""
    from django.contrib.auth.models import User
    from django.db import router

    from metrics_app.models import FlushLedger, TopKey

    shown = snippet("deployment", 2, "class MetricsRouter", "allow_migrate")
    routed = run(shown)["MetricsRouter"]()
    with override_settings(DATABASE_ROUTERS=[routed]):
        for model in (Series, Bucket, FlushLedger, TopKey):
            assert router.db_for_read(model) == router.db_for_write(model) == "metrics"
        assert router.db_for_read(User) == router.db_for_write(User) == "default"
        assert router.allow_migrate("metrics", "metrics_app")
        assert not router.allow_migrate("default", "metrics_app")
        assert router.allow_migrate("default", "auth")
