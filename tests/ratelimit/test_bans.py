"""Escalating bans (docs/operators.rst, "Bans"): a rule's ``"ban"``, ``@ratelimit(ban=...)``
and a DRF throttle's ``ban``, on local memory, real memcached and real Redis."""

from __future__ import annotations

import datetime as dt
import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from ratelimit_app import clock, core, store
from ratelimit_app.config import bans, rules
from ratelimit_app.decorators import ratelimit
from ratelimit_app.models import Ban, Rule
from ratelimit_app.signals import subject_banned
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE, RoundTrips

T0 = 1_800_000_000.0
BAN = {"after": 3, "within": "10m", "for": "1h", "max": "4h"}


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(
    group="banning-view", key="ip", rate="1/m", ban={"after": 2, "within": "1h", "for": "10m"}
)
def decorated(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("login/", plain), path("other/", plain), path("decorated/", decorated)]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]
on_every_backend = pytest.mark.usefixtures("backend_kind")


def rule(**fields: Any) -> dict[str, Any]:
    return {"name": "login", "path": "/login/", "key": "ip", "rate": "2/m", "ban": BAN, **fields}


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    store.forget()
    forget_refusals()
    with override_settings(MIDDLEWARE=MIDDLEWARE):
        yield
    store.forget()
    forget_refusals()


@pytest.fixture
def banned() -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def receive(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    subject_banned.connect(receive)
    yield sent
    subject_banned.disconnect(receive)


def answers(client: Client, path: str, n: int, ip: str = "192.0.2.1") -> list[tuple[int, int]]:
    """(status, Retry-After) of ``n`` requests."""
    found = []
    for _ in range(n):
        r = client.get(path, REMOTE_ADDR=ip)
        found.append((r.status_code, int(r.get("Retry-After", 0))))
    return found


# -- the spec --------------------------------------------------------------------------------


def test_each_ban_doubles_up_to_the_longest() -> None:
    spec = bans.parse_ban(BAN)
    assert (spec.after, spec.within, spec.seconds, spec.most) == (3, 600, 3600, 4 * 3600)
    lengths, last = [], None
    for _ in range(4):
        last = bans.next_seconds(spec, last, 0 if last else None)
        lengths.append(last)
    assert lengths == [3600, 7200, 14400, 14400]
    assert bans.next_seconds(spec, 14400, 4 * 3600) == 3600  # forgotten after the longest


@pytest.mark.parametrize(
    ("ban", "words"),
    [
        ({"after": 3, "within": "10m"}, "'for' is missing"),
        ({"after": 0, "within": "10m", "for": "1h"}, "integer from 1"),
        ({"after": 3, "within": "10m", "for": "1h", "max": "30m"}, "at least the first"),
        ({"after": 3, "within": "10m", "for": "forever"}, "Ban 'for' 'forever'"),
        ({"after": 3, "within": "10m", "for": "1h", "scope": "world"}, "'rule'"),
        ({"after": 3, "within": "10m", "for": "1h", "until": "1d"}, "unknown"),
        ("3 strikes", "expected a dict"),
    ],
)
def test_a_bad_ban_names_what_is_wrong(ban: Any, words: str) -> None:
    raw = rule(ban=ban)
    with pytest.raises(rules.RuleError) as caught:
        rules.parse_rule(raw)
    assert any(e.field == "ban" and words in e.problem for e in caught.value.errors)


def test_a_site_wide_ban_takes_an_address() -> None:
    with pytest.raises(ImproperlyConfigured, match="keyed on 'ip'"):
        rules.parse_rule(rule(key="email", ban={**BAN, "scope": "site"}))


def test_a_database_rule_takes_a_ban_in_its_fields() -> None:
    row = Rule(name="db", path="/login/", key="ip", rate="2/m", ban_after=3, ban_within="10m")
    row.ban_for = "forever"
    with pytest.raises(Exception, match="forever") as caught:
        row.clean()
    assert "ban_after" in caught.value.message_dict  # type: ignore[attr-defined]
    row.ban_for, row.ban_max, row.ban_site = "1h", "1d", True
    row.clean()
    assert rules.parse_rule(row.as_dict(), trusted=False).limit.ban == bans.BanSpec(
        3, 600, 3600, 86400, True
    )


# -- a rule bans ------------------------------------------------------------------------------


@on_every_backend
def test_the_refusal_that_reaches_after_bans_for_for(
    client: Client,
    banned: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with override_settings(RATELIMIT_RULES=[rule()]), frozen_clock(T0) as clock:
        with caplog.at_level(logging.WARNING, logger="ratelimit_app"):
            first = answers(client, "/login/", 5)
        assert [s for s, _ in first] == [200, 200, 429, 429, 429]
        assert first[2][1] <= 61 and first[4][1] == 3600  # the third refusal bans
        assert len(banned) == 1 and banned[0]["seconds"] == 3600 and banned[0]["limit"] == "login"
        assert "login banned ip" in caplog.text and "192.0.2.1" not in caplog.text
        answers(client, "/login/", 1)  # the snapshot with the ban is loaded
        trips = RoundTrips(monkeypatch)
        clock.advance(120)  # the window is empty again: the ban holds
        later = answers(client, "/login/", 3)
        assert later == [(429, 3480)] * 3 and trips.count == 0  # from the snapshot
        assert answers(client, "/login/", 1, ip="192.0.2.2") == [(200, 0)]
        usage = core.lookup("login", "192.0.2.1")
        assert usage is not None and usage["ban_seconds"] == 3600
        clock.advance(3480)
        assert answers(client, "/login/", 1) == [(200, 0)]  # the ban is over
    assert len(banned) == 1  # once per ban, not per banned request


@on_every_backend
def test_a_subject_banned_again_is_banned_twice_as_long(
    client: Client, banned: list[dict[str, Any]]
) -> None:
    with override_settings(RATELIMIT_RULES=[rule()]), frozen_clock(T0) as clock:
        lengths = []
        for _ in range(4):
            found = answers(client, "/login/", 5)
            lengths.append(found[-1][1])
            clock.advance(found[-1][1] + 1)
            forget_refusals()
    assert lengths == [3600, 7200, 14400, 14400]
    assert [b["seconds"] for b in banned] == lengths


@on_every_backend
def test_a_reset_lifts_a_ban(client: Client) -> None:
    with override_settings(RATELIMIT_RULES=[rule()]), frozen_clock(T0):
        assert answers(client, "/login/", 5)[-1] == (429, 3600)
        assert core.reset("login", "192.0.2.1")
        assert not in_force()
        assert answers(client, "/login/", 1) == [(200, 0)]


def in_force() -> list[Ban]:
    """The ban rows in force or remembered (a lifted one is kept, ended, until pruned)."""
    now = dt.datetime.fromtimestamp(clock.now(), dt.UTC)
    return list(Ban.objects.filter(remembered_until__gt=now))


@pytest.mark.parametrize("how", ["operations", "command"])
@on_every_backend
def test_a_reset_forgets_the_strikes_and_the_escalation(client: Client, how: str) -> None:
    """docs/operators: after a reset "the next ban is a first one", and it needs every
    strike again: two refusals after a reset are no ban, the third is one of the first
    length (not twice the last)."""
    with override_settings(RATELIMIT_RULES=[rule()]), frozen_clock(T0) as at:
        assert answers(client, "/login/", 5)[-1] == (429, 3600)
        at.advance(3601)  # the ban ended, its memory (and the strikes' window) did not
        forget_refusals()
        if how == "command":
            call_command("ratelimit_reset", "login", "192.0.2.1", stdout=io.StringIO())
        else:
            assert core.reset("login", "192.0.2.1")
        forget_refusals()
        found = answers(client, "/login/", 4)
        assert [status for status, _ in found] == [200, 200, 429, 429]
        assert found[-1][1] <= 61 and not in_force()  # refused at 2/m, not banned
        assert answers(client, "/login/", 1)[-1] == (429, 3600)  # a first ban again


@on_every_backend
def test_a_site_wide_ban_refuses_every_path(client: Client) -> None:
    site = rule(ban={**BAN, "scope": "site"})
    with override_settings(RATELIMIT_RULES=[site]), frozen_clock(T0):
        answers(client, "/login/", 5)
        assert answers(client, "/other/", 1) == [(429, 3600)]
        assert answers(client, "/other/", 1, ip="192.0.2.2") == [(200, 0)]
        assert answers(client, "/other/", 1, ip="::ffff:192.0.2.1") == [(429, 3600)]


@on_every_backend
def test_a_rule_ban_stays_on_its_paths(client: Client) -> None:
    with override_settings(RATELIMIT_RULES=[rule()]), frozen_clock(T0):
        answers(client, "/login/", 5)
        assert answers(client, "/other/", 1) == [(200, 0)]


@on_every_backend
def test_a_dry_run_never_bans(client: Client, banned: list[dict[str, Any]]) -> None:
    with override_settings(RATELIMIT_RULES=[rule(shadow=True)]), frozen_clock(T0):
        assert [s for s, _ in answers(client, "/login/", 8)] == [200] * 8
    assert banned == [] and not Ban.objects.exists()


@on_every_backend
def test_a_decorator_bans(client: Client, banned: list[dict[str, Any]]) -> None:
    with frozen_clock(T0):
        found = answers(client, "/decorated/", 4)
    assert found[:2] == [(200, 0), (429, found[1][1])]
    assert found[2:] == [(429, 600), (429, 600)]
    assert banned[0]["limit"] == "banning-view"


@on_every_backend
def test_a_throttle_bans(banned: list[dict[str, Any]]) -> None:
    pytest.importorskip("rest_framework")
    from ratelimit_app import throttling
    from tests.drf.conftest import api_view, get

    throttle = type(
        "Banning",
        (throttling.AnonRateThrottle,),
        {"scope": "banning", "rate": "1/m", "ban": {"after": 2, "within": "1h", "for": "10m"}},
    )
    view = api_view(throttle)
    with frozen_clock(T0):
        found = [get(view, ip="198.51.100.7") for _ in range(4)]
    assert [a.status_code for a in found] == [200, 429, 429, 429]
    assert found[-1]["Retry-After"] == "600"
    assert banned[0]["limit"] == "drf:banning"


@on_every_backend
def test_without_the_middleware_a_decorator_bans_and_takes_overrides(client: Client) -> None:
    """The checks keep the configuration fresh themselves (bans, overrides) when
    RatelimitMiddleware is not installed: Ratelimited is then django-ratelimit's 403."""
    from ratelimit_app.models import Override

    plain = ["django.contrib.sessions.middleware.SessionMiddleware"]
    with override_settings(MIDDLEWARE=plain), frozen_clock(T0) as clock:
        assert [s for s, _ in answers(client, "/decorated/", 3)] == [200, 403, 403]
        clock.advance(120)  # the window is empty again: the ban holds
        assert [s for s, _ in answers(client, "/decorated/", 2)] == [403, 403]
        assert Ban.objects.count() == 1
        Override.objects.create(limit="banning-view", subject="192.0.2.3", rate="5/m")
        assert [s for s, _ in answers(client, "/decorated/", 3, ip="192.0.2.3")] == [200] * 3


@on_every_backend
def test_ratelimit_reset_and_usage_show_and_lift_a_ban(client: Client) -> None:
    from io import StringIO

    from django.core.management import call_command

    with override_settings(RATELIMIT_RULES=[rule()]), frozen_clock(T0):
        answers(client, "/login/", 5)
        shown = StringIO()
        call_command("ratelimit_usage", "login", "192.0.2.1", "--json", stdout=shown)
        assert '"ban_seconds": 3600' in shown.getvalue()
        table = StringIO()
        call_command("ratelimit_usage", "login", "192.0.2.1", stdout=table)
        assert "Banned until 2027-01-15T09:00:00+00:00 (a ban of 3600 s)" in table.getvalue()
        call_command("ratelimit_reset", "login", "192.0.2.1", stdout=StringIO())
        assert not in_force()
        assert answers(client, "/login/", 1) == [(200, 0)]


@on_every_backend
def test_get_usage_and_is_ratelimited_take_a_ban_and_a_dry_run(rf: Any) -> None:
    request = rf.get("/", REMOTE_ADDR="192.0.2.77")
    ban = {"after": 2, "within": "1h", "for": "10m"}
    args: dict[str, Any] = {"key": "ip", "rate": "1/m", "ban": ban, "increment": True}
    # No middleware: the checks keep the configuration (and its bans) fresh themselves.
    with override_settings(MIDDLEWARE=[]), frozen_clock(T0) as clock:
        found = [core.get_usage(request, "g-banning", **args) for _ in range(3)]
        assert [u["should_limit"] for u in found if u] == [False, True, True]
        assert found[2] is not None and found[2]["retry_after"] == 600
        clock.advance(120)
        assert core.is_ratelimited(request, "g-banning", **args)  # banned, the window empty
        dry = {**args, "ban": None, "shadow": True}
        usages = [core.get_usage(request, "g-dry", **dry) for _ in range(2)]
    assert usages[1] is not None and not usages[1]["should_limit"]
    assert usages[1]["shadow_limited"]
