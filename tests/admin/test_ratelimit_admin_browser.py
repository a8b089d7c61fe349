"""The ratelimit admin in a real browser: rules, a rule changed and enforced, usage and reset.

Screenshots go to ``tests/artifacts/ratelimit-*.png``. The live server runs in a thread of
this process, so the rules saved through the browser apply to it at once (the saving process
applies its own change without waiting for the version counter).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from django.core.cache import caches
from django.test.utils import override_settings

import metrics_app
from metrics_app import buffer
from ratelimit_app import store
from tests.admin.conftest import screenshot

if TYPE_CHECKING:
    from playwright.sync_api import Page

SETTINGS_RULE = {
    "name": "settings-login",
    "path": "/accounts/login/",
    "methods": ["POST"],
    "key": "email:username",
    "rate": "5/m;10/d",
    "count": "failures",
}


@pytest.fixture
def staff_permissions() -> list[str]:
    return [
        "ratelimit_app.view_rule",
        "ratelimit_app.add_rule",
        "ratelimit_app.change_rule",
        "ratelimit_app.reset_counters",
        "ratelimit_app.view_accessentry",
        "ratelimit_app.add_accessentry",
        "metrics_app.view_series",
        "ratelimit_app.view_ban",
    ]


@pytest.fixture(autouse=True)
def site(transactional_db: None) -> Iterator[None]:
    """The rules' URLs and a settings rule. (The live server's middleware is the test
    settings', loaded once at its start: RatelimitMiddleware is in it.)"""
    buffer.reset()
    with override_settings(
        ROOT_URLCONF="tests.ratelimit.urls",
        RATELIMIT_RULES=[SETTINGS_RULE],
    ):
        store.forget()
        caches["default"].clear()
        yield
    store.forget()


def statuses(page: Page, url: str, n: int) -> list[int]:
    return [page.request.get(url).status for _ in range(n)]


def test_change_a_rule_see_it_enforced_then_reset_a_subject(
    staff_page: Page, live_server: Any
) -> None:
    page, base = staff_page, live_server.url
    page.goto(f"{base}/admin/ratelimit_app/rule/")
    assert page.locator("#settings-rules").get_by_text("settings-login").is_visible()
    screenshot(page, "ratelimit-rules-empty")

    page.get_by_role("link", name="Add rule").click()
    page.fill("#id_name", "browser-rule")
    page.fill("#id_path", "/rules/named/")
    page.fill("#id_key", "ip")
    page.fill("#id_rate", "2/M")  # a typo: the form says what is wrong
    page.click("input[name=_save]")
    error = page.locator(".field-rate .errorlist")
    assert "Invalid rate '2/M'" in error.inner_text()
    screenshot(page, "ratelimit-rule-error")
    page.fill("#id_rate", "2/m")
    page.click("input[name=_save]")
    page.wait_for_url(f"{base}/admin/ratelimit_app/rule/")
    screenshot(page, "ratelimit-rules")

    # In force at once: the third request in a minute is refused.
    assert statuses(page, f"{base}/rules/named/", 3) == [200, 200, 429]
    refused = page.request.get(f"{base}/rules/named/", headers={"Accept": "application/json"})
    assert refused.status == 429 and refused.json()["rule"] == "browser-rule"

    page.get_by_role("link", name="Usage lookup and reset").click()
    page.select_option("#id_rule", "browser-rule")
    page.fill("#id_subject", "127.0.0.1")
    page.click("input[name=lookup]")
    table = page.locator("#usage table")
    assert table.locator("tbody tr td").nth(1).inner_text() == "2"
    assert "limited" in table.inner_text()
    screenshot(page, "ratelimit-usage")

    page.click("input[name=reset]")
    assert "Reset 127.0.0.1 for rule browser-rule." in page.locator(".messagelist").inner_text()
    assert page.locator("#usage table tbody tr td").nth(1).inner_text() == "0"
    screenshot(page, "ratelimit-usage-reset")
    assert statuses(page, f"{base}/rules/named/", 1) == [200]

    # The refused requests are a metrics series; the rule links to its chart.
    metrics_app.flush()
    page.goto(f"{base}/admin/ratelimit_app/rule/")
    page.get_by_role("link", name="chart").first.click()
    page.wait_for_url("**/admin/metrics_app/series/**")
    assert "ratelimit:browser-rule" in page.content()
    screenshot(page, "ratelimit-rule-chart")


def test_deny_list_entry(staff_page: Page, live_server: Any) -> None:
    page, base = staff_page, live_server.url
    page.goto(f"{base}/admin/ratelimit_app/accessentry/add/")
    page.select_option("#id_list", "deny")
    page.fill("#id_value", "10.0.0.0/33")
    page.click("input[name=_save]")
    assert "10.0.0.0/33" in page.locator(".field-value .errorlist").inner_text()
    page.fill("#id_value", "203.0.113.0/24")
    page.fill("#id_note", "scraper, see ticket 42")
    page.click("input[name=_save]")
    page.wait_for_url(f"{base}/admin/ratelimit_app/accessentry/")
    assert page.get_by_role("link", name="203.0.113.0/24").is_visible()
    screenshot(page, "ratelimit-access-list")
    denied = store.current().deny
    assert denied.has_ip("203.0.113.9")


def test_a_ban_seen_in_the_usage_lookup_and_the_bans_list(
    staff_page: Page, live_server: Any
) -> None:
    """A rule saved with a ban bans a client; the usage lookup shows the ban and its end, the
    Bans list has it, and a reset lifts it."""
    from ratelimit_app.models import Rule

    page, base = staff_page, live_server.url
    Rule.objects.create(
        name="banning",
        path="/rules/named/",
        key="ip",
        rate="1/m",
        ban_after=2,
        ban_within="10m",
        ban_for="1h",
        ban_max="1d",
    )
    assert statuses(page, f"{base}/rules/named/", 4) == [200, 429, 429, 429]
    refused = page.request.get(f"{base}/rules/named/")
    assert refused.status == 429 and int(refused.headers["retry-after"]) > 3000

    page.goto(f"{base}/admin/ratelimit_app/rule/usage/")
    page.select_option("#id_rule", "banning")
    page.fill("#id_subject", "127.0.0.1")
    page.click("input[name=lookup]")
    assert "Banned until" in page.locator("#ban").inner_text()
    screenshot(page, "ratelimit-usage-banned")

    page.goto(f"{base}/admin/ratelimit_app/ban/")
    # The list shows the address as RATELIMIT_REFUSED_SUBJECTS does: its /24 by default.
    shown = page.locator("#result_list").inner_text()
    assert "127.0.0.0/24" in shown and "127.0.0.1" not in shown
    screenshot(page, "ratelimit-bans")

    page.goto(f"{base}/admin/ratelimit_app/rule/usage/")
    page.select_option("#id_rule", "banning")
    page.fill("#id_subject", "127.0.0.1")
    page.click("input[name=reset]")
    assert page.locator("#ban").count() == 0
    assert statuses(page, f"{base}/rules/named/", 1) == [200]
