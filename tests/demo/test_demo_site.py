"""The demo site's limited home page, through the real URLconf and middleware."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

from ratelimit_app.backends import reset_backends

DEMO = {
    "ROOT_URLCONF": "demo_site.urls",
    "MIDDLEWARE": [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "ratelimit_app.middleware.RatelimitMiddleware",
    ],
    "CACHES": {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "ratelimit": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "demo-test",
        },
    },
    "RATELIMIT_USE_CACHE": "ratelimit",
    # No flusher thread or signal handler in the test process: flush() by hand.
    "METRICS_FLUSH_INTERVAL": 0,
    "METRICS_HANDLE_SIGTERM": False,
    "METRICS_QUERY_DOWNSAMPLE": None,
}


@pytest.fixture(autouse=True)
def demo_settings() -> object:
    with override_settings(**DEMO):
        reset_backends()
        yield
    reset_backends()


@pytest.mark.django_db
def test_home_page_shows_usage_then_answers_429() -> None:
    client = Client(REMOTE_ADDR="192.0.2.99")
    pages = [client.get("/") for _ in range(6)]
    assert [p.status_code for p in pages] == [200] * 5 + [429]
    assert b"5/m: 1 used, 4 left" in pages[0].content
    assert b"5/m: 5 used, 0 left" in pages[4].content
    assert int(pages[5]["Retry-After"]) > 0
    # The five pages served were counted in memory; a flush puts them in the database.
    import metrics_app

    metrics_app.flush()
    assert b"Visits counted so far: 5" in client.get("/", REMOTE_ADDR="192.0.2.98").content


@pytest.mark.django_db
def test_wrong_admin_passwords_are_limited_per_account() -> None:
    from django.conf import settings
    from django.contrib.auth.models import User

    from demo_site import settings as demo

    User.objects.create_superuser("demo", password="demo")
    client = Client(REMOTE_ADDR="192.0.2.98")
    wrong = {"username": "demo", "password": "nope", "next": "/admin/"}
    with override_settings(RATELIMIT_RULES=demo.RATELIMIT_RULES):
        assert settings.RATELIMIT_RULES[0]["name"] == "admin-login-account"
        codes = [client.post("/admin/login/", wrong).status_code for _ in range(6)]
        assert codes == [200] * 5 + [429]
        right = {"username": "demo", "password": "demo", "next": "/admin/"}
        assert client.post("/admin/login/", right).status_code == 429  # blocked before the view
        other = Client(REMOTE_ADDR="192.0.2.97")
        assert other.post("/admin/login/", {**wrong, "username": "else"}).status_code == 200
