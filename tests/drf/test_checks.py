"""The system checks of DRF throttles (E020, E021), and DRF as an optional extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from ratelimit_app import checks

ROOT = Path(__file__).resolve().parents[2]
OURS = ["ratelimit_app.throttling.AnonRateThrottle", "ratelimit_app.throttling.UserRateThrottle"]


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def test_a_missing_drf_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rest_framework", None)  # import fails, as uninstalled
    with override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_CLASSES": OURS}):
        [message] = checks.check_throttling()
    assert message.id == "ratelimit_app.E020"
    assert "ratelimit_app.throttling.AnonRateThrottle" in message.msg
    assert "django-bucketry[drf]" in message.hint
    with override_settings(REST_FRAMEWORK={}):
        assert checks.check_throttling() == []  # DRF not needed: no error


def test_good_throttles_pass() -> None:
    settings = {"DEFAULT_THROTTLE_CLASSES": OURS, "DEFAULT_THROTTLE_RATES": {"anon": "5/m;100/d"}}
    with override_settings(REST_FRAMEWORK=settings):
        assert checks.check_throttling() == []
        call_command("check", fail_level="ERROR")


@pytest.mark.parametrize(
    ("rest_framework", "found"),
    [
        ({"DEFAULT_THROTTLE_RATES": {"anon": "10/M"}}, "['DEFAULT_THROTTLE_RATES']['anon']"),
        ({"DEFAULT_THROTTLE_RATES": {"anon": "10/mo"}}, "'10/mo'"),
        ({"NUM_PROXIES": "1"}, "NUM_PROXIES"),
        ({"NUM_PROXIES": -1}, "NUM_PROXIES"),
        (
            {"DEFAULT_THROTTLE_CLASSES": ["ratelimit_app.throttling.UserRateThrotle"]},
            "UserRateThrotle",
        ),
    ],
)
def test_each_setting_mistake(rest_framework: dict[str, Any], found: str) -> None:
    config = {"DEFAULT_THROTTLE_CLASSES": OURS, **rest_framework}
    with override_settings(REST_FRAMEWORK=config):
        messages = checks.check_throttling()
    assert ids(messages) == ["ratelimit_app.E021"]
    assert found in messages[0].msg


@override_settings(ROOT_URLCONF="tests.drf.bad_views")
def test_each_view_mistake_names_the_view_and_the_class() -> None:
    with override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"anon": "5/m"}}):
        messages = checks.check_throttling()
    assert ids(messages) == ["ratelimit_app.E021"] * 3
    text = "\n".join(m.msg for m in messages)
    assert "tests.drf.bad_views.BadRateView, BadRate: " in text and "'10/M'" in text
    assert "LeakyView, TwoRatesLeaky: " in text
    assert "UnknownScopeView, ScopedRateThrottle: " in text
    assert "No default throttle rate set for 'nowhere' scope" in text
    assert "NoRate" not in text and "UnscopedView" not in text


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_nothing_imports_drf_unless_the_throttles_are_used() -> None:
    """The limiter, the middleware, the decorator, the admin and the checks run without
    importing Django REST framework (it is an optional extra)."""
    found = _python(
        "import sys, django; django.setup()\n"
        "from django.core.management import call_command\n"
        "import ratelimit_app.core, ratelimit_app.middleware, ratelimit_app.decorators\n"
        "import ratelimit_app.operators.admin, metrics_app.admin\n"
        "call_command('check')\n"
        "print('rest_framework' in sys.modules)\n"
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip().splitlines()[-1] == "False"


def test_the_throttles_without_drf_say_what_to_install() -> None:
    found = _python(
        "import sys; sys.modules['rest_framework'] = None\n"
        "import django; django.setup()\n"
        "import ratelimit_app.throttling\n"
    )
    assert found.returncode != 0
    assert "ratelimit_app.throttling needs Django REST framework" in found.stderr
    assert "pip install 'django-bucketry[drf]'" in found.stderr
