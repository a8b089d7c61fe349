from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import WARNING
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import RequestFactory, override_settings

from ratelimit_app import checks
from ratelimit_app.backends.cache import CacheBackend
from ratelimit_app.decorators import ratelimit, registry

LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
DUMMY = {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}


MEMCACHED = {
    "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
    "LOCATION": "127.0.0.1:11211",  # never contacted: checks only read the settings
}


@pytest.fixture(autouse=True)
def good_baseline() -> Any:
    with override_settings(CACHES={"default": MEMCACHED}):
        yield


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def all_messages() -> list[Any]:
    return (
        checks.check_cache()
        + checks.check_settings()
        + checks.check_decorators()
        + checks.check_rules()
    )


RULE = {"name": "r", "path": "/x/", "key": "ip", "rate": "5/m"}
RL_MIDDLEWARE = "ratelimit_app.middleware.RatelimitMiddleware"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"RATELIMIT_USE_CACHE": "missing"}, "ratelimit_app.E001"),
        ({"RATELIMIT_IPV4_MASK": 33}, "ratelimit_app.E003"),
        ({"RATELIMIT_IPV6_MASK": "64"}, "ratelimit_app.E004"),
        ({"RATELIMIT_TRUSTED_PROXIES": ["10.0.0.0/33"]}, "ratelimit_app.E005"),
        ({"RATELIMIT_TRUSTED_PROXIES": "10.0.0.1"}, "ratelimit_app.E005"),
        ({"RATELIMIT_HASH_ALGORITHM": "hashlib.nope"}, "ratelimit_app.E006"),
        ({"RATELIMIT_VIEW": "no.such.view"}, "ratelimit_app.E007"),
        ({"RATELIMIT_EXCEPTION_CLASS": "no.such.Class"}, "ratelimit_app.E007"),
        ({"RATELIMIT_CACHE_PREFIX": "rl: "}, "ratelimit_app.E008"),
        ({"RATELIMIT_IP_META_KEY": 5}, "ratelimit_app.E011"),
        ({"RATELIMIT_IP_META_KEY": "no.such.function"}, "ratelimit_app.E011"),
        (
            {
                "CACHES": {
                    "default": {
                        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
                        "LOCATION": "",
                    }
                }
            },
            "ratelimit_app.E013",
        ),
        ({"RATELIMIT_RULES": [{**RULE, "rate": "5/M"}]}, "ratelimit_app.E014"),
        ({"RATELIMIT_RULES": [RULE, RULE]}, "ratelimit_app.E014"),
        ({"RATELIMIT_ALLOW": ["10.0.0.0/33"]}, "ratelimit_app.E015"),
        ({"RATELIMIT_DENY": "10.0.0.1"}, "ratelimit_app.E015"),
        ({"RATELIMIT_DENY": ["user:"]}, "ratelimit_app.E015"),
        ({"RATELIMIT_FAILURE_STATUSES": [401, "403"]}, "ratelimit_app.E016"),
        ({"RATELIMIT_FAILURE_STATUSES": 401}, "ratelimit_app.E016"),
        ({"RATELIMIT_RULES": [RULE], "MIDDLEWARE": []}, "ratelimit_app.W003"),
        (
            {
                "RATELIMIT_RULES": [{**RULE, "key": "user"}],
                "MIDDLEWARE": [RL_MIDDLEWARE, AUTH_MIDDLEWARE],
            },
            "ratelimit_app.W004",
        ),
        ({"CACHES": {"default": LOCMEM}}, "ratelimit_app.W001"),
        ({"CACHES": {"default": DUMMY}}, "ratelimit_app.W005"),
        ({"RATELIMIT_HIERARCHICAL": False}, "ratelimit_app.W008"),  # (never released)
        # Not a backend, an abstract one, one built with other arguments (a configuration
        # mistake, never a connection failure at request time).
        ({"RATELIMIT_BACKEND": LOCMEM["BACKEND"]}, "ratelimit_app.E018"),
        ({"RATELIMIT_BACKEND": "ratelimit_app.backends.base.Backend"}, "ratelimit_app.E018"),
        ({"RATELIMIT_BACKEND": f"{__name__}.ThreeArguments"}, "ratelimit_app.E018"),
        ({"RATELIMIT_BACKEND": "no.such.Backend"}, "ratelimit_app.E007"),
        (
            {
                "CACHES": {
                    "default": {
                        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                        "LOCATION": "/tmp/x",
                    }
                }
            },
            "ratelimit_app.W002",
        ),
    ],
)
def test_each_check(settings: dict[str, Any], expected: str) -> None:
    assert expected not in ids(all_messages())
    with override_settings(**settings):
        assert expected in ids(all_messages())


@override_settings(
    RATELIMIT_RULES=[RULE, {**RULE, "name": "user", "key": "user"}],
    MIDDLEWARE=[AUTH_MIDDLEWARE, RL_MIDDLEWARE],
)
def test_good_rules_pass() -> None:
    assert checks.check_rules() == []


@override_settings(RATELIMIT_RULES=[RULE, {**RULE, "name": "login", "key": "cookie:x"}])
def test_rule_errors_name_the_rule_and_the_field() -> None:
    (message,) = [m for m in checks.check_rules() if m.id == "ratelimit_app.E014"]
    assert "'login'" in message.msg and "'key'" in message.msg and "cookie:x" in message.msg


#: A rule with four mistakes: a path without its leading '/', an unknown key, a rate in the
#: wrong case, and a block that is not a boolean.
FOUR_MISTAKES = {
    "name": "signup",
    "path": "signup/",
    "key": "cookie:x",
    "rate": "5/M",
    "block": "yes",
}


@override_settings(RATELIMIT_RULES=[RULE, FOUR_MISTAKES])
def test_every_mistake_of_a_rule_is_reported_in_one_run() -> None:
    """One ``check`` run names all four mistakes, not the first one only."""
    messages = [m for m in checks.check_rules() if m.id == "ratelimit_app.E014"]
    fields = [re.findall(r"field '(\w+)'", m.msg) for m in messages]
    assert fields == [["path"], ["key"], ["rate"], ["block"]]
    assert all("Rule 'signup'" in m.msg for m in messages)
    with pytest.raises(SystemCheckError) as caught:
        call_command("check")
    shown = str(caught.value)
    assert shown.count("ratelimit_app.E014") == 4
    for words in ("'signup/'", "cookie:x", "'5/M'", "'yes'"):
        assert words in shown, words


def test_every_mistake_of_a_decorator_is_reported_in_one_run() -> None:
    before = dict(registry)
    try:

        @ratelimit(key="cookie:x", rate="5/M", method=5, algorithm="leaky", burst=0)
        def five_mistakes(request: Any) -> None:
            pass

        errors = [m.msg for m in checks.check_decorators() if "five_mistakes" in m.msg]
        assert len(errors) == 5
        for words, error in zip(
            ("Method 5", "cookie:x", "'5/M'", "algorithm 'leaky'", "Burst 0"), errors, strict=True
        ):
            assert words in error
        with pytest.raises(ImproperlyConfigured) as caught:
            five_mistakes(RequestFactory().get("/"))
        assert "cookie:x" in str(caught.value) and "Burst 0" in str(caught.value)
    finally:
        registry.clear()
        registry.update(before)


def test_bad_decorators_are_reported_with_the_view_and_the_string() -> None:
    before = dict(registry)
    try:

        @ratelimit(key="ip", rate="10/M")
        def bad_rate(request: Any) -> None:
            pass

        @ratelimit(key="cookie:x", rate="10/m")
        def bad_key(request: Any) -> None:
            pass

        @ratelimit(key="ip", rate="1/x")
        class BadClass:
            def dispatch(self, request: Any) -> None:
                pass

        errors = [m for m in checks.check_decorators() if m.id == "ratelimit_app.E010"]
        assert len(errors) == 3
        assert "BadClass" in errors[2].msg
        assert "bad_rate" in errors[0].msg and "'10/M'" in errors[0].msg
        assert "bad_key" in errors[1].msg and "cookie:x" in errors[1].msg
    finally:
        registry.clear()
        registry.update(before)


@override_settings(RATELIMIT_IP_META_KEY="HTTP_X_REAL_IP")
def test_a_plain_meta_key_is_fine() -> None:
    assert "ratelimit_app.E011" not in ids(all_messages())


class ThreeArguments(CacheBackend):
    """A backend whose constructor wants more than the contract's ``(alias, cache)``."""

    def __init__(self, alias: str, cache: Any, servers: list[str]) -> None:
        super().__init__(alias, cache)


def test_dummy_cache_is_a_warning_that_says_why() -> None:
    with override_settings(CACHES={"default": DUMMY}):
        (message,) = checks.check_cache()
    assert message.level == WARNING and "stores nothing" in message.msg
    assert message.hint and "LocMemCache" in message.hint
    # A backend of one's own decides without the cache: no warning about the cache.
    with override_settings(
        CACHES={"default": DUMMY}, RATELIMIT_BACKEND=f"{__name__}.ThreeArguments"
    ):
        assert "ratelimit_app.W005" not in ids(checks.check_cache())


@pytest.mark.parametrize(
    "path",
    [
        "ratelimit_app.backends.cache.CacheBackend",
        "ratelimit_app.backends.memcached.MemcachedBackend",
        "ratelimit_app.backends.redis.RedisBackend",
        "ratelimit_app.backends.redis.RedisClusterBackend",
    ],
)
def test_every_builtin_backend_passes_as_the_setting(path: str) -> None:
    with override_settings(RATELIMIT_BACKEND=path):
        assert not [m for m in checks.check_settings() if m.id.endswith(("E007", "E018"))]


def test_backend_setting_errors_name_the_setting_and_the_problem() -> None:
    with override_settings(RATELIMIT_BACKEND=f"{__name__}.ThreeArguments"):
        (message,) = [m for m in checks.check_settings() if m.id == "ratelimit_app.E018"]
    assert "RATELIMIT_BACKEND" in message.msg and "servers" in message.msg
    with override_settings(RATELIMIT_BACKEND="ratelimit_app.backends.base.Backend"):
        (message,) = [m for m in checks.check_settings() if m.id == "ratelimit_app.E018"]
    assert "delete, run_many" in message.msg


def test_manage_py_check_passes_with_good_settings() -> None:
    call_command("check", fail_level="WARNING")


def test_every_id_is_documented_once() -> None:
    text = (Path(__file__).parents[2] / "docs" / "checks.rst").read_text()
    documented = re.findall(r"^``ratelimit_app\.([EW]\d{3})``", text, re.M)
    assert sorted(documented) == sorted(checks.MESSAGES)
