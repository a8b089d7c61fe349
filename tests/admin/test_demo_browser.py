"""The demo's pages in a real browser: a link's chart and its zoom, the form's errors, the
429 of link creation and the 404 of an unknown key (with DEBUG on, as ``make demo`` runs).

Here rather than in ``tests/demo`` because the browser lives in this package (see
``conftest.py``); the demo's settings are applied as ``tests/demo/conftest.py`` applies them.
Screenshots: ``tests/artifacts/demo-*.png``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import pytest
from django.core.cache import caches
from django.test.utils import override_settings

import metrics_app
from demo_site.shortener.models import Link
from metrics_app import buffer, query
from metrics_app.testing import frozen_clock
from ratelimit_app.backends import reset_backends
from ratelimit_app.testing import forget_refusals
from ratelimit_app.testing import frozen_clock as frozen_ratelimit_clock
from tests.admin.conftest import screenshot
from tests.demo.conftest import SITE_SETTINGS, load_settings

if TYPE_CHECKING:
    from playwright.sync_api import Page

NOW = datetime(2026, 11, 22, 13, 5, tzinfo=UTC)
MINUTE, HOUR = 60, 3600


@pytest.fixture(scope="module")
def demo_settings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return load_settings(Path(tmp_path_factory.mktemp("demo-state")))


@pytest.fixture(autouse=True)
def site(demo_settings: dict[str, Any], transactional_db: None) -> Iterator[None]:
    """The demo's URLconf, templates and rules; a frozen metrics clock; a link with visits
    every few minutes of the last day (none at night)."""
    overrides = {name: demo_settings[name] for name in SITE_SETTINGS}
    buffer.reset()
    with (
        override_settings(**overrides),
        mock.patch.object(query, "DOWNSAMPLE_ON_READ", False),
        frozen_clock(NOW) as clock,
    ):
        reset_backends()
        forget_refusals()
        for alias in ("default", "ratelimit"):
            caches[alias].clear()
        Link.objects.create(key="docs", url="https://example.com/docs")
        now = int(clock.t)
        for t in range(now - 24 * HOUR, now, 7 * MINUTE):
            if 6 <= datetime.fromtimestamp(t, tz=UTC).hour < 23:
                metrics_app.record("shorturl:docs", 1 + (t // (7 * MINUTE)) % 4, at=t)
        metrics_app.flush()
        yield
        for alias in ("default", "ratelimit"):
            caches[alias].clear()
    forget_refusals()
    reset_backends()
    buffer.reset()


def test_a_links_chart_and_its_zoom(page: Page, live_server: Any) -> None:
    page.goto(f"{live_server.url}/links/docs/")
    marks = page.locator("svg.bkt-chart g.bkt-mark")
    assert marks.count() == 145
    assert "one bar per 10 minutes" in page.locator(".stats").inner_text()
    screenshot(page, "demo-link")
    page.select_option("#zoom-hour", "2026-11-22T09:00")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**/links/docs/?period=24h&zoom=2026-11-22T09%3A00")
    assert marks.count() == 60
    assert "one bar per 1 minute" in page.locator(".stats").inner_text()
    screenshot(page, "demo-link-zoomed")
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    screenshot(page, "demo-link-zoomed-narrow")


def test_an_ftp_link_is_said_once_why(page: Page, live_server: Any) -> None:
    page.goto(f"{live_server.url}/")
    page.fill("#id_url", "ftp://example.com/file")
    page.get_by_role("button", name="Shorten").click()
    errors = page.locator(".errorlist li")
    assert errors.all_inner_texts() == [
        "Links starting with ftp: cannot be shortened: http and https only."
    ]
    assert page.locator("#id_url").input_value() == "ftp://example.com/file"
    screenshot(page, "demo-form-error")


def test_the_eleventh_link_is_not_created(page: Page, live_server: Any) -> None:
    with frozen_ratelimit_clock(1_800_000_000):
        for n in range(10):
            page.goto(f"{live_server.url}/")
            page.fill("#id_url", f"https://example.com/{n}")
            page.get_by_role("button", name="Shorten").click()
            page.wait_for_url("**/links/*/")
        page.goto(f"{live_server.url}/")
        page.fill("#id_url", "https://example.com/one-more")
        page.get_by_role("button", name="Shorten").click()
        text = page.locator("form .errorlist").inner_text()
    assert text.startswith("Your link was not created: links are limited to 10/m")
    assert page.locator("#id_url").input_value() == "https://example.com/one-more"
    assert Link.objects.filter(url="https://example.com/one-more").count() == 0
    screenshot(page, "demo-not-created")


@pytest.mark.parametrize("path", ["/s/nope", "/links/nope/"])
def test_an_unknown_key_gets_the_demos_404_with_debug_on(
    page: Page, live_server: Any, path: str
) -> None:
    with override_settings(DEBUG=True):
        answer = page.goto(f"{live_server.url}{path}")
    assert answer is not None and answer.status == 404
    assert page.locator("h1").inner_text() == "Nothing here"
    assert page.get_by_role("link", name="home page").is_visible()
    screenshot(page, f"demo-404{path.replace('/', '-').rstrip('-')}")
