"""``manage.py ratelimit_bans`` and ``ratelimit_unban`` (issue "An operator's first day",
item 17): the bans in force listed as their rows keep them, never the subject itself, and a
ban lifted in every process; a limit named as the other commands name it."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from ratelimit_app import clock, store
from ratelimit_app.decorators import ratelimit
from ratelimit_app.management.commands import ratelimit_bans, ratelimit_unban
from ratelimit_app.models import Ban
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE

T0 = 1_800_000_000.0
HERE = __name__
BAN = {"after": 2, "within": "10m", "for": "1h"}


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(key="ip", rate="1/m", ban=BAN)
def search(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("login/", plain),
    path("reset/", plain),
    path("search/", search, name="search"),
]
RULES: list[dict[str, Any]] = [
    {"name": "login-ip", "path": "/login/", "key": "ip", "rate": "1/m", "ban": BAN},
    {
        "name": "reset-email",
        "path": "/reset/",
        "methods": ["POST"],
        "key": "email",
        "rate": "1/m",
        "ban": BAN,
    },
]

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    store.forget()
    caches["default"].clear()  # the counters of other tests
    forget_refusals()
    with (
        override_settings(ROOT_URLCONF=HERE, MIDDLEWARE=MIDDLEWARE, RATELIMIT_RULES=RULES),
        frozen_clock(T0),
    ):
        yield
    store.forget()
    forget_refusals()


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def banned(url: str, ip: str, **data: str) -> None:
    """Enough refused requests for a ban, and the ban's refusal."""
    client = Client()
    send = client.post if data else client.get
    statuses = [send(url, data, REMOTE_ADDR=ip).status_code for _ in range(4)]
    assert statuses[0] == 200 and statuses[-1] == 429
    forget_refusals()


def in_force() -> list[Ban]:
    now = dt.datetime.fromtimestamp(clock.now(), dt.UTC)
    return list(Ban.objects.filter(until__gt=now))


def test_bans_lists_each_ban_as_its_row_keeps_it() -> None:
    banned("/login/", "203.0.113.7")
    banned("/reset/", "203.0.113.8", email="alice@example.com")
    banned("/search/", "198.51.100.9")
    assert len(in_force()) == 3
    lines = run("ratelimit_bans").splitlines()
    assert lines[0].split() == ["limit", "subject", "kind", "where", "until", "left", "(s)"]
    rows = sorted(line.split() for line in lines[1:])
    until = "2027-01-15T09:00:00+00:00"
    assert rows == sorted(
        [
            ["login-ip", "203.0.113.0/24", "ip", "limit", until, "3600"],
            ["reset-email", "(hashed)", "email", "limit", until, "3600"],
            [f"{HERE}.search", "198.51.100.0/24", "ip", "limit", until, "3600"],
        ]
    )
    text = "\n".join(lines)
    for raw in ("203.0.113.7", "alice", "198.51.100.9"):
        assert raw not in text  # the subject itself: never


def test_bans_with_a_limit_names_it_as_the_other_commands_do() -> None:
    banned("/login/", "203.0.113.7")
    banned("/search/", "198.51.100.9")
    for name in ("search", "/search/", f"{HERE}.search"):
        (_header, row) = run("ratelimit_bans", "--limit", name).splitlines()
        assert row.startswith(f"{HERE}.search  198.51.100.0/24")
    assert run("ratelimit_bans", "--limit", "reset-email") == "No bans in force of reset-email.\n"


def test_bans_of_an_unknown_limit_is_a_command_error() -> None:
    with pytest.raises(CommandError, match=r"No rule named 'login-pi'.*Did you mean 'login-ip'"):
        run("ratelimit_bans", "--limit", "login-pi")


def test_a_full_label_is_shown_and_hashed_shows_none() -> None:
    with override_settings(RATELIMIT_REFUSED_SUBJECTS="full"):
        banned("/login/", "203.0.113.7")
    with override_settings(RATELIMIT_REFUSED_SUBJECTS="hashed"):
        banned("/search/", "198.51.100.9")
    rows = [line.split()[:2] for line in run("ratelimit_bans").splitlines()[1:]]
    assert sorted(rows) == [["login-ip", "203.0.113.7"], [f"{HERE}.search", "(hashed)"]]


@pytest.mark.usefixtures("backend_kind")
def test_unban_lifts_the_ban_in_every_process_and_keeps_the_counters() -> None:
    banned("/login/", "203.0.113.7")
    banned("/login/", "203.0.113.99")
    out = run("ratelimit_unban", "login-ip", "203.0.113.7")
    assert out == (
        "Lifted the ban of 203.0.113.0/24 (ip) by rule login-ip, until 2027-01-15 09:00:00 UTC.\n"
    )
    assert "203.0.113.7" not in out
    assert [b.label for b in in_force()] == ["203.0.113.0/24"]  # the other address's
    store.forget()  # as another process that reads the change
    client = Client()
    # No longer banned: refused at the rate (its counters are kept), not for an hour, and
    # not banned again by that refusal (the strikes toward the next ban are forgotten).
    response = client.get("/login/", REMOTE_ADDR="203.0.113.7")
    assert response.status_code == 429 and int(response["Retry-After"]) <= 61
    with pytest.raises(CommandError, match=r"No ban of this subject by rule login-ip"):
        run("ratelimit_unban", "login-ip", "203.0.113.7")


def test_unban_by_a_views_url_name_and_of_an_email() -> None:
    banned("/search/", "198.51.100.9")
    banned("/reset/", "203.0.113.8", email="alice@example.com")
    out = run("ratelimit_unban", "search", "198.51.100.9")
    assert out.startswith("Lifted the ban of 198.51.100.0/24 (ip) by group ")
    out = run("ratelimit_unban", "reset-email", "Alice@Example.com")
    assert out.startswith("Lifted the ban of (hashed) (email) by rule reset-email")
    assert "alice" not in out.lower()
    assert in_force() == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("login-pi", "203.0.113.7"), r"No rule named 'login-pi'.*Did you mean 'login-ip'"),
        (("login-ip", "not-an-ip"), r"'not-an-ip' is not an IP address"),
        (("login-ip", ""), r"The subject is empty"),
    ],
)
def test_unban_mistakes_are_command_errors(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        run("ratelimit_unban", *args)


@pytest.mark.parametrize("module", [ratelimit_bans, ratelimit_unban])
def test_help_keeps_its_examples(module: Any) -> None:
    name = module.__name__.rsplit(".", 1)[1]
    text = module.Command().create_parser("manage.py", name).format_help()
    assert f"\n  manage.py {name} " in text
