"""A request Django's CSRF check refused tried no password: it is no failure of a
failure-only rule, whatever ``RATELIMIT_FAILURE_STATUSES`` says (docs/rules.rst, "Counting
only failures").

The attack: a page of another site submits a form to ``/accounts/login/`` over and over from
its reader's browser. With the default statuses (400, 401, 403) each CSRF 403 was a
failure, and docs/operators.rst's own ``login-ip`` ban then locked the reader out of the
log-in for an hour.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import authenticate
from django.contrib.auth import views as auth_views
from django.contrib.auth.models import User
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.middleware.csrf import CsrfViewMiddleware
from django.test import AsyncClient, Client, RequestFactory, override_settings
from django.urls import path, resolve
from django.views.decorators.csrf import csrf_exempt

from ratelimit_app import store
from ratelimit_app.identity.provenance import csrf_refused
from ratelimit_app.models import Ban
from ratelimit_app.testing import forget_refusals, frozen_clock

T0 = 1_800_000_000.0
VICTIM = "192.0.2.20"
PASSWORD = "the right one"


@csrf_exempt
def api_login(request: HttpRequest) -> HttpResponse:
    """An API that checks passwords itself (no CSRF: no cookies) and answers a wrong one 403."""
    user = authenticate(request, username=request.POST["username"], password=request.POST["pw"])
    return HttpResponse("ok") if user is not None else HttpResponseForbidden("no")


def refusing(request: HttpRequest) -> HttpResponse:
    """A view that is CSRF-checked and answers 403 of its own."""
    return HttpResponseForbidden("no")


urlpatterns = [
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(template_name="admin/login.html"),
        name="login",
    ),
    path("api/login/", api_login),
    path("refusing/", refusing),
    path("admin/", admin.site.urls),  # (the log-in template links to it)
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "ratelimit_app.middleware.RatelimitMiddleware",
]
#: docs/operators.rst's ``login-ip`` (its ban after 10 refusals within 10 minutes), on both
#: doors, with the default failure statuses (400, 401, 403).
LOGIN_IP = {
    "name": "login-ip",
    "path": ["/accounts/login/", "/api/login/"],
    "methods": ["POST"],
    "key": "ip",
    "rate": "5/m",
    "count": "failures",
    "ban": {"after": 10, "within": "10m", "for": "1h", "max": "1d"},
}

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    """Every test starts with no count, ban or refusal left by another."""
    store.forget()
    forget_refusals()
    caches["default"].clear()
    with override_settings(MIDDLEWARE=MIDDLEWARE, RATELIMIT_RULES=[LOGIN_IP]):
        yield
    store.forget()
    forget_refusals()
    caches["default"].clear()


@pytest.fixture
def victim(django_user_model: Any) -> User:
    user: User = django_user_model.objects.create_user("victim", password=PASSWORD)
    return user


def token_of(client: Client) -> str:
    """The CSRF token of the log-in form, as the victim's browser has it."""
    client.get("/accounts/login/", REMOTE_ADDR=VICTIM)
    return client.cookies["csrftoken"].value


def test_a_cross_site_form_does_not_lock_its_reader_out(victim: User) -> None:
    browser = Client(enforce_csrf_checks=True)
    form = {"username": "victim", "password": "anything"}
    with frozen_clock(T0):
        token = token_of(browser)  # the reader's browser has a CSRF cookie: the page has not
        codes = [
            browser.post("/accounts/login/", form, REMOTE_ADDR=VICTIM).status_code
            for _ in range(15)
        ]
        assert codes == [403] * 15  # Django's CSRF check refuses each
        right = {"username": "victim", "password": PASSWORD, "csrfmiddlewaretoken": token}
        assert browser.post("/accounts/login/", right, REMOTE_ADDR=VICTIM).status_code == 302
    assert not Ban.objects.exists()


def test_a_wrong_password_with_a_valid_token_still_counts(victim: User) -> None:
    browser = Client(enforce_csrf_checks=True)
    with frozen_clock(T0):
        token = token_of(browser)
        wrong = {"username": "victim", "password": "wrong", "csrfmiddlewaretoken": token}
        codes = [
            browser.post("/accounts/login/", wrong, REMOTE_ADDR=VICTIM).status_code
            for _ in range(6)
        ]
    assert codes == [200] * 5 + [429]  # LoginView answers a wrong password with 200


def test_a_csrf_exempt_views_own_403_still_counts(victim: User) -> None:
    client = Client(enforce_csrf_checks=True)
    wrong = {"username": "victim", "pw": "wrong"}
    with frozen_clock(T0):
        codes = [
            client.post("/api/login/", wrong, REMOTE_ADDR=VICTIM).status_code for _ in range(6)
        ]
    assert codes == [403] * 5 + [429]


def test_a_403_with_the_check_turned_off_still_counts(victim: User) -> None:
    """The test client (``enforce_csrf_checks=False``) is accepted by the check: a 403 is
    the view's."""
    rule = {**LOGIN_IP, "path": "/refusing/"}
    with override_settings(RATELIMIT_RULES=[rule]), frozen_clock(T0):
        codes = [Client().post("/refusing/", REMOTE_ADDR=VICTIM).status_code for _ in range(6)]
    assert codes == [403] * 5 + [429]


@pytest.mark.django_db(transaction=True)
async def test_a_cross_site_form_under_asgi(victim: User) -> None:
    browser = AsyncClient(enforce_csrf_checks=True)
    form = {"username": "victim", "password": "anything"}
    with frozen_clock(T0):
        await browser.get("/accounts/login/", REMOTE_ADDR=VICTIM)
        token = browser.cookies["csrftoken"].value
        codes = [
            (await browser.post("/accounts/login/", form, REMOTE_ADDR=VICTIM)).status_code
            for _ in range(15)
        ]
        right = {"username": "victim", "password": PASSWORD, "csrfmiddlewaretoken": token}
        logged_in = await browser.post("/accounts/login/", right, REMOTE_ADDR=VICTIM)
    assert codes == [403] * 15
    assert logged_in.status_code == 302


# -- the predicate -----------------------------------------------------------------------------


def _request(method: str, url: str = "/accounts/login/", **attrs: Any) -> HttpRequest:
    request = RequestFactory().generic(method, url)
    request.resolver_match = resolve(url)
    for name, value in attrs.items():
        setattr(request, name, value)
    return request


FORBIDDEN = HttpResponseForbidden()


def test_a_refused_post_is_a_csrf_refusal() -> None:
    assert csrf_refused(_request("POST"), FORBIDDEN)


@pytest.mark.parametrize(
    ("request_", "response"),
    [
        (lambda: _request("POST"), HttpResponse(status=401)),
        (lambda: _request("GET"), FORBIDDEN),
        (lambda: _request("POST", csrf_processing_done=True), FORBIDDEN),
        (lambda: _request("POST", _dont_enforce_csrf_checks=True), FORBIDDEN),
        (lambda: _request("POST", "/api/login/"), FORBIDDEN),  # csrf_exempt
        (lambda: _request("POST", resolver_match=None), FORBIDDEN),  # not resolved
        (lambda: None, FORBIDDEN),
    ],
)
def test_what_is_no_csrf_refusal(request_: Any, response: HttpResponse) -> None:
    assert not csrf_refused(request_(), response)


def test_without_the_csrf_middleware_a_403_is_the_views() -> None:
    with override_settings(MIDDLEWARE=MIDDLEWARE[:1] + MIDDLEWARE[2:]):
        assert not csrf_refused(_request("POST"), FORBIDDEN)
    subclass = "tests.ratelimit.test_csrf_failures.OwnCsrf"
    with override_settings(MIDDLEWARE=[MIDDLEWARE[0], subclass, *MIDDLEWARE[2:]]):
        assert csrf_refused(_request("POST"), FORBIDDEN)


class OwnCsrf(CsrfViewMiddleware):
    """A project's own CSRF middleware (a subclass) is the check too."""
