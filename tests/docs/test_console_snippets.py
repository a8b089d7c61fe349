"""The docs' shell sessions against a site, run as printed: each ``$ python manage.py ...``
and ``$ curl ...`` of a console block is run (the command through ``call_command``, the
request through Django's test client) in the state the page describes, and prints what the
page prints, line for line."""

from __future__ import annotations

import io
import json
import re
import shlex
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.cache import caches
from django.core.management import call_command
from django.test import Client, override_settings
from django.utils import translation

from ratelimit_app import store
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.docs.snippets import DOCS
from tests.ratelimit.conftest import MIDDLEWARE

_CONSOLE = re.compile(r"^( *)\.\. code-block:: console\n", re.MULTILINE)


def sessions(page: str) -> list[list[tuple[str, str]]]:
    """Each console block of a page as ``(command, what it prints)`` pairs."""
    text = (DOCS / f"{page}.rst").read_text(encoding="utf-8")
    found = []
    for match in _CONSOLE.finditer(text):
        indent = len(match.group(1))
        body = []
        for line in text[match.end() :].splitlines():
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            body.append(line)
        pairs: list[tuple[str, list[str]]] = []
        for line in textwrap.dedent("\n".join(body)).strip("\n").splitlines():
            if line.startswith("$ "):
                pairs.append((line[2:], []))
            elif pairs and line:
                pairs[-1][1].append(line)
        found.append([(command, "\n".join(out) + "\n") for command, out in pairs])
    return found


def session(page: str, first: str) -> list[tuple[str, str]]:
    """The console block of ``page`` whose first command starts with ``first``."""
    matching = [s for s in sessions(page) if s and s[0][0].startswith(first)]
    assert len(matching) == 1, f"docs/{page}.rst: {len(matching)} sessions start {first!r}"
    return matching[0]


def manage(command: str) -> str:
    """``python manage.py NAME ARGS...`` through ``call_command``: what it prints."""
    argv = shlex.split(command)
    assert argv[:2] == ["python", "manage.py"], command
    out = io.StringIO()
    call_command(*argv[2:], stdout=out, stderr=io.StringIO())
    return out.getvalue()


RUNS_CONSOLE = [
    ("rules", "python manage.py ratelimit_usage login-email"),
    ("rules", "python manage.py ratelimit_usage hello"),
    ("rules", "curl -H"),
    ("operators", "python manage.py ratelimit_bans"),
]

LOGIN_EMAIL = {
    "name": "login-email",
    "path": "/login/",
    "methods": "POST",
    "key": "email:username",
    "rate": "5/m;10/d",
}
RULES_PAGE_SITE = {
    "MIDDLEWARE": MIDDLEWARE,
    "RATELIMIT_RULES": [LOGIN_EMAIL],
    "ROOT_URLCONF": "tests.docs.console_site",
}
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    store.forget()
    forget_refusals()
    caches["default"].clear()
    yield
    store.forget()
    forget_refusals()


def test_usage_and_reset_of_a_locked_out_account() -> None:
    """Five wrong passwords of Alice's, then the page's two commands."""
    (usage, printed_usage), (reset, printed_reset) = session(
        "rules", "python manage.py ratelimit_usage login-email"
    )
    at = 1_800_000_000.0 - 341  # the moment whose day bucket ends in 86,741 s
    with override_settings(**RULES_PAGE_SITE), frozen_clock(at):
        for _ in range(5):
            Client().post("/login/", {"username": "Alice@Example.com", "password": "wrong"})
        assert manage(usage) == printed_usage
        assert manage(reset) == printed_reset
        assert Client().post("/login/", {"username": "alice@example.com"}).status_code == 200


def test_usage_of_a_view_named_by_its_url_name(myapp: Path) -> None:
    """Two requests to ``hello`` (``@ratelimit(key="ip", rate="5/m")`` in
    ``myapp/views.py``), then the page's command."""
    ((usage, printed),) = session("rules", "python manage.py ratelimit_usage hello")
    with override_settings(ROOT_URLCONF="myapp.urls"), frozen_clock(1_800_000_000.0):
        for _ in range(2):
            Client().get("/hello/", REMOTE_ADDR="127.0.0.1")
        assert manage(usage) == printed


def test_the_429_in_german() -> None:
    """The page's request, the sixth in a minute from one account, asking for JSON in
    German: the problem document it prints."""
    ((command, printed),) = session("rules", "curl -H")
    argv = shlex.split(command)
    headers = dict(h.split(": ", 1) for h in argv[2:-1:2])
    site = {
        **RULES_PAGE_SITE,
        "MIDDLEWARE": [
            *MIDDLEWARE[:1],
            "django.middleware.locale.LocaleMiddleware",
            *MIDDLEWARE[1:],
        ],
        "RATELIMIT_RULES": [{**LOGIN_EMAIL, "methods": ["GET", "POST"]}],
    }
    # LocaleMiddleware leaves German active in this thread: translation.override restores.
    with override_settings(**site), frozen_clock(1.8e9) as clock, translation.override("en"):
        for _ in range(5):
            Client().get("/login/", {"username": "alice@example.com"})
        clock.advance(44)
        answer = Client().get(
            "/login/",
            {"username": "alice@example.com"},
            HTTP_ACCEPT=headers["Accept"],
            HTTP_ACCEPT_LANGUAGE=headers["Accept-Language"],
        )
    assert answer.status_code == 429
    assert json.loads(answer.content) == json.loads(printed)


def test_bans_listed_and_one_lifted() -> None:
    """A ban by ``login-ip`` and one by ``reset-email`` (docs/operators' rules, one strike
    apart), at 08:00 UTC on 15 January 2027: the page's two commands."""
    from tests.ratelimit import test_ban_commands as bans

    (listing, printed_list), (unban, printed_unban) = session(
        "operators", "python manage.py ratelimit_bans"
    )
    site = {
        "ROOT_URLCONF": bans.__name__,
        "MIDDLEWARE": MIDDLEWARE,
        "RATELIMIT_RULES": bans.RULES,
    }
    with override_settings(**site), frozen_clock(bans.T0):
        bans.banned("/login/", "203.0.113.7")
        bans.banned("/reset/", "203.0.113.8", email="alice@example.com")
        assert manage(listing) == printed_list
        assert manage(unban) == printed_unban


def test_every_session_that_runs_a_command_is_run() -> None:
    """A console block that runs a management command or asks the site is in
    :data:`RUNS_CONSOLE` (the set-up commands, ``make`` and ``pip``, are CI's own)."""
    found = []
    for path in sorted(DOCS.glob("*.rst")):
        for block in sessions(path.stem):
            if any(re.match(r"(python manage\.py|curl) ", command) for command, _ in block):
                found.append((path.stem, block[0][0]))
    covered = [
        (p, c) for p, c in found if any(p == q and c.startswith(f) for q, f in RUNS_CONSOLE)
    ]
    assert covered == found
    assert len(found) == len(RUNS_CONSOLE)


MYAPP_VIEWS = """
from django.http import HttpResponse

from ratelimit_app.decorators import ratelimit


@ratelimit(key="ip", rate="5/m")
def hello(request):
    return HttpResponse("hello")
"""
MYAPP_URLS = """
from django.urls import path

from myapp.views import hello

urlpatterns = [path("hello/", hello, name="hello")]
"""


@pytest.fixture
def myapp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The reader's app of the page: ``myapp.views.hello`` routed as ``hello``."""
    import sys

    package = tmp_path / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "views.py").write_text(MYAPP_VIEWS)
    (package / "urls.py").write_text(MYAPP_URLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [n for n in sys.modules if n == "myapp" or n.startswith("myapp.")]:
        del sys.modules[name]
