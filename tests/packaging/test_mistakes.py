"""A new user's usual mistakes, each made in a copy of the README's project, each answered by
a message that says what is wrong and what to write instead.

The project is the session's ``project`` (tests/packaging/conftest.py: the built wheel in a
venv, ``startproject``, the README's settings and view). Each case appends its mistake to a
copy's ``settings.py`` or ``views.py`` and runs one command in that venv: ``manage.py check``
(``check --deploy`` for the unreachable counter server), or loading the WSGI application for
the middleware that only fails when the server starts. The assertions are the words that name
the fix, not just a failing exit status.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.packaging.conftest import Project, outcome
from tests.servers.processes import free_port

CHECK = ("manage.py", "check")
WSGI = ("-c", "import proj.wsgi")  # what a server does first: build the middleware
RL_MIDDLEWARE = "ratelimit_app.middleware.RatelimitMiddleware"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"


@dataclass(frozen=True)
class Mistake:
    """Lines appended to the copy's ``settings.py`` (``{closed}``: a loopback address where
    nothing listens) and ``views.py``; the arguments of ``python -W error``; whether the
    command must fail (an error, not a warning); the words it must print."""

    says: tuple[str, ...]
    settings: str = ""
    views: str = ""
    argv: tuple[str, ...] = CHECK
    fails: bool = False


MISTAKES = {
    # The counters' server: the README's memcached is not running.
    "no memcached": Mistake(
        settings='CACHES["default"]["LOCATION"] = "{closed}"',
        # At CRITICAL: the newest Django reports the new project's console mailer as an
        # error of --deploy, which is not ours to judge here.
        argv=(*CHECK, "--deploy", "--fail-level", "CRITICAL"),
        says=(
            "ratelimit_app.W007",
            "Server {closed} of cache 'default'",
            "Start the server it names (memcached: `memcached -d`",
            "'django.core.cache.backends.locmem.LocMemCache'",
        ),
    ),
    # Settings and decorators that would otherwise do nothing, without a word.
    "RATELIMIT_RULE": Mistake(
        settings="RATELIMIT_RULE = RATELIMIT_RULES",
        says=(
            "ratelimit_app.W008",
            "RATELIMIT_RULE: did you mean RATELIMIT_RULES?",
            "Rename it RATELIMIT_RULES.",
        ),
    ),
    "RATELIMIT_FAILOPEN": Mistake(
        settings="RATELIMIT_FAILOPEN = True",
        says=(
            "ratelimit_app.W008",
            "RATELIMIT_FAILOPEN: did you mean RATELIMIT_FAIL_OPEN?",
            "Rename it RATELIMIT_FAIL_OPEN.",
        ),
    ),
    "url_name of nothing": Mistake(
        settings=(
            'RATELIMIT_RULES.append({"name": "by-name", "url_name": "admin:logn", "key": "ip", '
            '"rate": "5/m"})'
        ),
        says=(
            "ratelimit_app.W009",
            "Rule 'by-name', url_name 'admin:logn': did you mean 'admin:login'?",
            "Write the name= of a URL pattern, with its namespace",
        ),
    ),
    "no rate": Mistake(
        views='\n\n@ratelimit(key="ip")\ndef unlimited(request):\n    return HttpResponse()\n',
        says=(
            "ratelimit_app.W010",
            "proj.views.unlimited",
            "Give it a rate: @ratelimit(key='ip', rate='5/m')",
        ),
    ),
    "app not installed": Mistake(
        settings='INSTALLED_APPS.remove("ratelimit_app")',
        argv=WSGI,
        fails=True,
        says=(
            "ImproperlyConfigured: RatelimitMiddleware needs 'ratelimit_app' in "
            "INSTALLED_APPS: add it there",
            "then run `python manage.py migrate`",
        ),
    ),
    "middleware before auth": Mistake(
        settings=(
            f"MIDDLEWARE.remove({RL_MIDDLEWARE!r})\n"
            f"MIDDLEWARE.insert(MIDDLEWARE.index({AUTH_MIDDLEWARE!r}), {RL_MIDDLEWARE!r})\n"
            'RATELIMIT_RULES.append({"name": "peruser", "path": "/", "key": "user", '
            '"rate": "100/m"})'
        ),
        says=(
            "ratelimit_app.W004",
            "keyed on the user fall back to the IP. Rules keyed on the user: 'peruser'.",
            "Move RatelimitMiddleware after AuthenticationMiddleware in MIDDLEWARE.",
        ),
    ),
    "bare @ratelimit": Mistake(
        views="\n\n@ratelimit\ndef bare(request):\n    return HttpResponse()\n",
        fails=True,
        says=(
            "TypeError: @ratelimit on proj.views.bare has no parentheses: use "
            "@ratelimit(key=..., rate=...), e.g. @ratelimit(key='ip', rate='5/m').",
        ),
    ),
    # Settings of the wrong shape.
    "rules as a dict": Mistake(
        settings="RATELIMIT_RULES = RATELIMIT_RULES[0]",
        fails=True,
        says=(
            "ratelimit_app.E014",
            "RATELIMIT_RULES must be a list of rule dicts (got a dict): write "
            "RATELIMIT_RULES = [{...}, ...], one dict per rule.",
        ),
    ),
    "missing cache alias": Mistake(
        settings='RATELIMIT_USE_CACHE = "counters"',
        fails=True,
        says=(
            "ratelimit_app.E001",
            "RATELIMIT_USE_CACHE is 'counters', which is not in CACHES (it has 'default'): "
            "add a 'counters' cache to CACHES, or set RATELIMIT_USE_CACHE to one of those.",
        ),
    ),
    "empty CACHES": Mistake(
        settings="CACHES = {}",
        fails=True,
        says=(
            "ratelimit_app.E001",
            "RATELIMIT_USE_CACHE is 'default', but CACHES is empty: add a 'default' cache to "
            "CACHES, or set RATELIMIT_USE_CACHE to the alias of a cache that exists.",
        ),
    ),
}


def make(project: Project, mistake: Mistake, where: Path) -> Path:
    """A copy of ``project`` in ``where`` with ``mistake`` appended; its path."""
    copy = where / "proj"
    shutil.copytree(project.path, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for name, lines in (("settings.py", mistake.settings), ("views.py", mistake.views)):
        with (copy / "proj" / name).open("a", encoding="utf-8") as f:
            f.write(f"\n{lines}\n")
    return copy


@pytest.mark.parametrize("mistake", MISTAKES.values(), ids=list(MISTAKES))
def test_a_mistake_gets_the_message_that_names_the_fix(
    project: Project, mistake: Mistake, tmp_path: Path
) -> None:
    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    mistake = dataclasses.replace(
        mistake,
        settings=mistake.settings.replace("{closed}", closed),
        says=tuple(said.replace("{closed}", closed) for said in mistake.says),
    )
    copy = make(project, mistake, tmp_path)
    status, output = outcome([project.python, "-W", "error", *mistake.argv], cwd=copy)
    assert (status != 0) == mistake.fails, output
    for said in mistake.says:
        assert said in output, output
