"""Messages for the usual first mistakes say what is wrong and what to write instead."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import InvalidCacheBackendError
from django.core.exceptions import ValidationError
from django.test import override_settings

from ratelimit_app import checks
from ratelimit_app.backends import backend_class
from ratelimit_app.config.rules import parse_rules
from ratelimit_app.models import Rule

RULE = {"name": "peruser", "path": "/x/", "key": "user", "rate": "5/m"}
RL_MIDDLEWARE = "ratelimit_app.middleware.RatelimitMiddleware"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"


def only(messages: list[Any], code: str) -> str:
    (message,) = [m for m in messages if m.id == f"ratelimit_app.{code}"]
    return str(message.msg)


@override_settings(RATELIMIT_RULES=RULE)
def test_rules_given_as_one_dict_ask_for_a_list() -> None:
    msg = only(checks.check_rules(), "E014")
    assert "RATELIMIT_RULES must be a list of rule dicts (got a dict)" in msg
    assert "write RATELIMIT_RULES = [{...}, ...]" in msg
    assert "field" not in msg and "'RATELIMIT_RULES'" not in msg
    (error,) = parse_rules(RULE)[1]
    assert str(error) == error.problem  # the log line too: no rule or field to name


@pytest.mark.parametrize(
    ("caches", "words"),
    [
        ({}, ["'default'", "CACHES is empty", "add a 'default' cache to CACHES", "exists"]),
        (
            {"other": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
            ["'default'", "(it has 'other')", "add a 'default' cache", "one of those"],
        ),
    ],
)
def test_a_missing_cache_alias_names_it_and_the_fix(
    caches: dict[str, Any], words: list[str]
) -> None:
    with override_settings(CACHES=caches):
        msg = only(checks.check_cache(), "E001")
        with pytest.raises(InvalidCacheBackendError) as caught:
            backend_class("default")
    assert "CACHES has" not in msg and "; " not in msg
    for text in (msg, str(caught.value)):
        for word in words:
            assert word in text, (word, text)


@override_settings(
    RATELIMIT_RULES=[RULE, {**RULE, "name": "either", "key": "user_or_ip"}],
    MIDDLEWARE=[RL_MIDDLEWARE, AUTH_MIDDLEWARE],
)
def test_middleware_order_warning_lists_the_rules_plainly() -> None:
    msg = only(checks.check_rules(), "W004")
    assert msg.endswith("fall back to the IP. Rules keyed on the user: 'peruser', 'either'.")
    assert "(rules" not in msg and ")." not in msg


@pytest.mark.parametrize(
    ("key", "words", "suggestion"),
    [
        ("ipp", "Unknown key 'ipp': use one of", "(did you mean 'ip'?)"),
        ("usr", "Unknown key 'usr': use one of", "(did you mean 'user'?)"),
        ("heder:x", "Unknown key 'heder:x': use one of", "(did you mean 'header:x'?)"),
        ("zzz", "Unknown key 'zzz': use one of", ""),
    ],
)
def test_a_mistyped_database_key_is_a_typo_not_code(key: str, words: str, suggestion: str) -> None:
    rule = Rule(name="typo", path="/x/", key=key, rate="5/m")
    with pytest.raises(ValidationError) as caught:
        rule.clean()  # the form's validation, without the database
    (msg,) = caught.value.message_dict["key"]
    assert words in msg and suggestion in msg
    assert "ip, user, user_or_ip" in msg and "header:<name>" in msg
    assert "code" not in msg and "RATELIMIT_RULES" not in msg


def test_a_dotted_database_key_is_still_code() -> None:
    rule = Rule(name="code", path="/x/", key="os.getcwd", rate="5/m")
    with pytest.raises(ValidationError) as caught:
        rule.clean()  # the form's validation, without the database
    (msg,) = caught.value.message_dict["key"]
    assert "dotted paths are code: put such a rule in RATELIMIT_RULES" in msg
