"""An override's limit is named as the usage page and the commands name it (issue "An
operator's first day", items 7 and 12): a view's URL name, path or dotted path is filed under
its decorator's group, where the limiter looks overrides up; a name one typo away from a
known one is refused, short names too, and distinct names are not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.cache import caches
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from ratelimit_app import store
from ratelimit_app.config.names import close_to, one_typo_away, typo_of
from ratelimit_app.decorators import ratelimit
from ratelimit_app.models import Override
from ratelimit_app.operators.admin import OverrideForm
from ratelimit_app.overrides import applied
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.test_admin import MIDDLEWARE

T0 = 1_800_000_000.0
HERE = __name__
ADD = "/admin/ratelimit_app/override/add/"


@ratelimit(key="ip", rate="5/m")
def hello(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(group="two-ip", key="ip", rate="5/m")
@ratelimit(group="two-user", key="user_or_ip", rate="50/h")
def two(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("admin/", admin.site.urls),
    path("hello/", hello, name="hello"),
    path("two/", two, name="two"),
]

RULES = [
    {"name": "scan", "path": "/s/", "key": "ip", "rate": "30/m"},
    {"name": "api-v1", "path": "/api/v1/", "key": "ip", "rate": "30/m"},
]

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    with override_settings(ROOT_URLCONF=HERE, MIDDLEWARE=MIDDLEWARE, RATELIMIT_RULES=RULES):
        store.forget()
        applied.forget()
        caches["default"].clear()
        forget_refusals()
        yield
    store.forget()
    applied.forget()
    forget_refusals()


def superuser() -> Client:
    User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(User.objects.get(username="root"))
    return client


def form(limit: str, subject: str = "192.0.2.1", rate: str = "unlimited") -> OverrideForm:
    found = OverrideForm({"limit": limit, "subject": subject, "rate": rate, "note": ""})
    found.is_valid()
    return found


def errors(limit: str) -> list[str]:
    """The form's errors of the limit (the model's own validation included)."""
    return [str(e) for e in form(limit).errors.get("limit", [])]


def hits(ip: str, n: int) -> list[int]:
    client = Client()
    return [client.get("/hello/", REMOTE_ADDR=ip).status_code for _ in range(n)]


# -- item 7: a view's name is filed under its decorator's group ------------------------------


def test_an_override_named_by_a_views_url_name_applies() -> None:
    """The issue's report: ``hello`` was saved and the client stayed limited."""
    admin_client = superuser()
    response = admin_client.post(
        ADD, {"limit": "hello", "subject": "192.0.2.7", "rate": "unlimited", "note": ""}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    (row,) = Override.objects.all()
    assert row.limit == f"{HERE}.hello"
    shown = [str(m) for m in admin_client.get(response["Location"]).context["messages"]]
    assert any(f"hello is filed as {HERE}.hello" in m for m in shown)
    with frozen_clock(T0):
        assert hits("192.0.2.7", 7) == [200] * 7
        assert hits("192.0.2.8", 6) == [200] * 5 + [429]  # another client is still limited


@pytest.mark.parametrize("typed", ["hello", "/hello/", f"{HERE}.hello", f"{HERE}.hello "])
def test_every_name_of_a_view_files_the_group(typed: str) -> None:
    found = form(typed, rate="9/m")
    assert found.is_valid(), found.errors
    assert found.save().limit == f"{HERE}.hello"


def test_a_view_with_limits_of_two_groups_is_refused_naming_each() -> None:
    (message,) = errors("two")
    assert "two-ip" in message and "two-user" in message and "Name one" in message
    assert errors("two-ip") == []


def test_a_rule_a_group_on_no_view_and_a_scope_are_kept_as_typed() -> None:
    for name in ("scan", "some.module.view", "premium-api"):
        found = form(name, rate="9/m")
        assert found.is_valid(), found.errors
        assert found.save().limit == name


# -- item 12: one typo away, short names too -------------------------------------------------


@pytest.mark.parametrize("typed", ["scam", "scna", "sca", "scann", "csan", "Scan", "sacn"])
def test_a_short_name_one_typo_from_a_rule_is_refused(typed: str) -> None:
    (message,) = errors(typed)
    assert "did you mean 'scan'" in message
    with pytest.raises(ValidationError, match="did you mean 'scan'"):  # the model itself
        Override(limit=typed, subject="192.0.2.1", rate="unlimited").full_clean()


@pytest.mark.parametrize("typed", ["helo", "hellp", "two-up"])
def test_a_name_one_typo_from_a_view_or_group_is_refused(typed: str) -> None:
    (message,) = errors(typed)
    assert "did you mean" in message


@pytest.mark.parametrize("typed", ["search", "scanner", "spam", "sc", "cans", "api-v2"])
def test_distinct_names_are_accepted(typed: str) -> None:
    assert errors(typed) == []


@pytest.mark.parametrize(
    ("typed", "known"),
    [
        ("scam", "scan"),  # replaced
        ("scna", "scan"),  # neighbours swapped
        ("scn", "scan"),  # dropped
        ("scaan", "scan"),  # added
        ("xscan", "scan"),  # added first
        ("scanx", "scan"),  # added last
        ("login-emial", "login-email"),
        ("abc", "abd"),
    ],
)
def test_one_typo(typed: str, known: str) -> None:
    assert one_typo_away(typed, known) and one_typo_away(known, typed)


@pytest.mark.parametrize(
    ("typed", "known"),
    [
        ("scan", "scan"),  # the same name
        ("snac", "scan"),  # two apart
        ("ab", "ac"),  # too short to tell
        ("a", "ab"),
        ("api-v2", "api-v1"),  # a series
        ("scanner", "scan"),
        ("nacs", "scan"),
        ("sacn", "scna"),  # two swaps
    ],
)
def test_not_one_typo(typed: str, known: str) -> None:
    assert not one_typo_away(typed, known) and not one_typo_away(known, typed)


def test_typo_of_answers_the_same_whatever_the_order() -> None:
    assert typo_of("cat", ["bat", "car"]) == typo_of("cat", ["car", "bat"]) == "bat"
    assert typo_of("dog", {"cat", "bird"}) is None


def test_close_to_takes_two_slips_in_a_long_name_never_a_series() -> None:
    assert close_to("pasword-rest", ["password-reset", "scan"]) == "password-reset"
    assert close_to("scam", ["password-reset", "scan"]) == "scan"
    assert close_to("api-v2", ["api-v1"]) is None
    assert close_to("login-ip-v10", ["login-ip-v11"]) is None
    assert close_to("search", ["scan", "api-v1"]) is None
