"""The docs' settings snippets, as a reader pastes them into settings.py.

Each passes our system checks; where it names a counter server on this machine, the address
is pointed at the session's own server and ``check --deploy`` (which asks the servers) finds
it, and a limit counts through it. Each rule a snippet prints refuses the request its rate
says, at the door it names (its path or URL name, its methods, failures only where it says
so): the first ``n`` requests pass and the next is 429, or none is for a dry run.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core import checks
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import include, path, re_path, reverse
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from ratelimit_app import store, throttling
from ratelimit_app.core import get_usage
from ratelimit_app.decorators import ratelimit
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.docs.conftest import module_and_settings
from tests.docs.snippets import Snippet, snippet

OURS = ("ratelimit_app.", "metrics_app.")
MEMCACHED = "django.core.cache.backends.memcached.PyMemcacheCache"
LOCAL_MEMORY = frozenset({"ratelimit_app.W001", "metrics_app.W001"})  # "fine for development"


@dataclass(frozen=True)
class Case:
    page: str
    index: int
    needles: tuple[str, ...]
    #: Our warnings the snippet earns, by id (a local-memory cache's, say).
    expected: frozenset[str] = frozenset()
    #: A snippet the page shows first, which this one changes.
    after: tuple[str, int] | None = None

    @property
    def id(self) -> str:
        return f"{self.page}-{self.index}"


CASES = [
    Case("README", 1, ("LocMemCache",), LOCAL_MEMORY),
    Case("backends", 0, ("PyMemcacheCache", "127.0.0.1:11211")),
    Case("backends", 1, ("max_pool_size", 'RATELIMIT_USE_CACHE = "ratelimit"')),
    Case("backends", 2, ("django_redis", "SOCKET_TIMEOUT")),
    Case("backends", 3, ("RedisClusterBackend",)),
    Case("backends", 4, ("MAX_ENTRIES",), LOCAL_MEMORY),
    Case("deployment", 0, ('"ratelimit": {  # the counters', "CELERY_BROKER_URL")),
    Case("deployment", 1, ('CACHES["ratelimit"]',), after=("deployment", 0)),
    Case("drf", 0, ("DEFAULT_THROTTLE_CLASSES", '"user": "10/m;1000/d"')),
    Case("drf", 1, ('"login-pair"', "RATELIMIT_FAILURE_STATUSES = [401, 404]")),
    Case("migrating", 0, ('# "django_ratelimit"',)),
    Case("operators", 0, ('"cost": 5',)),
    Case("operators", 4, ('"concurrent": 3', "def generate_pdf")),
    Case("operators", 6, ('"shadow": True', "class SearchThrottle")),
    Case("quickstart", 0, ('"ratelimit_app.middleware.RatelimitMiddleware"', "CACHES")),
    Case("quickstart", 1, ("LocMemCache",), LOCAL_MEMORY),
    Case("ratelimit", 12, ('"ratelimit_app.middleware.RatelimitMiddleware"',)),
    Case("rules", 0, ('"login-ip"', '"20/m;200/d"')),
    Case("rules", 1, ("# right after authentication",)),
    Case("rules", 3, ("RATELIMIT_ALLOW", "RATELIMIT_DENY")),
    Case("rules", 6, ('"login-pair"', '"chat:send"')),
    Case("rules", 8, ('"algorithm": "leaky_bucket"', '"device"')),
    Case("security", 0, ("RATELIMIT_TRUSTED_PROXIES",)),
    Case("security", 1, ("HTTP_X_REAL_IP",)),
    Case("settings", 0, ("RATELIMIT_FAIL_OPEN = True",)),
    Case("settings", 3, ('"signup"', '"login-ip"')),
]
RUNS = [(case.page, case.index) for case in CASES]


# -- the site the rules guard ----------------------------------------------------------------


def answer(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    """Any door: answers the status the test asks for (a failure, or 200)."""
    return HttpResponse("answered", status=int(request.headers.get("X-Answer", "200")))


def throttled_api(request: HttpRequest) -> Any:
    """An API view with DRF's default throttles as the settings in force name them."""

    class Api(APIView):
        throttle_classes = api_settings.DEFAULT_THROTTLE_CLASSES

        def get(self, request: Any) -> Response:
            return Response({"ok": True})

    return Api.as_view()(request)


chat = ([path("", answer, name="send")], "chat")
urlpatterns = [
    path("accounts/login/", answer, name="login"),
    path("chat/", include(chat)),
    path("drf/", throttled_api),
    re_path(r"^", answer),
]
pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    store.forget()
    forget_refusals()
    yield
    store.forget()
    forget_refusals()


# -- running a snippet -----------------------------------------------------------------------


def servers_here(code: str, request: pytest.FixtureRequest) -> tuple[str, bool]:
    """The snippet with the servers it names on this machine replaced by the session's."""
    local = False
    if "127.0.0.1:11211" in code:
        code = code.replace("127.0.0.1:11211", request.getfixturevalue("memcached_server"))
        local = True
    if "redis://127.0.0.1:6379" in code:
        redis = request.getfixturevalue("redis_server").rsplit("/", 1)[0]
        code = code.replace("redis://127.0.0.1:6379", redis)
        local = True
    return code, local


def settings_of(case: Case, request: pytest.FixtureRequest) -> tuple[dict[str, Any], bool]:
    """What the snippet sets (after the one it changes), and whether it names local servers."""
    names: dict[str, Any] = {
        "__name__": f"docs_{case.page}",
        "os": importlib.import_module("os"),
        "ratelimit": ratelimit,
        "AnonRateThrottle": throttling.AnonRateThrottle,
    }
    local = False
    for page, index in filter(None, (case.after, (case.page, case.index))):
        mine = (page, index) == (case.page, case.index)
        shown: Snippet = snippet(page, index, *(case.needles if mine else ()))
        code = shown.code
        if code.startswith("# myproject/"):
            code = module_and_settings(code)[1]
        code, here = servers_here(code, request)
        local = local or here
        exec(compile(code, shown.where, "exec"), names)  # (our own docs)
    found = {name: value for name, value in names.items() if name.isupper()}
    counters = found.get("CACHES", {}).get(found.get("RATELIMIT_USE_CACHE", "default"), {})
    local = local and "127.0.0.1" in str(counters.get("LOCATION"))
    if "CACHES" in found:
        shown_caches = {k: v for k, v in found["CACHES"].items() if v != {...}}
        found["CACHES"] = {**settings.CACHES, **shown_caches}  # "default": {...} is yours
    return found, local


def installable(apps: list[str]) -> None:
    """An ``INSTALLED_APPS`` snippet lists apps that import, ours among the test site's."""
    for name in apps:
        importlib.import_module(name)
        if name.split(".")[0] in ("ratelimit_app", "metrics_app"):
            assert name in settings.INSTALLED_APPS


def our_messages(deploy: bool) -> list[checks.CheckMessage]:
    found = checks.run_checks(include_deployment_checks=deploy)
    return [m for m in found if m.id and m.id.startswith(OURS)]


def counts_through_the_cache() -> list[int]:
    """Two hits of a limit through the counters' cache in force."""
    req = RequestFactory().get("/", REMOTE_ADDR="203.0.113.50")
    group = f"docs-{next(_groups)}"
    return [
        get_usage(req, group=group, key="ip", rate="5/m", increment=True)["count"]  # type: ignore[index]
        for _ in range(2)
    ]


_groups = itertools.count()
_moments = itertools.count()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_snippet_passes_the_checks(
    case: Case, request: pytest.FixtureRequest, myproject: Path
) -> None:
    """Our system checks accept it (``--deploy`` asks the servers it names here); an
    ``INSTALLED_APPS`` snippet names apps that import."""
    found, local = settings_of(case, request)
    apps = found.pop("INSTALLED_APPS", None)
    if apps is not None:
        installable(apps)
    # A site with a shared cache, which the snippet changes or not.
    shared = {"BACKEND": MEMCACHED, "LOCATION": request.getfixturevalue("memcached_server")}
    found.setdefault("CACHES", {"default": shared})
    found["CACHES"] = {**found["CACHES"], "default": found["CACHES"].get("default", shared)}
    if found["CACHES"]["default"] == settings.CACHES["default"]:  # the page left it to you
        found["CACHES"]["default"] = shared
    with override_settings(**found):
        messages = our_messages(deploy=local)
        assert {m.id for m in messages} == case.expected, messages
        if local:
            assert counts_through_the_cache() == [1, 2]


# -- the rules, each at its door -------------------------------------------------------------

RULED = [case for case in CASES if '"rate"' in snippet(case.page, case.index).code]


def limit_of(rule: dict[str, Any]) -> int:
    """How many requests the rule admits at once: its tightest rate (a leaky bucket's burst),
    in units of its cost."""
    if rule.get("algorithm") == "leaky_bucket":
        allowed = int(rule["burst"])
    else:
        allowed = min(int(rate.split("/")[0]) for rate in rule["rate"].split(";"))
    return allowed // int(rule.get("cost", 1))


def door(rule: dict[str, Any]) -> tuple[str, str]:
    """The method and a path the rule covers."""
    methods = rule.get("methods", "GET")
    method = methods if isinstance(methods, str) else methods[0]
    where = rule.get("path") or reverse(rule["url_name"])
    where = where if isinstance(where, str) else where[0]
    return method.lower(), where


def drive(client: Client, rule: dict[str, Any], failure: int, n: int) -> list[int]:
    """``n`` requests at the rule's door from one client (one address, one account)."""
    method, where = door(rule)
    send = getattr(client, method)
    data = {"username": "alice@example.com", "email": "alice@example.com"}
    status = failure if rule.get("count") == "failures" else 200
    headers = {
        "REMOTE_ADDR": "198.51.100.7",
        "HTTP_USER_AGENT": "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X)",
        "HTTP_X_ANSWER": str(status),
    }
    return [send(where, data, **headers).status_code for _ in range(n)]


def rules_of(case: Case) -> list[dict[str, Any]]:
    return [
        rule for rule in settings_of(case, _NO_SERVERS)[0]["RATELIMIT_RULES"] if "rate" in rule
    ]


class _NoServers:
    """Rules name no server: a stand-in request for :func:`settings_of`'s look-up."""

    def getfixturevalue(self, name: str) -> Any:
        raise AssertionError(f"a rules snippet asked for {name}")


_NO_SERVERS: Any = _NoServers()


@pytest.mark.parametrize("case", RULED, ids=lambda c: c.id)
def test_each_rule_refuses_past_its_rate(case: Case, myproject: Path) -> None:
    """Each rule of the snippet, alone: its first ``n`` requests pass and the next is 429
    (a dry run's never is), counting failures only where the rule says so."""
    found, _ = settings_of(case, _NO_SERVERS)
    statuses = (
        {"RATELIMIT_FAILURE_STATUSES": found["RATELIMIT_FAILURE_STATUSES"]}
        if "RATELIMIT_FAILURE_STATUSES" in found
        else {}
    )
    failure = statuses.get("RATELIMIT_FAILURE_STATUSES", [403])[0]  # 403: a default failure
    user = User.objects.create_user("reader", password="a-long-pass-phrase")
    for rule in rules_of(case):
        client = Client()
        if rule["key"] == "user":
            client.force_login(user)
        n = limit_of(rule)
        caches["default"].clear()  # the test site's counters
        with (
            override_settings(RATELIMIT_RULES=[rule], **statuses),
            frozen_clock(1_800_000_000.0 + 864_000 * next(_moments)),
        ):
            codes = drive(client, rule, failure, n + 1)
        if rule.get("shadow"):
            assert 429 not in codes, (rule["name"], codes)
        else:
            assert 429 not in codes[:n] and codes[n] == 429, (rule["name"], codes)


def test_the_drf_throttles_refuse_past_their_rates() -> None:
    """docs/drf's settings: a user gets 10 a minute; an anonymous client too (DRF's user
    throttle counts it by address) and 100 a day: the 101st, in a new minute, is refused."""
    found, _ = settings_of(CASES[RUNS.index(("drf", 0))], _NO_SERVERS)
    user = User.objects.create_user("reader", password="a-long-pass-phrase")
    signed_in = Client()
    signed_in.force_login(user)
    anonymous = []
    with override_settings(REST_FRAMEWORK=found["REST_FRAMEWORK"]), frozen_clock(1.9e9) as clock:
        member = [signed_in.get("/drf/").status_code for _ in range(11)]
        for _ in range(11):
            anonymous += [Client().get("/drf/").status_code for _ in range(10)]
            clock.advance(61)
    assert member == [200] * 10 + [429]
    assert anonymous == [200] * 100 + [429] * 10


def test_the_allow_and_deny_lists_hold() -> None:
    """docs/rules' lists beside a rule of 2 a minute: an allowed network is never limited,
    a denied address is refused from its first request."""
    found, _ = settings_of(CASES[RUNS.index(("rules", 3))], _NO_SERVERS)
    rule = {"name": "page", "path": "/page/", "key": "ip", "rate": "2/m"}
    with override_settings(RATELIMIT_RULES=[rule], **found), frozen_clock(1.95e9):
        allowed = [Client().get("/page/", REMOTE_ADDR="10.1.2.3").status_code for _ in range(4)]
        denied = Client().get("/page/", REMOTE_ADDR="203.0.113.7").status_code
        other = [Client().get("/page/", REMOTE_ADDR="192.0.2.8").status_code for _ in range(3)]
    assert allowed == [200] * 4
    assert denied in (403, 429)
    assert other == [200, 200, 429]
