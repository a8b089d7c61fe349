"""Browser fixtures for the admin: Debian's Chromium driven by Playwright, on a live server.

* ``browser`` (one per package): ``/usr/bin/chromium``, headless, no network of its own. It is
  never downloaded (no ``playwright install``): a missing binary skips the browser tests on a
  developer machine, naming the Debian package ``chromium`` (``make servers`` installs it),
  and fails them under ``CI=true``, like the missing servers of ``tests/conftest.py``.
* ``page``: a fresh context and page per test (1280 x 900, UTC, English).
* ``staff_page``: ``page`` logged in through the real admin login form as a staff user with
  the permissions of the ``staff_permissions`` fixture (override it in a test module to add
  yours).
* :func:`screenshot` saves ``tests/artifacts/<name>.png`` (git-ignored) for a person to look at.

Why the package scope and ``DJANGO_ALLOW_ASYNC_UNSAFE``: Playwright's sync API runs its event
loop in a greenlet of the main thread, and while it lives ``asyncio.get_running_loop()``
returns that loop even in plain synchronous code. Django then refuses ORM calls from the test
(``SynchronousOnlyOperation``: nothing is async here, the check is a false alarm), so the
variable is set while the browser is up and restored after. The same running loop would
break every asyncio test that runs later (``asyncio.run() cannot be called from a running
event loop``), so the browser is closed at the end of this package instead of the session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import in_ci

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """A headless Chromium for the package's tests (see the module docstring for the scope)."""
    if not CHROMIUM.exists():
        message = (
            f"{CHROMIUM} not found: the admin browser tests need the Debian package chromium "
            "(`sudo apt-get install chromium`, or `make servers` as root)"
        )
        if in_ci():
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A new page in its own context: 1280 x 900, light colour scheme, UTC, en-US."""
    context = browser.new_context(
        viewport={"width": 1280, "height": 900},
        locale="en-US",
        timezone_id="UTC",
        color_scheme="light",
    )
    context.set_default_timeout(15_000)
    new_page = context.new_page()
    yield new_page
    context.close()


@pytest.fixture
def staff_permissions() -> list[str]:
    """``app_label.codename`` permissions of the ``staff_page`` user; override to change."""
    return ["metrics_app.view_series"]


@pytest.fixture
def staff_user(django_user_model: Any, staff_permissions: list[str], live_server: Any) -> Any:
    """A staff user (not a superuser) holding ``staff_permissions``."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("staff", password=PASSWORD, is_staff=True)
    for dotted in staff_permissions:
        app_label, codename = dotted.split(".", 1)
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return user


def admin_login(page: Page, base_url: str, username: str, password: str = PASSWORD) -> None:
    """Log in through the admin's own login form and wait for the admin index."""
    page.goto(f"{base_url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("#login-form [type=submit]")
    page.wait_for_url(f"{base_url}/admin/")


@pytest.fixture
def staff_page(page: Page, staff_user: Any, live_server: Any) -> Page:
    """``page``, logged in as ``staff_user`` through the admin login form."""
    admin_login(page, live_server.url, staff_user.get_username())
    return page


def screenshot(page: Page, name: str, *, full_page: bool = True) -> Path:
    """Save ``tests/artifacts/<name>.png`` and return its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path
