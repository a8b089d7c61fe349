"""Management commands, system checks, the count_visits decorator, the Redis buffer."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.cache import cache
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.test import Client
from django.test.utils import override_settings
from django.urls import path

import metrics_app
from metrics_app import buffer, query, rollup
from metrics_app.checks import CHECK_IDS
from metrics_app.decorators import count_visits
from metrics_app.models import Bucket
from metrics_app.testing import FrozenClock

DAY = 86400


def ids(**overrides: object) -> set[str]:
    with override_settings(**overrides):
        return {m.id for m in run_checks() if m.id and m.id.startswith("metrics_app.")}


def test_default_settings_pass_but_warn_about_a_local_lock_cache() -> None:
    assert ids() == {"metrics_app.W001"}


@pytest.mark.parametrize(
    ("overrides", "check_id"),
    [
        ({"METRICS_RETENTION": "1m:1d,5m:1d"}, "metrics_app.E001"),
        ({"METRICS_BUFFER": "disk"}, "metrics_app.E004"),
        ({"METRICS_BUFFER": "redis:"}, "metrics_app.E004"),  # no alias after the colon
        ({"METRICS_BUFFER": None}, "metrics_app.E004"),
        ({"METRICS_BUFFER": "redis"}, "metrics_app.E005"),  # "default" is local memory
        ({"METRICS_BUFFER": "redis:nope"}, "metrics_app.E005"),  # no such alias
    ],
)
def test_each_check_id(overrides: dict[str, object], check_id: str) -> None:
    assert check_id in ids(**overrides)


def test_a_buffer_alias_missing_from_caches_is_named() -> None:
    with override_settings(METRICS_BUFFER="redis:nope"):
        (error,) = [m for m in run_checks() if m.id == "metrics_app.E005"]
    assert "METRICS_BUFFER" in error.msg and "CACHES has no alias 'nope'" in error.msg


def test_every_check_id_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.rst").read_text()
    for check_id in CHECK_IDS:
        assert check_id in doc


def test_redis_lock_cache_silences_the_warning(redis_server: str) -> None:
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server}}
    assert ids(CACHES=caches) == set()
    assert ids(CACHES=caches, METRICS_BUFFER="redis") == set()
    # Another django-redis alias for the buffer, beside a local default cache.
    beside = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    beside["buffer"] = caches["default"]
    assert ids(CACHES=beside, METRICS_BUFFER="redis:buffer") == {"metrics_app.W001"}
    assert "metrics_app.E005" in ids(CACHES=beside, METRICS_BUFFER="redis")


def test_check_command_reports_errors() -> None:
    with (
        override_settings(METRICS_RETENTION="1m:1d,1m:2d"),
        pytest.raises(Exception, match="E001"),
    ):
        call_command("check")


@pytest.mark.db_matrix
@pytest.mark.django_db
def test_metrics_flush_command(clock: FrozenClock) -> None:
    metrics_app.record("cmd", 2)
    out = StringIO()
    call_command("metrics_flush", stdout=out)
    assert "Flushed 1 (series, minute) keys." in out.getvalue()
    assert query.total("cmd") == 2


@pytest.mark.db_matrix
@pytest.mark.django_db
def test_metrics_downsample_command_shows_progress(clock: FrozenClock) -> None:
    for k in range(30):
        metrics_app.record("cmd", at=clock.t - 3 * DAY - k * 60)
    metrics_app.flush()
    out = StringIO()
    call_command("metrics_downsample", "--batch-size=10", stdout=out)
    text = out.getvalue()
    assert "tier 1m:1d: 10 buckets folded into 5m:2d" in text
    assert "tier 1m:1d: 30 buckets folded into 5m:2d" in text
    assert text.strip().endswith("batches.")
    assert set(Bucket.objects.values_list("resolution", flat=True)) == {3600}
    cache.add(rollup.LOCK_KEY, "other", 60)
    try:
        with pytest.raises(CommandError, match="holds the lock"):
            call_command("metrics_downsample", stdout=StringIO())
    finally:
        cache.delete(rollup.LOCK_KEY)


def test_count_visits_sync_counts_successes_only(clock: FrozenClock) -> None:
    @count_visits(series="shorturl:{key}")
    def follow(request: HttpRequest, key: str) -> HttpResponse:
        return HttpResponse() if key != "missing" else HttpResponseNotFound()

    follow(HttpRequest(), key="aB3x")
    follow(HttpRequest(), key="aB3x")
    follow(HttpRequest(), key="missing")
    from metrics_app import buffer

    assert {k[0]: v for k, v in buffer.current().aggregator.live_counts().items()} == {
        "shorturl:aB3x": 2
    }


async def test_count_visits_async_with_a_callable_name(clock: FrozenClock) -> None:
    @count_visits(series=lambda request, key: f"shorturl:{key.lower()}")
    async def follow(request: HttpRequest, key: str) -> HttpResponse:
        return HttpResponse()

    await follow(HttpRequest(), "XY")
    from metrics_app import buffer

    assert {k[0]: v for k, v in buffer.current().aggregator.live_counts().items()} == {
        "shorturl:xy": 1
    }


@pytest.mark.db_matrix
@pytest.mark.django_db
def test_redis_buffer_is_shared_and_flushed_once(
    redis_server: str, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_redis import get_redis_connection

    from metrics_app.buffer import shared as redis_buffer
    from metrics_app.tasks import flush_redis_buffer

    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server}}
    monkeypatch.setattr(redis_buffer, "REDIS_KEY", "t:buf")
    with override_settings(CACHES=caches, METRICS_BUFFER="redis"):
        get_redis_connection("default").flushdb()
        metrics_app.record("r", 2)
        metrics_app.record("r", 3, at=clock.t - 60)
        assert redis_buffer.buffered_keys() == 2
        assert flush_redis_buffer() == 2  # the task, called in-process
        assert query.total("r") == 5
        # A crash after the commit but before the delete leaves the hash pending: the
        # next run writes it again and the ledger makes that a no-op.
        metrics_app.record("r", 4)
        conn = get_redis_connection("default")
        conn.hset("{t:buf}:flushing:deadbeef", "1:r", 10)
        conn.sadd("{t:buf}:pending", "{t:buf}:flushing:deadbeef")
        from metrics_app import storage

        storage.write_counts({("r", 1): 10}, "redis:deadbeef")
        assert redis_buffer.flush() == 1  # the pending hash was already applied
        assert query.total("r") == 19
        assert conn.scard("{t:buf}:pending") == 0


@count_visits(series="page:{slug}")
def _any_page(request: HttpRequest, slug: str) -> HttpResponse:
    return HttpResponse(f"page {len(slug)}")


urlpatterns = [path("page/<str:slug>/", _any_page)]


@pytest.mark.parametrize(
    "slug",
    ["x" * 300, "a%00b"],  # too long; a NUL once decoded
    ids=["too-long", "nul"],
)
@override_settings(ROOT_URLCONF=__name__)
def test_count_visits_on_a_name_record_refuses_serves_the_page_uncounted(
    slug: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The URL builds the series name: a visitor's bad name is not a 500, just not counted."""
    response = Client(raise_request_exception=False).get(f"/page/{slug}/")
    assert response.status_code == 200
    assert response.content.startswith(b"page ")
    assert buffer.current().aggregator.live_counts() == {}
    assert "count_visits: a visit was not counted" in caplog.text
    assert Client().get("/page/fine/").status_code == 200
    assert [name for name, _ in buffer.current().aggregator.live_counts()] == ["page:fine"]
