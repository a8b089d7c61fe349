"""Bans at a crowd's size (issue 35, items 4 and 6; docs/operators.rst, "Bans"): a new ban
costs every process one query of what changed, never a reload of every ban; bans are
bounded per process, never dropped early; ban rows keep of an address only what
``RATELIMIT_REFUSED_SUBJECTS`` shows, and go once their memory has passed."""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import path

from ratelimit_app import clock, store
from ratelimit_app.bans import applied as bans
from ratelimit_app.config import versions
from ratelimit_app.identity.sealing import unseal
from ratelimit_app.models import Ban, Override
from ratelimit_app.signals import ban_skipped
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE

T0 = 1_800_000_000.0
BAN = {"after": 1, "within": "10m", "for": "1h", "max": "4h"}


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("login/", plain), path("other/", plain)]
pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]
RULE = {"name": "login", "path": "/login/", "key": "ip", "rate": "1/m", "ban": BAN}


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    store.forget()
    forget_refusals()
    with override_settings(MIDDLEWARE=MIDDLEWARE, RATELIMIT_RULES=[RULE]):
        yield
    store.forget()
    forget_refusals()


def ban_rows(n: int, until: dt.datetime, site: bool = False) -> list[Ban]:
    """``n`` bans of nobody this test sends (random keys), as another process made them."""
    now = dt.datetime.fromtimestamp(clock.now(), dt.UTC)
    return [
        Ban(
            limit="login",
            site=site,
            key="{" + secrets.token_hex(16) + "}",
            kind="ip",
            seconds=3600,
            banned_at=now,
            until=until,
            remembered_until=until,
        )
        for _ in range(n)
    ]


def banned(client: Client, ip: str) -> bool:
    """Whether ``ip`` is refused for its ban (two requests: a 1/m limit refuses the second
    anyway, a ban the first)."""
    return client.get("/login/", REMOTE_ADDR=ip).status_code == 429


def look() -> Any:
    """What the next request's look at the configuration does, and its queries."""
    with CaptureQueriesContext(connection) as queries:
        snap = store.current()
    return snap, [q["sql"] for q in queries.captured_queries]


@pytest.mark.usefixtures("backend_kind")
def test_a_new_ban_costs_each_process_one_query_of_what_changed(client: Client) -> None:
    no_prune = mock.patch.object(bans, "_pruned", float("inf"))  # (once a minute: not now)
    with frozen_clock(T0), mock.patch.object(store, "CONFIG_REFRESH", 0), no_prune:
        later = dt.datetime.fromtimestamp(T0 + 3600, dt.UTC)
        Ban.objects.bulk_create(ban_rows(2000, later))
        snap = store.current()
        assert len(snap.bans) == 2000 and store.current().banning
        # Another process bans a subject: its row, and its bump of the shared counter.
        Ban.objects.bulk_create(ban_rows(1, later))
        versions.version_op(increment=True, which=versions.BANS)
        again, queries = look()
        assert again is snap and len(again.bans) == 2001
        assert len(queries) == 1 and '"changed" >=' in queries[0]
        # Nothing changed: no query at all.
        assert look()[1] == []


@pytest.mark.usefixtures("backend_kind")
def test_a_rule_change_keeps_the_bans_and_reads_none_of_them(client: Client) -> None:
    with frozen_clock(T0), mock.patch.object(store, "CONFIG_REFRESH", 0):
        later = dt.datetime.fromtimestamp(T0 + 3600, dt.UTC)
        Ban.objects.bulk_create(ban_rows(500, later))
        held = store.current().bans
        versions.version_op(increment=True)  # a rule saved elsewhere: everything else is read
        snap, queries = look()
        assert snap.bans is held and not any("ratelimit_app_ban" in q for q in queries)


@pytest.mark.usefixtures("backend_kind")
def test_a_lift_and_a_deleted_ban_reach_every_process(client: Client) -> None:
    with frozen_clock(T0) as at, mock.patch.object(store, "CONFIG_REFRESH", 0):
        assert [banned(client, "192.0.2.1") for _ in range(3)] == [False, True, True]
        row = Ban.objects.get()
        assert row.key in store.current().bans.rule
        assert bans.lift_rows(Ban.objects.all()) == 1  # the admin's delete
        assert row.key not in store.current().bans.rule
        at.advance(61)  # (a lift is no reset: the 1/m counter still holds the last minute)
        assert not banned(client, "192.0.2.1")
        Ban.objects.all().delete()  # a lifted row goes without a reload of the bans
        assert banned(client, "192.0.2.1")  # 1/m, and banned again (after 1)
        held = store.current().bans
        assert len(held) == 1
        Ban.objects.all().delete()  # one in force deleted: every process reads them again
        assert store.current().bans is not held and not store.current().bans


@pytest.mark.usefixtures("backend_kind")
def test_at_the_bound_no_ban_is_made_and_none_is_dropped(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    skipped: list[dict[str, Any]] = []

    def receive(sender: Any, **kwargs: Any) -> None:
        skipped.append(kwargs)

    ban_skipped.connect(receive)
    try:
        with (
            frozen_clock(T0),
            mock.patch.object(store, "CONFIG_REFRESH", 0),
            mock.patch.object(bans, "MOST", 3),
            mock.patch.object(store, "MOST_BANS", 3),
            caplog.at_level(logging.ERROR, logger="ratelimit_app"),
        ):
            for i in range(1, 4):
                client.get("/login/", REMOTE_ADDR=f"192.0.2.{i}")
                assert banned(client, f"192.0.2.{i}")
            assert Ban.objects.count() == 3
            for i in range(4, 6):  # past the bound: refused at the rate, not banned
                assert [banned(client, f"192.0.2.{i}") for _ in range(3)] == [False, True, True]
            assert Ban.objects.count() == 3
            assert all(banned(client, f"192.0.2.{i}") for i in range(1, 4))  # none dropped
    finally:
        ban_skipped.disconnect(receive)
    assert len(skipped) >= 2 and skipped[0]["limit"] == "login"
    logged = [r for r in caplog.records if "the most a process holds" in r.getMessage()]
    assert len(logged) == 1  # once, not per refusal


@pytest.mark.parametrize(
    ("how", "label"),
    [("masked", "192.0.2.0/24"), ("full", "192.0.2.77"), ("hashed", ""), ("nonsense", "")],
)
@pytest.mark.usefixtures("backend_kind")
def test_a_ban_row_keeps_what_the_privacy_setting_shows(
    client: Client, how: str, label: str
) -> None:
    with override_settings(RATELIMIT_REFUSED_SUBJECTS=how), frozen_clock(T0):
        assert [banned(client, "192.0.2.77") for _ in range(2)] == [False, True]
    row = Ban.objects.get()
    assert row.label == label and "192.0.2.77" not in row.key


def test_a_ban_row_goes_once_its_memory_has_passed(client: Client) -> None:
    with frozen_clock(T0) as at:
        assert [banned(client, "192.0.2.9") for _ in range(2)] == [False, True]
        row = Ban.objects.get()
        assert row.remembered_until.timestamp() == T0 + 3600 + 4 * 3600
        at.advance(3600 + 4 * 3600 - 1)
        assert bans.prune(force=True) == 0  # remembered: a new ban would double
        at.advance(2)
        assert bans.prune(force=True) == 1
        assert not Ban.objects.exists()


def test_a_year_later_no_row_keeps_the_address(client: Client) -> None:
    """Pruned as the processes look for changes (at most once a minute each), not only
    when another ban is made."""
    with frozen_clock(T0) as at, mock.patch.object(store, "CONFIG_REFRESH", 0):
        assert [banned(client, "192.0.2.10") for _ in range(2)] == [False, True]
        at.advance(366 * 86400)
        with mock.patch.object(bans, "_pruned", -float("inf")):
            versions.version_op(increment=True, which=versions.OVERRIDES)  # anything changed
            client.get("/other/", REMOTE_ADDR="198.51.100.1")
        assert not Ban.objects.exists()


@pytest.mark.usefixtures("backend_kind")
def test_an_override_saved_elsewhere_costs_one_query_and_expires_without_a_reload(
    client: Client,
) -> None:
    no_prune = mock.patch.object(bans, "_pruned", float("inf"))
    with mock.patch.object(store, "CONFIG_REFRESH", 0), no_prune:
        Override.objects.bulk_create(
            [
                Override(limit="login", subject=f"198.51.{i // 256}.{i % 256}", rate="5/m")
                for i in range(300)
            ]
        )
        snap = store.current()
        assert len(snap.override_rows) == 300
        soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)
        Override.objects.bulk_create(
            [Override(limit="login", subject="192.0.2.50", rate="unlimited", expires=soon)]
        )
        versions.version_op(increment=True, which=versions.OVERRIDES)
        again, queries = look()
        assert again is snap and len(queries) == 1 and len(again.override_rows) == 301
        assert [client.get("/login/", REMOTE_ADDR="192.0.2.50").status_code for _ in range(3)] == [
            200
        ] * 3
        with mock.patch("time.time", return_value=soon.timestamp() + 1):
            expired, queries = look()
        assert expired is snap and queries == [] and len(expired.override_rows) == 300


def test_the_table_keeps_at_most_the_bound_of_ended_bans_remembered() -> None:
    """Ended bans whose memory lasts (a day, a week) would grow the table under a botnet:
    past the most a process holds, the oldest ended ones are forgotten."""
    with frozen_clock(T0), mock.patch.object(bans, "MOST_BANS", 2):
        now = dt.datetime.fromtimestamp(T0, dt.UTC)
        rows = ban_rows(4, now)
        for i, row in enumerate(rows):  # ended 4, 3, 2 and 1 hours ago, remembered a day
            row.until = now - dt.timedelta(hours=4 - i)
            row.remembered_until = now + dt.timedelta(days=1)
        Ban.objects.bulk_create(rows)
        Ban.objects.bulk_create(ban_rows(3, now + dt.timedelta(hours=1)))  # in force: kept
        assert bans.prune(force=True) == 2
        kept = set(Ban.objects.values_list("key", flat=True))
        assert {r.key for r in rows[2:]} <= kept and not {r.key for r in rows[:2]} & kept
        assert len(kept) == 5


@pytest.mark.usefixtures("backend_kind")
def test_a_ban_on_every_path_is_found_by_its_sealed_address(client: Client) -> None:
    """A ban on every path is looked for on every request: by the address itself (sealed
    in its row, unsealed by each process), never by a hash made per request."""
    site = {**RULE, "ban": {**BAN, "scope": "site"}}
    with (
        override_settings(RATELIMIT_RULES=[site], RATELIMIT_REFUSED_SUBJECTS="hashed"),
        frozen_clock(T0),
    ):
        assert [banned(client, "192.0.2.33") for _ in range(2)] == [False, True]
        row = Ban.objects.get()
        assert row.site and row.label == "" and "192.0.2.33" not in row.sealed
        assert unseal(row.sealed) == "192.0.2.33"
        assert "192.0.2.33" in store.current().bans.site
        assert client.get("/other/", REMOTE_ADDR="192.0.2.33").status_code == 429
        assert client.get("/other/", REMOTE_ADDR="192.0.2.34").status_code == 200
        Ban.objects.update(sealed="v1:" + "00" * 30)  # unreadable (another SECRET_KEY)
        store.forget()
        assert not store.current().bans.site


@pytest.mark.db_matrix
def test_the_changed_rows_are_read_as_the_orm_reads_them() -> None:
    """A look reads the rows changed since a time with SQL compiled once
    (:func:`store.changed_since`): the same rows, converted alike (aware times, booleans),
    as the ORM's own query, on SQLite and PostgreSQL; and the SQL is made once."""
    now = dt.datetime.fromtimestamp(clock.now(), dt.UTC)
    Ban.objects.bulk_create(ban_rows(3, now + dt.timedelta(hours=1), site=True))
    Ban.objects.bulk_create(ban_rows(2, now + dt.timedelta(hours=2)))
    Override.objects.create(limit="login", subject="192.0.2.9", rate="10/m")
    Ban.objects.filter(site=False).update(changed=now - dt.timedelta(days=1))  # (not read)
    since = now - dt.timedelta(hours=1)
    for model, fields in ((Ban, store.BAN_FIELDS), (Override, store.OVERRIDE_FIELDS)):
        orm = list(model.objects.filter(changed__gte=since).values_list(*fields))
        with mock.patch.object(store, "_changed_query", wraps=store._changed_query) as made:
            found = store.changed_since(model, fields, since)
            again = store.changed_since(model, fields, since)
        assert sorted(found, key=repr) == sorted(orm, key=repr) == sorted(again, key=repr)
        assert made.call_count <= 1  # (made once; none when an earlier look made it)
        for row in found:
            for value in row:
                assert not isinstance(value, dt.datetime) or value.tzinfo is not None
    assert len(store.changed_since(Ban, store.BAN_FIELDS, since)) == 3
    assert {row[2] for row in store.changed_since(Ban, store.BAN_FIELDS, since)} == {True}
