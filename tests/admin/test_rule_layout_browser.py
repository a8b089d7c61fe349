"""The rules pages' layout in a real browser: what is in force is what a person sees first.

The settings rules are the demo's kind (several paths, hyphenated names), which used to sit
below an empty database list and a tall filter sidebar, with names broken at their hyphens.
Screenshots go to ``tests/artifacts/ratelimit-layout-*.png``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from django.test.utils import override_settings

from ratelimit_app import store
from ratelimit_app.models import Rule
from tests.admin.conftest import admin_login, screenshot

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page

DOORS = [
    "/accounts/login/",
    "/admin/login/",
    "/accounts/password_change/",
    "/admin/password_change/",
    "/api/",
]
RULES: list[dict[str, Any]] = [
    {"name": "login-account", "path": DOORS, "methods": ["POST"], "key": "email:username",
     "rate": "100/d", "count": "failures"},
    {"name": "login-ip", "path": DOORS, "methods": ["POST"], "key": "ip",
     "rate": "20/m;200/d", "count": "failures"},
    {"name": "password-reset", "path": "/accounts/password_reset/", "methods": ["POST"],
     "key": "email", "rate": "5/h"},
    {"name": "password-reset-ip", "path": "/accounts/password_reset/", "methods": ["POST"],
     "key": "ip", "rate": "10/h;30/d"},
]  # fmt: skip
#: The viewport's height: the first screen a person sees.
SCREEN = 900


@pytest.fixture(autouse=True)
def site(transactional_db: None) -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.ratelimit.urls", RATELIMIT_RULES=RULES):
        store.forget()
        yield
    store.forget()


@pytest.fixture
def admin_page(page: Page, django_user_model: Any, live_server: Any) -> Page:
    """``page``, logged in as a superuser: every link and filter of the rules pages."""
    django_user_model.objects.create_superuser("root", password="correct horse battery staple")
    admin_login(page, live_server.url, "root")
    return page


def text_lines(cell: Locator) -> int:
    """How many lines the text of ``cell`` takes, as drawn."""
    return int(
        cell.evaluate(
            """el => {
                const range = document.createRange();
                range.selectNodeContents(el);
                return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size;
            }"""
        )
    )


def test_the_rules_in_force_come_first(admin_page: Page, live_server: Any) -> None:
    page = admin_page
    page.goto(f"{live_server.url}/admin/ratelimit_app/rule/")
    screenshot(page, "ratelimit-layout-rules-empty")
    screenshot(page, "ratelimit-layout-rules-empty-screen", full_page=False)

    first = page.locator("#settings-rules tbody tr").first
    box = first.bounding_box()
    assert box is not None and box["y"] < 400, box
    for name in ("password-reset-ip", "login-account"):
        cell = page.locator("#settings-rules td", has_text=name).first
        assert text_lines(cell) == 1, name
    # No empty table, no "0 rules", no filters for a list with nothing in it.
    empty = page.locator("#no-database-rules")
    assert "No database rules yet" in empty.inner_text()
    empty.get_by_role("link", name="add one").click()
    page.wait_for_url("**/admin/ratelimit_app/rule/add/")
    page.go_back()
    assert page.locator("#changelist-filter").count() == 0
    assert page.locator("#result_list").count() == 0
    assert page.get_by_role("link", name="Usage lookup and reset").is_visible()


def test_database_rules_follow_the_settings_rules(admin_page: Page, live_server: Any) -> None:
    page = admin_page
    for n in range(3):
        Rule.objects.create(
            name=f"api-write-{n}", path="/api/\n/api/v2/", key="user_or_ip", rate="30/m"
        )
    page.goto(f"{live_server.url}/admin/ratelimit_app/rule/")
    screenshot(page, "ratelimit-layout-rules")

    settings_box = page.locator("#settings-rules").bounding_box()
    database_box = page.locator("#result_list").bounding_box()
    assert settings_box is not None and database_box is not None
    assert settings_box["y"] < 400 and settings_box["y"] < database_box["y"]
    assert database_box["y"] < SCREEN  # both lists start on the first screen
    name = page.locator("#result_list .field-name").first
    assert text_lines(name) == 1
    assert page.locator("#changelist-filter").count() == 0  # three rules: nothing to filter


def test_the_rule_form_puts_the_fields_first(admin_page: Page, live_server: Any) -> None:
    page = admin_page
    page.goto(f"{live_server.url}/admin/ratelimit_app/rule/add/")
    screenshot(page, "ratelimit-layout-rule-form")
    screenshot(page, "ratelimit-layout-rule-form-screen", full_page=False)

    boxes = {
        field: page.locator(f"#id_{field}").bounding_box()
        for field in ("name", "path", "key", "rate")
    }
    note = page.locator(".field-note").bounding_box()
    assert note is not None and all(boxes.values())
    assert all(box["y"] < note["y"] for box in boxes.values() if box), (boxes, note)
    assert all(box["y"] < SCREEN for box in boxes.values() if box)  # on the first screen
    # The admin renders help text as HTML: the key's placeholders must not vanish as tags.
    assert "'email:<field>'" in page.locator(".field-key .help").inner_text()
