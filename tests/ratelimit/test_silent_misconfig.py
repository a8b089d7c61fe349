"""The usual mistakes that passed ``manage.py check`` without a word: each now gets a system
check or an error at start or at import, and the message names the fix."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import WARNING
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from ratelimit_app import checks
from ratelimit_app.conf import DEFAULTS
from ratelimit_app.decorators import ratelimit, registry
from ratelimit_app.middleware import RatelimitMiddleware

RL_MIDDLEWARE = "ratelimit_app.middleware.RatelimitMiddleware"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"
IP_RULE = {"name": "r", "path": "/x/", "key": "ip", "rate": "5/m"}


def found(messages: list[Any], code: str) -> list[Any]:
    return [m for m in messages if m.id == f"ratelimit_app.{code}"]


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """What a test's views add to the decorators' registry is forgotten after."""
    before = dict(registry)
    try:
        yield
    finally:
        registry.clear()
        registry.update(before)


@override_settings(RATELIMIT_RULE=[IP_RULE], RATELIMIT_FAILOPEN=True, RATELIMIT_COLOUR="blue")
def test_a_misspelled_setting_is_named_with_the_setting_meant() -> None:
    messages = found(checks.check_settings(), "W008")
    assert [m.level for m in messages] == [WARNING] * 3
    colour, failopen, rule = messages  # in name order
    assert failopen.msg.endswith("RATELIMIT_FAILOPEN: did you mean RATELIMIT_FAIL_OPEN?")
    assert failopen.hint == "Rename it RATELIMIT_FAIL_OPEN."
    assert rule.msg.endswith("RATELIMIT_RULE: did you mean RATELIMIT_RULES?")
    assert rule.hint == "Rename it RATELIMIT_RULES."
    # No close name: named alone, with what to do.
    assert colour.msg.endswith("RATELIMIT_COLOUR.") and "did you mean" not in colour.msg
    assert "spelling" in colour.hint and "SILENCED_SYSTEM_CHECKS" in colour.hint
    out = io.StringIO()
    call_command("check", stderr=out)
    assert "Rename it RATELIMIT_RULES." in out.getvalue()


def test_django_ratelimits_settings_and_ours_are_not_flagged() -> None:
    with override_settings(**DEFAULTS):
        assert found(checks.check_settings(), "W008") == []


@override_settings(
    RATELIMIT_RULES=[
        {**IP_RULE, "url_name": "admin:logn", "path": "/admin/"},
        {**IP_RULE, "name": "bare", "url_name": ["login", "admin:logout"]},
        {**IP_RULE, "name": "far", "url_name": "zzzzzz"},
    ]
)
def test_a_url_name_no_pattern_has_is_named_with_the_closest() -> None:
    typo, no_namespace, far = found(checks.check_rule_urls(), "W009")
    assert typo.msg.endswith("Rule 'r', url_name 'admin:logn': did you mean 'admin:login'?")
    assert no_namespace.msg.endswith("Rule 'bare', url_name 'login': did you mean 'admin:login'?")
    assert far.msg.endswith("Rule 'far', url_name 'zzzzzz'.")
    assert "with its namespace ('accounts:login')" in typo.hint and "'path'" in typo.hint
    assert typo.level == WARNING


@override_settings(RATELIMIT_RULES=[{**IP_RULE, "url_name": "admin:login", "path": "/admin/"}])
def test_a_url_name_the_urlconf_has_passes() -> None:
    assert checks.check_rule_urls() == []


@pytest.mark.usefixtures("clean_registry")
def test_a_decorator_without_a_rate_is_named() -> None:
    @ratelimit(key="ip")
    def unlimited(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    @ratelimit(key="ip", rate=lambda group, request: None)
    def decided_per_request(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    (message,) = found(checks.check_decorators(), "W010")
    assert message.level == WARNING
    assert message.msg.endswith(f"{__name__}.{unlimited.__qualname__}.")
    assert "rate='5/m'" in message.hint and "remove the decorator" in message.hint
    assert unlimited(RequestFactory().get("/")).status_code == 200  # as django-ratelimit


def test_the_middleware_without_the_app_installed_says_to_add_it() -> None:
    apps = [a for a in settings.INSTALLED_APPS if a != "ratelimit_app"]
    with override_settings(INSTALLED_APPS=apps), pytest.raises(ImproperlyConfigured) as caught:
        RatelimitMiddleware(lambda request: HttpResponse("ok"))
    msg = str(caught.value)
    assert msg.startswith("RatelimitMiddleware needs 'ratelimit_app' in INSTALLED_APPS: add it")
    assert "migrate" in msg


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        # No rule keyed on the user, but the admin may add one.
        ({}, "Rules added in the admin may be keyed on the user."),
        (
            {"RATELIMIT_DENY": ["user:7"]},
            "'user:<id>' entries in RATELIMIT_DENY. Rules added in the admin may be keyed on "
            "the user.",
        ),
    ],
)
def test_the_middleware_before_authentication_is_reported(
    changes: dict[str, Any], words: str
) -> None:
    with override_settings(
        RATELIMIT_RULES=[IP_RULE], MIDDLEWARE=[RL_MIDDLEWARE, AUTH_MIDDLEWARE], **changes
    ):
        (message,) = found(checks.check_rules(), "W004")
    assert message.msg.endswith(words)
    assert message.hint == "Move RatelimitMiddleware after AuthenticationMiddleware in MIDDLEWARE."


@pytest.mark.usefixtures("clean_registry")
def test_a_bare_decorator_fails_at_import_and_says_to_add_parentheses() -> None:
    size = len(registry)
    with pytest.raises(TypeError) as caught:

        @ratelimit  # type: ignore[arg-type]
        def view(request: HttpRequest) -> HttpResponse:
            return HttpResponse("ok")

    msg = str(caught.value)
    assert "view has no parentheses: use @ratelimit(key=..., rate=...)" in msg
    assert "@ratelimit(key='ip', rate='5/m')" in msg
    assert len(registry) == size
