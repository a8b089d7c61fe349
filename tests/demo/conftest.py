"""Fixtures for the demo site: its own settings, read as ``make demo`` reads them.

``demo_site/settings.py`` reads the environment and writes its state directory, so it is
never imported here as a module: :func:`load_settings` runs it with a chosen environment and
a temporary state directory and returns its names. The ``site`` fixture then applies the
demo's URLconf, middleware, templates and rules to the test settings (local-memory caches,
the test database, no flusher thread), so requests go through the real site.
"""

from __future__ import annotations

import runpy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.core.cache import caches
from django.test import override_settings

from metrics_app import buffer, query
from ratelimit_app.backends import reset_backends

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_FILE = ROOT / "demo_site" / "settings.py"
#: Every variable the demo's settings read.
VARIABLES = (
    "DATABASE_URL",
    "MEMCACHED_SERVERS",
    "REDIS_URL",
    "DEBUG",
    "ALLOWED_HOSTS",
    "SECRET_KEY",
    "DEMO_STATE_DIR",
)
#: The demo's settings that make the site what it is; the rest stays as tests.settings has it.
SITE_SETTINGS = (
    "ROOT_URLCONF",
    "MIDDLEWARE",
    "TEMPLATES",
    "RATELIMIT_RULES",
    "RATELIMIT_FAILURE_STATUSES",
    "RATELIMIT_FAIL_OPEN",
    "RATELIMIT_USE_CACHE",
    "CACHES",
    "LOGIN_URL",
    "LOGIN_REDIRECT_URL",
    "LOGOUT_REDIRECT_URL",
    "AUTH_PASSWORD_VALIDATORS",
    "REST_FRAMEWORK",
)


def load_settings(state_dir: Path, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The names ``demo_site/settings.py`` defines with exactly ``environ`` (plus
    ``DEMO_STATE_DIR=state_dir``) among the variables it reads."""
    with pytest.MonkeyPatch.context() as patch:
        for name in VARIABLES:
            patch.delenv(name, raising=False)
        patch.setenv("DEMO_STATE_DIR", str(state_dir))
        for name, value in (environ or {}).items():
            patch.setenv(name, value)
        return runpy.run_path(str(SETTINGS_FILE))


@pytest.fixture(scope="session")
def demo_settings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The demo's settings with the embedded defaults (no variable set)."""
    return load_settings(tmp_path_factory.mktemp("demo-state"))


@pytest.fixture(autouse=True)
def site(demo_settings: dict[str, Any], db: None) -> Iterator[None]:
    """Requests go through the demo's URLconf, middleware, templates and rules."""
    overrides = {name: demo_settings[name] for name in SITE_SETTINGS}
    buffer.reset()
    with override_settings(**overrides), mock.patch.object(query, "DOWNSAMPLE_ON_READ", False):
        reset_backends()
        for alias in ("default", "ratelimit"):
            caches[alias].clear()
        yield
        for alias in ("default", "ratelimit"):
            caches[alias].clear()
    reset_backends()
    buffer.reset()


#: The password of the demo user the tests make (:func:`alice`).
PASSWORD = "correct horse battery staple"


@pytest.fixture
def alice(django_user_model: Any) -> User:
    user: User = django_user_model.objects.create_user(
        "alice", email="alice@example.com", password=PASSWORD
    )
    return user
