"""Refused lately in a real browser: the page as the docs show it, its usage button.

The screenshot goes to ``tests/artifacts/ratelimit-refused.png`` (docs/_static/admin keeps
a copy for docs/admin.rst).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from django.core.cache import caches
from django.test import RequestFactory
from django.test.utils import override_settings

import metrics_app
from metrics_app import buffer
from ratelimit_app import store
from ratelimit_app.operators import metrics
from tests.admin.conftest import screenshot

if TYPE_CHECKING:
    from playwright.sync_api import Page

RULES = [
    {"name": "login-by-ip", "path": "/rules/named/", "key": "ip", "rate": "1/m"},
    {"name": "login-by-email", "path": "/accounts/login/", "key": "email", "rate": "5/m"},
    {"name": "api-by-user", "path": "/api/", "key": "user", "rate": "100/h"},
]


@pytest.fixture
def staff_permissions() -> list[str]:
    return [
        "ratelimit_app.view_rule",
        "ratelimit_app.view_rule",
        "ratelimit_app.reset_counters",
        "ratelimit_app.view_ban",
    ]


@pytest.fixture(autouse=True)
def site(transactional_db: None) -> Iterator[None]:
    buffer.reset()
    with override_settings(ROOT_URLCONF="tests.ratelimit.urls", RATELIMIT_RULES=RULES):
        store.forget()
        caches["default"].clear()
        yield
    store.forget()
    buffer.reset()


def refusals(rule: str, n: int, subject: str, **request: Any) -> None:
    """``n`` refusals of ``rule`` as the ``ratelimited`` signal reports them."""
    user = request.pop("user", None)
    made = RequestFactory().post("/", request.pop("data", {}), **request)
    if user is not None:
        made.user = user
    for _ in range(n):
        metrics._remember(None, group=rule, subject=subject, request=made, rule=rule)


def test_the_page_lists_who_was_refused_and_looks_one_up(
    staff_page: Page, live_server: Any, django_user_model: Any
) -> None:
    page, base = staff_page, live_server.url
    assert [page.request.get(f"{base}/rules/named/").status for _ in range(4)] == [
        200,
        429,
        429,
        429,
    ]
    refusals("login-by-ip", 41, "{a1}", REMOTE_ADDR="203.0.113.77")
    refusals("login-by-ip", 7, "{a2}", REMOTE_ADDR="2001:db8:4:2::17")
    refusals("login-by-email", 12, "{e1}", data={"email": "Mallory@Example.org"})
    member = django_user_model.objects.create_user("scraper-bot")
    refusals("api-by-user", 230, "{u1}", user=member)
    metrics_app.flush()

    page.goto(f"{base}/admin/ratelimit_app/rule/refused/")
    tables = page.locator(".refused")
    assert tables.count() == 3
    text = page.locator("#content-main").inner_text()
    for shown in ("203.0.113.0/24", "2001:db8:4:2::/64", "…@example.org", "scraper-bot"):
        assert shown in text
    assert "203.0.113.77" not in text and "mallory" not in text.lower()
    # Nothing wider than the window, the numbers right-aligned in their column.
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    screenshot(page, "ratelimit-refused")

    page.locator(".refused", has_text="api-by-user").locator("input[name=lookup]").click()
    page.wait_for_url(f"{base}/admin/ratelimit_app/rule/usage/")
    assert page.locator("#usage").is_visible()
