from __future__ import annotations

from typing import Any

import pytest
from django.test import AsyncClient, Client, override_settings

from ratelimit_app.backends import reset_backends

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


def test_fail_closed_by_default_and_open_when_asked(client: Client) -> None:
    dead = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": "127.0.0.1:9",  # discard port: connection refused
    }
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}, "rl": dead}
    with override_settings(CACHES=caches, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        assert client.get("/blocking/").status_code == 403
        with override_settings(RATELIMIT_FAIL_OPEN=True):
            assert client.get("/blocking/").status_code == 200
    reset_backends()


def test_view_classes_have_their_own_default_groups(client: Client) -> None:
    assert statuses(client, "/class-decorated/", 2) == [200, 200]
    # Another decorated class inheriting the same dispatch does not share its counter.
    assert client.get("/async-class/").status_code == 200


def test_method_decorator_does_not_grow_the_registry(client: Client) -> None:
    from ratelimit_app.decorators import registry

    size = len(registry)
    statuses(client, "/method-decorated/", 3)
    assert len(registry) == size
