"""The docs' code snippets (views, decorators, throttles, keys, look-ups), run as printed.

Each block is executed as it stands; the names its page assumes the reader has (``request``,
a ``render`` of the reader's own template, ``authenticate``'s credentials, a language model)
are given to it, and nothing else. Then the test does what the page says the code does and
checks the outcome: the request the rate allows passes, the next is refused, the callable
rate exempts staff, a reset lets the client in again.
"""

from __future__ import annotations

import asyncio
import json
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.dispatch import Signal
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

import metrics_app
from ratelimit_app import store
from ratelimit_app.core import get_usage, is_ratelimited
from ratelimit_app.decorators import ratelimit
from ratelimit_app.exceptions import Ratelimited
from ratelimit_app.signals import ratelimited
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.docs.conftest import module_and_settings
from tests.docs.snippets import snippet
from tests.ratelimit.conftest import MIDDLEWARE

RUNS = [
    ("drf", 1),
    ("migrating", 1),
    ("migrating", 3),
    ("operators", 1),
    ("operators", 2),
    ("operators", 3),
    ("quickstart", 2),
    ("quickstart", 4),
    *[("ratelimit", i) for i in range(17) if i != 12],
    ("rules", 2),
    ("rules", 4),
    ("rules", 5),
    ("rules", 7),
    ("settings", 2),
]
T0 = 1_800_000_000.0
factory = RequestFactory()


def run(page: str, index: int, *needles: str, **names: Any) -> dict[str, Any]:
    """Execute a snippet with ``names`` given; the names it defines."""
    shown = snippet(page, index, *needles)
    namespace: dict[str, Any] = {"__name__": f"docs_{page}", **names}
    exec(compile(shown.code, shown.where, "exec"), namespace)  # (our own docs)
    return namespace


def render(request: HttpRequest, template: str, context: dict[str, Any] | None = None) -> Any:
    """The reader's template, rendered: the context as JSON."""
    return HttpResponse(json.dumps({"template": template, **(context or {})}, default=str))


def outcomes(view: Callable[..., Any], requests: Iterator[HttpRequest] | list[Any]) -> list[Any]:
    """What a view gives each request: its answer, or ``"refused"``."""
    found = []
    for req in requests:
        try:
            found.append(view(req))
        except Ratelimited:
            found.append("refused")
    return found


def posts(n: int, **data: Any) -> list[HttpRequest]:
    return [factory.post("/", data, REMOTE_ADDR="198.51.100.7") for _ in range(n)]


def gets(n: int, **extra: Any) -> list[HttpRequest]:
    return [factory.get("/", REMOTE_ADDR="198.51.100.7", **extra) for _ in range(n)]


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    store.forget()
    forget_refusals()
    with frozen_clock(T0):
        yield
    store.forget()
    forget_refusals()


# -- docs/ratelimit.rst ----------------------------------------------------------------------


def test_a_post_limit_counts_posts_only() -> None:
    login = run("ratelimit", 0, 'method="POST"')["login"]
    assert outcomes(login, gets(10)) == [None] * 10
    assert outcomes(login, posts(6)) == [None] * 5 + ["refused"]


def test_a_leaky_bucket_takes_its_burst_then_its_rate() -> None:
    api = run("ratelimit", 1, "burst=50", ratelimit=ratelimit)["api"]
    assert outcomes(api, gets(51)) == [None] * 50 + ["refused"]
    with frozen_clock(T0 + 0.1):  # one drop leaks in a tenth of a second at 10/s
        assert outcomes(api, gets(2)) == [None, "refused"]


def test_block_false_lets_the_view_ask_for_a_captcha() -> None:
    login = run("ratelimit", 2, "block=False", ratelimit=ratelimit, render=render)["login"]
    answers = outcomes(login, posts(6, username="alice"))
    assert answers[:5] == [None] * 5
    assert json.loads(answers[5].content) == {"template": "login.html", "captcha": True}


def test_stacked_decorators_count_apart() -> None:
    login = run("ratelimit", 3, 'method="POST")   # counts POSTs only', ratelimit=ratelimit)
    assert outcomes(login["login"], posts(6)) == [None] * 5 + ["refused"]
    assert outcomes(login["login"], gets(3)) == [None] * 3


def test_a_key_callable_falls_back_to_the_address() -> None:
    api = run("ratelimit", 4, "def api_client", ratelimit=ratelimit)["api"]
    token = gets(1000, HTTP_AUTHORIZATION="Bearer abc")
    assert outcomes(api, token) == [None] * 1000
    assert outcomes(api, gets(1, HTTP_AUTHORIZATION="Bearer abc")) == ["refused"]
    assert outcomes(api, gets(1)) == [None]  # no token: the address, a counter of its own


@pytest.mark.django_db
def test_a_rate_callable_exempts_staff() -> None:
    search = run("ratelimit", 5, "def by_plan", ratelimit=ratelimit)["search"]
    staff = User.objects.create_user("staff", is_staff=True)
    member = User.objects.create_user("member")

    def as_user(user: Any, n: int) -> list[Any]:
        requests = gets(n)
        for req in requests:
            req.user = user
        return outcomes(search, requests)

    assert as_user(member, 1001) == [None] * 1000 + ["refused"]
    assert as_user(staff, 1200) == [None] * 1200
    anonymous = types.SimpleNamespace(is_authenticated=False, is_staff=False, pk=None)
    assert as_user(anonymous, 101) == [None] * 100 + ["refused"]


def shape(value: Any) -> Any:
    """A usage dict's keys and kinds (``count`` and times vary with the moment)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


@pytest.mark.parametrize(("index", "needle"), [(6, "'5/m'"), (7, "leaky_bucket")])
def test_the_printed_usage_is_what_get_usage_returns(index: int, needle: str) -> None:
    """The session shown: the same call returns a dict of the same keys, kinds and rates."""
    shown = snippet("ratelimit", index, ">>> get_usage(", needle)
    call, printed = shown.code.split("\n{", 1)
    source = call.replace(">>> ", "").replace("... ", "")
    request = factory.get("/", REMOTE_ADDR="198.51.100.7")
    for _ in range(3):
        got = eval(source, {"get_usage": get_usage, "request": request})  # (our own docs)
    expected = eval("{" + printed)  # (our own docs)
    assert shape(got) == shape(expected)
    fixed = ("limit", "rate", "algorithm", "capacity")
    assert {k: got[k] for k in fixed if k in got} == {k: expected[k] for k in fixed if k in got}
    assert [r["window"] for r in got["rates"]] == [r["window"] for r in expected["rates"]]
    assert got["count"] == expected["count"] == 3


def test_a_look_then_counting_failures() -> None:
    names = run(
        "ratelimit",
        8,
        "LIMIT = dict(",
        HttpResponse=HttpResponse,
        authenticate=lambda request, *credentials: None,  # the reader's wrong password
    )
    answers = outcomes(names["login"], posts(6, username="alice"))
    assert answers[:5] == [None] * 5
    assert answers[5].status_code == 429
    assert answers[5].content == b"Too many failed attempts."


def test_a_counted_check_raises_past_the_rate() -> None:
    request = factory.post("/", REMOTE_ADDR="198.51.100.7")
    for _ in range(20):
        run("ratelimit", 9, '"20/d"', is_ratelimited=is_ratelimited, request=request)
    with pytest.raises(Ratelimited):
        run(
            "ratelimit",
            9,
            '"20/d"',
            is_ratelimited=is_ratelimited,
            Ratelimited=Ratelimited,
            request=request,
        )


LOGIN_EMAIL = {
    "name": "login-email",
    "path": "/login/",
    "methods": "POST",
    "key": "email",
    "rate": "5/m;10/d",
}


def usage_of_email(group: str, **limit: Any) -> int:
    request = factory.post("/", {"email": "foo@example.com"})
    usage = get_usage(request, group=group, **limit)
    assert usage is not None
    return int(usage["count"])


def test_reset_forgets_a_rule_and_a_group() -> None:
    group = {"key": "email", "rate": "5/m;10/d", "method": "POST"}
    request = factory.post("/", {"email": "Foo@Example.com"})
    with override_settings(RATELIMIT_RULES=[LOGIN_EMAIL]):
        from ratelimit_app.core import lookup

        for _ in range(3):
            get_usage(request, group="accounts.views.login", increment=True, **group)
        for _ in range(5):
            Client().post("/login/", {"email": "Foo@Example.com"})
        assert lookup("login-email", "Foo@Example.com")["count"] == 5  # type: ignore[index]
        assert usage_of_email("accounts.views.login", **group) == 3
        run("ratelimit", 10, 'reset("login-email"')
        assert lookup("login-email", "Foo@Example.com")["count"] == 0  # type: ignore[index]
        assert usage_of_email("accounts.views.login", **group) == 0


def test_lookup_shows_what_is_left() -> None:
    """The session shown: after three requests, two of five remain."""
    from ratelimit_app.core import lookup

    shown = snippet("ratelimit", 11, '>>> lookup("login-email"')
    call, printed = shown.code.split("\n", 1)
    with override_settings(RATELIMIT_RULES=[LOGIN_EMAIL]):
        for _ in range(3):
            Client().post("/login/", {"email": "Foo@Example.com"})
        assert eval(call.removeprefix(">>> "), {"lookup": lookup}) == eval(printed)


def test_class_based_views_are_limited_and_named_by_their_module() -> None:
    names = run("ratelimit", 13, "class ApiView", __name__="myapp.views")
    login = names["LoginView"].as_view()
    assert outcomes(login, posts(6)) == [None] * 5 + ["refused"]
    search = names["SearchView"].as_view()
    assert outcomes(search, gets(31)) == [None] * 30 + ["refused"]
    api = names["ApiView"].as_view()
    outcomes(api, gets(2) + posts(1))
    request = factory.get("/", REMOTE_ADDR="198.51.100.7")
    usage = get_usage(request, group="myapp.views.ApiView", key="user_or_ip", rate="1000/h")
    assert usage is not None and usage["count"] == 3  # the default group the page names


def test_an_async_view_is_limited() -> None:
    feed = run("ratelimit", 14, "async def feed", ratelimit=ratelimit)["feed"]

    async def calls() -> list[Any]:
        found = []
        for req in gets(11):
            try:
                found.append(await feed(req))
            except Ratelimited:
                found.append("refused")
        return found

    assert asyncio.run(calls()) == [None] * 10 + ["refused"]


def recorded(signal: Signal, names: dict[str, Any], series: str) -> int:
    """The count of ``series`` once the receiver the snippet connected has run."""
    metrics_app.flush()
    try:
        return metrics_app.query.total(series)
    finally:
        signal.disconnect(names["count_blocks"])


@pytest.mark.django_db
def test_a_receiver_counts_the_decorators_refusals() -> None:
    names = run("ratelimit", 15, "def count_blocks", metrics_app=metrics_app)
    view = ratelimit(key="ip", rate="1/m", group="docs-signal")(lambda request: None)
    assert outcomes(view, gets(3)) == [None, "refused", "refused"]
    assert recorded(ratelimited, names, "ratelimited:docs-signal") == 2


def limited_login(request: HttpRequest) -> HttpResponse:
    return HttpResponse("welcome")


def rules_login(request: HttpRequest) -> HttpResponse:
    """docs/rules' view, whose ``...`` is the reader's log-in form."""
    view = run("rules", 2, 'getattr(request, "limited", False)', render=render)["login"]
    return view(request) or HttpResponse("the form")


urlpatterns = [
    path("login/", ratelimit(key="ip", rate="5/m")(limited_login)),
    path("rules-login/", lambda request: rules_login(request)),
    path("plain/", limited_login),
    path("api/", lambda request: api(request)),
    path("bulk/", lambda request: SERVED["bulk"](request)),
    path("complete/", lambda request: SERVED["complete"](request)),
]
pytestmark = pytest.mark.urls(__name__)


def test_the_documented_test_passes() -> None:
    """The page's own test, without the middleware (a refusal is then 403)."""
    names = run("ratelimit", 16, "def test_login_is_limited")
    without = [m for m in MIDDLEWARE if m != "ratelimit_app.middleware.RatelimitMiddleware"]
    with override_settings(MIDDLEWARE=without):
        names["test_login_is_limited"](Client())


def test_override_settings_lifts_the_limits() -> None:
    client = Client()
    for _ in range(5):
        client.post("/login/")
    assert client.post("/login/").status_code in (403, 429)
    names = run("settings", 2, "RATELIMIT_ENABLE=False", client=client)
    assert names["response"].status_code == 200


# -- docs/rules.rst ---------------------------------------------------------------------------


def test_a_rule_that_does_not_block_tells_the_view() -> None:
    rule = {"name": "soft", "path": "/rules-login/", "key": "ip", "rate": "2/m", "block": False}
    with override_settings(RATELIMIT_RULES=[rule], MIDDLEWARE=MIDDLEWARE):
        answers = [Client().get("/rules-login/").content for _ in range(3)]
    assert answers[:2] == [b"the form"] * 2
    assert json.loads(answers[2]) == {"template": "login.html", "captcha": True}


@pytest.mark.django_db
def test_a_receiver_counts_the_rules_refusals() -> None:
    names = run("rules", 4, "sender=RatelimitMiddleware", metrics_app=metrics_app)
    rule = {"name": "docs-rule", "path": "/plain/", "key": "ip", "rate": "2/m"}
    with override_settings(RATELIMIT_RULES=[rule], MIDDLEWARE=MIDDLEWARE):
        codes = [Client().get("/plain/").status_code for _ in range(4)]
    assert codes == [200, 200, 429, 429]
    assert recorded(ratelimited, names, "ratelimited:docs-rule") == 2


def test_lookup_then_reset_lets_the_account_in() -> None:
    rule = {**LOGIN_EMAIL, "path": "/plain/", "rate": "5/m"}
    with override_settings(RATELIMIT_RULES=[rule], MIDDLEWARE=MIDDLEWARE):
        codes = [
            Client().post("/plain/", {"email": "alice@example.com"}).status_code for _ in range(6)
        ]
        assert codes[-1] == 429
        names = run("rules", 5, 'lookup("login-email", "Alice@Example.com")')
        assert names["usage"]["should_limit"] is True
        assert Client().post("/plain/", {"email": "alice@example.com"}).status_code == 200


def test_the_account_and_address_key(myproject: Path) -> None:
    from myproject.ratelimit_keys import account_and_address  # type: ignore[import-not-found]

    snippet("rules", 7, "def account_and_address")
    request = factory.post("/", {"username": " Alice@Example.COM "}, REMOTE_ADDR="198.51.100.7")
    assert account_and_address("login", request) == "alice@example.com 198.51.100.7"
    assert account_and_address("login", factory.post("/", {})) is None


# -- docs/migrating.rst ------------------------------------------------------------------------


def test_a_look_then_a_count_of_failures() -> None:
    request = factory.post("/", {"username": "alice"})
    for _ in range(5):
        run(
            "migrating",
            1,
            "login_failed",
            is_ratelimited=is_ratelimited,
            request=request,
            login_failed=True,
        )
    assert is_ratelimited(request, group="login", key="post:username", rate="5/m")


def test_no_backend_exception_reaches_the_caller() -> None:
    import redis

    request = factory.get("/", REMOTE_ADDR="198.51.100.7")
    found = [
        run(
            "migrating",
            3,
            "redis.exceptions.ConnectionError",
            is_ratelimited=is_ratelimited,
            request=request,
            redis=redis,
        )["limited"]
        for _ in range(11)
    ]
    assert found == [False] * 10 + [True]


# -- docs/operators.rst -----------------------------------------------------------------------


def test_a_cost_callable_counts_items() -> None:
    bulk_update = run("operators", 1, "def by_items")["bulk_update"]
    many = [
        factory.post("/", {"item": list(range(600))}),
        factory.post("/", {"item": list(range(400))}),
    ]
    for req in many:
        req.user = User(pk=7)
    assert outcomes(bulk_update, many) == [None, None]
    one = factory.post("/", {"item": "1"})
    one.user = User(pk=7)
    assert outcomes(bulk_update, [one]) == ["refused"]


def api(request: HttpRequest) -> Any:
    """An API view with the authentication the settings in force name (docs/drf's)."""

    class Api(APIView):
        authentication_classes = api_settings.DEFAULT_AUTHENTICATION_CLASSES

        def get(self, request: Any) -> Response:
            return Response({"ok": True})

        def post(self, request: Any) -> Response:
            return Response({"ok": True})

    return Api.as_view()(request)


#: The views a test makes from its snippet, served at its path by :data:`urlpatterns`.
SERVED: dict[str, Any] = {}


def test_a_throttle_cost_counts_items() -> None:
    throttle = run("operators", 2, "class BulkThrottle")["BulkThrottle"]

    class Bulk(APIView):
        throttle_classes = [throttle]

        def post(self, request: Any) -> Response:
            return Response({"ok": True})

    SERVED["bulk"] = Bulk.as_view()
    client = Client()
    with override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"bulk": "10/m"}}):
        codes = [
            client.post(
                "/bulk/", {"items": list(range(n))}, content_type="application/json"
            ).status_code
            for n in (6, 4, 1)
        ]
    assert codes == [200, 200, 429]


@pytest.mark.django_db
def test_charge_counts_the_tokens_an_answer_used() -> None:
    answer = types.SimpleNamespace(text="...", tokens_used=45_000)
    model = types.SimpleNamespace(complete=lambda prompt: answer)  # the reader's model
    names = run("operators", 3, "ratelimit_app.charge(", model=model, JsonResponse=JsonResponse)
    SERVED["complete"] = names["complete"]
    client = Client()
    client.force_login(User.objects.create_user("writer"))
    codes = [client.post("/complete/", {"prompt": "hi"}).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]  # 3 requests and 135,000 tokens: over 100,000


# -- docs/quickstart.rst ----------------------------------------------------------------------


def test_the_quickstart_view_is_limited() -> None:
    login = run("quickstart", 2, "def login")["login"]
    answers = outcomes(login, gets(6))
    assert [a.content for a in answers[:5]] == [b"welcome"] * 5
    assert answers[5] == "refused"


@pytest.mark.django_db
def test_the_quickstart_counts_visits_in_memory() -> None:
    names = run("quickstart", 4, "count_visits", "metrics_app.record")
    assert callable(names["follow"])
    metrics_app.flush()
    assert metrics_app.query.total("signups") == 1


# -- docs/drf.rst -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_log_in_rule_holds_at_the_api_door(myproject: Path) -> None:
    """docs/drf's authentication and rule: wrong passwords by HTTP Basic on the API count
    with the form's (401 is a failure there), and a GET is never asked for one."""
    shown = snippet("drf", 1, "BasicAuthenticationOnPost", '"login-pair"')
    settings_part = module_and_settings(shown.code)[1]
    names: dict[str, Any] = {}
    exec(compile(settings_part, shown.where, "exec"), names)  # (our own docs)
    import base64

    wrong = "Basic " + base64.b64encode(b"alice@example.com:wrong").decode()
    with override_settings(
        REST_FRAMEWORK=names["REST_FRAMEWORK"],
        RATELIMIT_FAILURE_STATUSES=names["RATELIMIT_FAILURE_STATUSES"],
        RATELIMIT_RULES=names["RATELIMIT_RULES"],
        MIDDLEWARE=MIDDLEWARE,
    ):
        client = Client()
        gets_ok = [client.get("/api/", HTTP_AUTHORIZATION=wrong).status_code for _ in range(3)]
        codes = [
            client.post(
                "/api/", {"username": "alice@example.com"}, HTTP_AUTHORIZATION=wrong
            ).status_code
            for _ in range(6)
        ]
    assert gets_ok == [200] * 3
    assert codes == [401] * 5 + [429]
