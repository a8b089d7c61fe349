"""An operator's first day (15): a banned client's 429 says that it is banned and until
when, in the page and the JSON problem, not only that a rate was exceeded."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from ratelimit_app import store
from ratelimit_app.decorators import ratelimit
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
BAN = {"after": 3, "within": "10m", "for": "1h", "max": "4h"}
RULE = {"name": "login", "path": "/login/", "key": "ip", "rate": "2/m", "ban": BAN}
JSON = {"HTTP_ACCEPT": "application/json", "REMOTE_ADDR": "192.0.2.1"}


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(
    group="banning-view", key="ip", rate="1/m", ban={"after": 2, "within": "1h", "for": "10m"}
)
def decorated(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("login/", plain), path("other/", plain), path("decorated/", decorated)]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    store.forget()
    forget_refusals()
    with override_settings(MIDDLEWARE=MIDDLEWARE):
        yield
    store.forget()
    forget_refusals()


def test_a_banned_client_is_told_it_is_banned_and_until_when(client: Client) -> None:
    with override_settings(RATELIMIT_RULES=[RULE]), frozen_clock(T0):
        for _ in range(3):
            client.get("/login/", REMOTE_ADDR="192.0.2.1")
        # Over the rate, not banned yet: the answer is the rate's.
        over = client.get("/login/", **JSON).json()  # type: ignore[arg-type]
        banned = client.get("/login/", **JSON)  # type: ignore[arg-type]
        page = client.get("/login/", REMOTE_ADDR="192.0.2.1").content.decode()
    assert "banned" not in over["detail"]
    assert "banned_until" not in over
    body = json.loads(banned.content)
    assert banned.status_code == 429 and banned["Retry-After"] == "3600"
    assert body["banned_until"] == "2027-01-15T09:00:00Z"
    assert body["detail"] == (
        "This client is banned from rule 'login' until 2027-01-15 09:00:00 UTC: too many of "
        "its requests exceeded the limit 2/m. Try again in 3600 seconds."
    )
    assert "This client is banned until 2027-01-15 09:00:00 UTC" in page
    assert "Please wait 3600 seconds" in page
    assert "Too many requests came from your network address" not in page


def test_a_decorator_s_ban_says_so_too(client: Client) -> None:
    with frozen_clock(T0):
        for _ in range(3):
            client.get("/decorated/", REMOTE_ADDR="192.0.2.1")
        body = client.get("/decorated/", **JSON).json()  # type: ignore[arg-type]
    assert body["banned_until"] == "2027-01-15T08:10:00Z"
    assert body["detail"].startswith(
        "This client is banned until 2027-01-15 08:10:00 UTC: too many of its requests "
        "exceeded the limit 1/m."
    )


def test_a_ban_on_every_path_says_so(client: Client) -> None:
    site_rule = {**RULE, "ban": {**BAN, "scope": "site"}}
    with override_settings(RATELIMIT_RULES=[site_rule]), frozen_clock(T0):
        for _ in range(5):
            client.get("/login/", REMOTE_ADDR="192.0.2.1")
        body = client.get("/other/", **JSON).json()  # type: ignore[arg-type]
    assert body["detail"].startswith("This client is banned until 2027-01-15 09:00:00 UTC")
