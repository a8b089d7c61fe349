"""Series names a client chooses (``count_visits`` on a URL) cannot crowd out the others.

A view that answers 200 for any slug turns every made-up slug into a series name. Those
names share at most 300,000 of the buffer's 350,000 keys (``MAX_CLIENT_KEYS``); the names
the code chooses, the limiter's ``ratelimit:<rule>`` among them, keep the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from django.db import OperationalError
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.test.utils import override_settings
from django.urls import path

import metrics_app
from metrics_app import buffer
from metrics_app.buffer import aggregator
from metrics_app.buffer import shared as shared_buffer
from metrics_app.decorators import count_visits
from metrics_app.models import Series
from metrics_app.signals import buffer_full
from metrics_app.testing import FrozenClock
from ratelimit_app import store
from ratelimit_app.testing import forget_refusals, frozen_clock

#: Pages that exist; the catch-all view answers 200 for any other slug too.
PAGES = {"home", "about"}


@count_visits(series="page:{slug}")
def any_page(request: HttpRequest, slug: str) -> HttpResponse:
    return HttpResponse(f"page {slug}")


@count_visits(series="known:{slug}", only=lambda request, slug: slug in PAGES)
def known_page(request: HttpRequest, slug: str) -> HttpResponse:
    return HttpResponse("a page, or a friendly 'nothing here'")


async def _exists(request: HttpRequest, slug: str) -> bool:
    return slug in PAGES


@count_visits(series="async:{slug}", only=_exists)
async def async_page(request: HttpRequest, slug: str) -> HttpResponse:
    return HttpResponse("async")


@count_visits(series="async-sync-only:{slug}", only=lambda request, slug: slug in PAGES)
async def async_page_sync_only(request: HttpRequest, slug: str) -> HttpResponse:
    return HttpResponse("async")


def login(request: HttpRequest) -> HttpResponse:
    return HttpResponse("login form")


urlpatterns = [
    path("page/<str:slug>/", any_page),
    path("known/<str:slug>/", known_page),
    path("async/<str:slug>/", async_page),
    path("async-sync-only/<str:slug>/", async_page_sync_only),
    path("login/", login),
]

RULE = {"name": "login-flood", "path": "/login/", "key": "ip", "rate": "2/m"}


@pytest.fixture
def site() -> Iterator[None]:
    store.forget()
    forget_refusals()
    with override_settings(ROOT_URLCONF=__name__, RATELIMIT_RULES=[RULE]):
        yield
    store.forget()
    forget_refusals()


def client_keys() -> list[str]:
    return [name for name, _ in buffer.current().aggregator.live_counts()]


@contextmanager
def redis_buffer(redis_server: str) -> Iterator[None]:
    """``METRICS_BUFFER = "redis:buffer"``: the session's Redis (the cache alias
    ``"buffer"``), under a key of its own, emptied before and after."""
    from django_redis import get_redis_connection

    caches = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "bucketry-tests",
        },
        "buffer": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server},
    }
    key = f"t:{uuid.uuid4().hex}"

    def clear() -> None:
        conn = get_redis_connection("buffer")
        for found in conn.scan_iter(match=f"{{{key}}}*"):
            conn.delete(found)

    with (
        override_settings(CACHES=caches, METRICS_BUFFER="redis:buffer"),
        mock.patch.object(shared_buffer, "REDIS_KEY", key),
    ):
        clear()
        try:
            yield
        finally:
            clear()


@pytest.fixture(params=["memory", "redis"])
def buffer_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each buffer: this process's memory, and the Redis hash every process shares."""
    if request.param == "memory":
        yield "memory"
        return
    with redis_buffer(request.getfixturevalue("redis_server")):
        yield "redis"


def flush_buffer(kind: str) -> None:
    """Write what is buffered, as the flusher thread or the Celery task would."""
    if kind == "redis":
        from metrics_app.tasks import flush_redis_buffer

        flush_redis_buffer()
    else:
        metrics_app.flush()


@pytest.mark.db_matrix
@pytest.mark.django_db
def test_a_flood_of_made_up_slugs_leaves_the_limiters_refusals_intact(
    site: None, clock: FrozenClock, buffer_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten minutes of an attack on the login page, hidden behind 100 junk pages a minute.

    The buffer holds 200 keys, 20 of them for client-chosen names: the 1,000 junk slugs
    fill their 20 and no more, and every 429 of the limiter is counted in its series.
    """
    sent: list[dict[str, Any]] = []

    def on_full(**kwargs: Any) -> None:
        sent.append(kwargs)

    buffer_full.connect(on_full)
    http = Client()
    refused = 0
    monkeypatch.setattr(aggregator, "MAX_BUFFERED_KEYS", 200)
    monkeypatch.setattr(aggregator, "MAX_CLIENT_KEYS", 20)
    try:
        with frozen_clock(clock.t) as limiter_clock:
            for minute in range(10):
                for i in range(100):
                    assert http.get(f"/page/junk-{minute}-{i}/").status_code == 200
                statuses = [http.get("/login/").status_code for _ in range(5)]
                assert set(statuses) <= {200, 429}
                refused += statuses.count(429)
                clock.advance(60)
                limiter_clock.advance(60)
            stats = buffer.stats()
            flush_buffer(buffer_kind)
    finally:
        buffer_full.disconnect(on_full)
    assert refused >= 30  # at least 3 of 5 a minute
    assert Series.objects.get(name="ratelimit:login-flood").total == refused
    assert Series.objects.filter(name__startswith="page:").count() == 20
    assert stats["dropped_events"] == 1000 - 20
    if buffer_kind == "memory":
        assert stats["client_keys"] == 20
        # The flood is reported, naming the bound it met, once per flush interval.
        assert [s["bound"] for s in sent] == ["MAX_CLIENT_KEYS"]


@pytest.mark.django_db
def test_the_redis_buffer_stays_bounded_while_the_database_is_down(
    redis_server: str, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain renames the live hash only once nothing is pending: however long the outage,
    Redis holds one pending hash and the live one, each within the bound."""
    from django_redis import get_redis_connection

    from metrics_app import storage
    from metrics_app.buffer import shared

    real = storage.write_counts

    def refused(*args: Any, **kwargs: Any) -> bool:
        raise OperationalError("the database is down")

    monkeypatch.setattr(aggregator, "MAX_BUFFERED_KEYS", 10)
    with redis_buffer(redis_server):
        conn = get_redis_connection("buffer")

        key = f"{{{shared.REDIS_KEY}}}"

        def fields() -> int:
            """Fields of the live and pending hashes."""
            found = conn.scan_iter(match=f"{key}*")
            return sum(conn.hlen(k) for k in found if conn.type(k) == b"hash")

        monkeypatch.setattr(storage, "write_counts", refused)
        for _ in range(6):  # six runs of the beat's drain, a minute apart
            for i in range(20):
                metrics_app.record(f"code:{i}")
            clock.advance(60)
            with pytest.raises(OperationalError):
                shared.flush()
            assert fields() <= 2 * 10
        kept = fields()
        assert conn.scard(f"{key}:pending") == 1
        monkeypatch.setattr(storage, "write_counts", real)
        assert shared.flush() == kept
        assert fields() == 0
    assert sum(Series.objects.values_list("total", flat=True)) == kept == 20


@pytest.mark.django_db
def test_the_redis_buffer_keeps_the_client_share(
    redis_server: str, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metrics_app.buffer import shared

    monkeypatch.setattr(aggregator, "MAX_BUFFERED_KEYS", 10)
    monkeypatch.setattr(aggregator, "MAX_CLIENT_KEYS", 3)
    with redis_buffer(redis_server):
        dropped = buffer.stats()["dropped_events"]
        for i in range(20):
            metrics_app.record(f"visit:{i}", client_chosen=True)
        metrics_app.record("visit:0", 4, client_chosen=True)  # a field already there adds up
        for i in range(12):
            metrics_app.record(f"code:{i}")
        assert shared.buffered_keys() == 10
        assert shared.client_keys() == 3
        assert buffer.stats()["dropped_events"] - dropped == 17 + 5
        assert shared.flush() == 10
        assert shared.client_keys() == 0  # the share is free again for the next hash
        metrics_app.record("visit:new", client_chosen=True)
        assert shared.client_keys() == 1
    totals = dict(Series.objects.values_list("name", "total"))
    assert totals == {
        **{f"visit:{i}": 1 for i in (1, 2)},
        "visit:0": 5,
        **{f"code:{i}": 1 for i in range(7)},
    }


def test_the_code_s_names_still_meet_the_whole_buffer_bound(
    clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names the code chooses may use the whole buffer, client-chosen ones their share."""
    monkeypatch.setattr(aggregator, "MAX_BUFFERED_KEYS", 5)
    monkeypatch.setattr(aggregator, "MAX_CLIENT_KEYS", 2)
    for i in range(4):
        metrics_app.record(f"visit:{i}", client_chosen=True)
    for i in range(6):
        metrics_app.record(f"code:{i}")
    metrics_app.record("visit:0", 5, client_chosen=True)  # a key already buffered adds up
    counts = {name: n for (name, _), n in buffer.current().aggregator.live_counts().items()}
    assert counts == {"visit:0": 6, "visit:1": 1, "code:0": 1, "code:1": 1, "code:2": 1}


def test_the_share_is_freed_by_a_flush(
    clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queued batches hold their share until written: a database that is down keeps it full."""
    from metrics_app import storage

    written: list[str] = []
    monkeypatch.setattr(storage, "write_counts", lambda counts, flush_id: written.append(flush_id))
    monkeypatch.setattr(aggregator, "MAX_CLIENT_KEYS", 2)
    metrics_app.record("visit:a", client_chosen=True)
    metrics_app.record("visit:b", client_chosen=True)
    buffer.current().aggregator.seal()  # a batch queued, not written yet
    metrics_app.record("visit:c", client_chosen=True)
    assert "visit:c" not in client_keys()
    metrics_app.flush()
    assert len(written) == 1
    metrics_app.record("visit:c", client_chosen=True)
    assert client_keys() == ["visit:c"]
    assert buffer.stats()["client_keys"] == 1


def test_the_code_keeps_50_000_keys_of_the_buffer(clock: FrozenClock) -> None:
    assert (aggregator.MAX_BUFFERED_KEYS, aggregator.MAX_CLIENT_KEYS) == (350_000, 300_000)
    metrics_app.record("visit:0", client_chosen=True)
    held = buffer.current().aggregator
    assert (held.max_keys, held.max_client_keys) == (350_000, 300_000)


def test_count_visits_names_from_the_url_are_client_chosen(
    site: None, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aggregator, "MAX_CLIENT_KEYS", 1)
    Client().get("/page/one/")
    Client().get("/page/two/")

    @count_visits(series="hello")  # one fixed name: the code's
    def hello(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    hello(HttpRequest())
    assert sorted(client_keys()) == ["hello", "page:one"]
    assert buffer.stats()["client_keys"] == 1


def test_only_counts_the_names_that_exist(site: None, clock: FrozenClock) -> None:
    http = Client()
    for slug in ["home", "nope", "home", "about", "made-up"]:
        assert http.get(f"/known/{slug}/").status_code == 200
    counts = {name: n for (name, _), n in buffer.current().aggregator.live_counts().items()}
    assert counts == {"known:home": 2, "known:about": 1}


@pytest.mark.parametrize("prefix", ["async", "async-sync-only"])
async def test_only_on_an_async_view(site: None, clock: FrozenClock, prefix: str) -> None:
    from django.test import AsyncClient

    http = AsyncClient()
    for slug in ["home", "nope", "about"]:
        assert (await http.get(f"/{prefix}/{slug}/")).status_code == 200
    assert sorted(client_keys()) == [f"{prefix}:about", f"{prefix}:home"]


def test_an_async_only_on_a_sync_view_is_refused_at_once() -> None:
    with pytest.raises(TypeError, match="coroutine function"):

        @count_visits(series="x:{k}", only=_exists)
        def view(request: HttpRequest, k: str) -> HttpResponse:
            return HttpResponse()
