from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings
from django.urls import path

from ratelimit_app.backends import reset_backends
from ratelimit_app.config import limits
from ratelimit_app.decorators import ratelimit
from ratelimit_app.engine import responses
from ratelimit_app.exceptions import Ratelimited
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.testing import frozen_clock

pytestmark = [pytest.mark.urls("tests.ratelimit.urls"), pytest.mark.usefixtures("backend_kind")]

MIDDLEWARE_429 = {
    "MIDDLEWARE": [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "ratelimit_app.middleware.RatelimitMiddleware",
    ]
}


@pytest.fixture(autouse=True)
def without_middleware() -> Any:
    """As django-ratelimit behaves on its own: no RatelimitMiddleware (the tests' settings
    have it), so a blocked request is the 403 of ``Ratelimited``. Tests that want the 429
    override MIDDLEWARE again."""
    with override_settings(
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
        ]
    ):
        yield


def statuses(client: Client, url: str, n: int, **extra: Any) -> list[int]:
    return [client.get(url, **extra).status_code for _ in range(n)]


@pytest.mark.parametrize(
    "url", ["/method-decorated/", "/plain-method/", "/class-decorated/", "/stacked/"]
)
def test_blocks_with_403_like_django_ratelimit(client: Client, url: str) -> None:
    assert statuses(client, url, 4) == [200, 200, 403, 403]


def test_function_view(client: Client) -> None:
    assert statuses(client, "/blocking/", 5) == [200, 200, 200, 403, 403]
    # Another client has its own bucket.
    assert client.get("/blocking/", REMOTE_ADDR="192.0.2.200").status_code == 200


def test_block_false_annotates(client: Client) -> None:
    seen = [client.get("/annotating/").json()["limited"] for _ in range(3)]
    assert seen == [False, False, True]


def test_method_filter(client: Client) -> None:
    assert statuses(client, "/post-only/", 5) == [200] * 5
    posts = [client.post("/post-only/").status_code for _ in range(3)]
    assert posts == [200, 200, 403]


async def test_async_view(async_client: AsyncClient) -> None:
    codes = [(await async_client.get("/async/")).status_code for _ in range(3)]
    assert codes == [200, 200, 403]
    codes = [(await async_client.get("/async-class/")).status_code for _ in range(3)]
    assert codes == [200, 200, 403]


@override_settings(**MIDDLEWARE_429)
def test_middleware_turns_ratelimited_into_429(client: Client) -> None:
    responses = [client.get("/blocking/") for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert 0 < int(responses[-1]["Retry-After"]) <= 61


@override_settings(
    RATELIMIT_VIEW="tests.ratelimit.views.custom_ratelimited_view", **MIDDLEWARE_429
)
def test_ratelimit_view_setting(client: Client) -> None:
    response = [client.get("/blocking/") for _ in range(4)][-1]
    assert response.status_code == 429 and response.content == b"slow down"


@override_settings(RATELIMIT_EXCEPTION_CLASS="tests.ratelimit.views.TooMany", **MIDDLEWARE_429)
def test_exception_class_setting(client: Client) -> None:
    from tests.ratelimit import views

    for _ in range(3):
        views.blocking(_request())
    with pytest.raises(views.TooMany):
        views.blocking(_request())


@override_settings(RATELIMIT_ENABLE=False)
def test_disabled(client: Client) -> None:
    assert statuses(client, "/blocking/", 5) == [200] * 5


def _request() -> Any:
    from django.test import RequestFactory

    return RequestFactory().get("/", REMOTE_ADDR="192.0.2.201")


DEAD = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "rl": {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": "127.0.0.1:9",  # discard port: connection refused
    },
}


@pytest.fixture
def counters_down(backend_kind: str) -> Any:
    """The counters on a server that refuses connections (after ``backend_kind``'s)."""
    with override_settings(CACHES=DEAD, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        yield
    reset_backends()


def unavailable(answer: Any, status: int = 503) -> bool:
    """The answer of a limit that cannot be checked: not the client's doing."""
    text = answer.content.decode()
    return (
        answer.status_code == status
        and answer["Retry-After"] == "5"  # backends.base.DEAD_RETRY
        and "cannot be checked right now" in text
        and "Too many" not in text
    )


@pytest.mark.usefixtures("counters_down")
@pytest.mark.parametrize("middleware", [False, True], ids=["alone", "with-middleware"])
def test_fail_closed_by_default_answers_unavailable_and_open_when_asked(
    client: Client, middleware: bool
) -> None:
    """With the counters down, a blocking decorator that fails closed answers as a
    fail-closed rule does: 503, not a 429 (or 403) that blames the client."""
    with override_settings(**(MIDDLEWARE_429 if middleware else {})):
        assert unavailable(client.get("/blocking/"))
        problem = client.get("/blocking/", HTTP_ACCEPT="application/json").json()
        assert problem["status"] == 503 and problem["title"] == "Service Unavailable"
        # block=False: the view runs and is told, as django-ratelimit tells it.
        assert client.get("/annotating/").json() == {"limited": True}
        with override_settings(RATELIMIT_FAIL_OPEN=True):
            assert client.get("/blocking/").status_code == 200


@pytest.mark.usefixtures("counters_down")
async def test_an_async_view_fails_closed_the_same_way(async_client: AsyncClient) -> None:
    assert unavailable(await async_client.get("/async/"))


def test_view_classes_have_their_own_default_groups(client: Client) -> None:
    assert statuses(client, "/class-decorated/", 2) == [200, 200]
    # Another decorated class inheriting the same dispatch does not share its counter.
    assert client.get("/async-class/").status_code == 200


def test_method_decorator_does_not_grow_the_registry(client: Client) -> None:
    from ratelimit_app.decorators import registry

    size = len(registry)
    statuses(client, "/method-decorated/", 3)
    assert len(registry) == size


# -- whom a 429 page says the limit counted ------------------------------------------------


@ratelimit(key="ip", rate="1/m")
def per_address(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(key="user", rate="1/m")
def per_account(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(key="post:username", rate="1/m")
def per_named(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def unlimited(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(key="ip", rate="5/m")
def five_a_minute(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("per-address/", per_address),
    path("per-account/", per_account),
    path("per-named/", per_named),
    path("by-rule/", unlimited),
    path("five-a-minute/", five_a_minute),
]

BY_ADDRESS = "Too many requests came from your network address"
BY_ACCOUNT = "Too many requests were made for your account"
BY_NAME = "Too many requests were made for this account or address"


def refused_page(client: Client, url: str, **data: str) -> str:
    """The page of the second of two requests under a limit of one."""
    send = client.post if data else client.get
    assert send(url, data).status_code == 200
    answer = send(url, data)
    assert answer.status_code == 429
    return " ".join(answer.content.decode().split())


@pytest.mark.urls(__name__)
@override_settings(
    RATELIMIT_RULES=[{"name": "email", "path": "/by-rule/", "key": "email", "rate": "1/m"}],
    **MIDDLEWARE_429,
)
def test_the_429_page_says_whom_the_limit_counted(
    client: Client, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit per account never says the requests "came from you" (an address)."""
    assert BY_ADDRESS in refused_page(client, "/per-address/")
    assert BY_NAME in refused_page(client, "/per-named/", username="ann")
    assert BY_NAME in refused_page(client, "/by-rule/", email="ann@example.com")  # a rule's
    # A user key counts an anonymous request by its address (ratelimit_app.identity.keys).
    assert BY_ADDRESS in refused_page(client, "/per-account/")
    user = User.objects.create_user("ann")
    client.force_login(user)
    assert BY_ACCOUNT in refused_page(client, "/per-account/")
    # Each distinct answer is rendered once, then kept (a flood's refusals cost no render).
    request = RequestFactory().get("/per-account/")
    request.user = user
    limited = Ratelimited(usage={"rate": "1/m", "retry_after": 7, "should_limit": True})
    limited.limit = limits.build("g", "user", "1/m")  # as @ratelimit's exception has it
    RUNTIME.drop(responses._Answers)
    rendered = []
    render = responses._render
    monkeypatch.setattr(responses, "_render", lambda *a: rendered.append(a) or render(*a))
    pages = [responses.too_many_requests(request, limited, limited.usage) for _ in range(3)]
    assert BY_ACCOUNT in pages[0].content.decode()
    assert len({page.content for page in pages}) == 1
    assert len(rendered) == 1


# -- Retry-After: 61 for '5/m' (docs/concepts.rst) ------------------------------------------


@pytest.mark.urls(__name__)
@override_settings(**MIDDLEWARE_429)
def test_retry_after_61_for_5_a_minute_is_the_first_moment_it_admits(client: Client) -> None:
    """Five hits at the start of a second, refused the same moment: the oldest hit's
    one-second bucket counts in full until it leaves the window, 61 s later (W + W/G). A
    Retry-After of 60 would send the client back to a refusal."""
    with frozen_clock(1_700_000_040.0) as clock:  # the start of a second
        assert statuses(client, "/five-a-minute/", 5) == [200] * 5
        refused = client.get("/five-a-minute/")
        assert (refused.status_code, refused["Retry-After"]) == (429, "61")
        clock.advance(60)  # the period: still one bucket too early
        early = client.get("/five-a-minute/")
        assert (early.status_code, early["Retry-After"]) == (429, "1")
        clock.advance(1)
        assert client.get("/five-a-minute/").status_code == 200
