"""Browser fixtures for the admin: Debian's Chromium driven by Playwright, on a live server.

* ``browser`` (one per package): ``/usr/bin/chromium``, headless, no network of its own. It is
  never downloaded (no ``playwright install``): a missing binary skips the browser tests on a
  developer machine, naming the Debian package ``chromium`` (``make servers`` installs it),
  and fails them under ``CI=true``, like the missing servers of ``tests/conftest.py``.
* ``page``: a fresh context and page per test (1280 x 900, UTC, English).
* ``staff_page``: ``page`` logged in through the real admin login form as a staff user with
  the permissions of the ``staff_permissions`` fixture (override it in a test module to add
  yours).
* :func:`screenshot` saves ``tests/artifacts/<name>.png`` (git-ignored) for a person to look at;
  :func:`pixels` reads a screenshot back, so a test can count what is drawn where.

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
import struct
import zlib
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


def pixels(png: bytes) -> list[list[tuple[int, int, int]]]:
    """The rows of ``(r, g, b)`` of a PNG as Chromium writes screenshots (8 bits a channel,
    RGB or RGBA, not interlaced): what a test needs to count drawn pixels, with no imaging
    library."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, data, header = 8, b"", b""
    while at < len(png):
        (size,) = struct.unpack(">I", png[at : at + 4])
        kind, body = png[at + 4 : at + 8], png[at + 8 : at + 8 + size]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            data += body
        at += 12 + size
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, "an unexpected PNG"
    step = 3 if colour == 2 else 4
    raw = zlib.decompress(data)
    stride = width * step
    rows: list[list[tuple[int, int, int]]] = []
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - step] if i >= step else 0
            up = previous[i]
            corner = previous[i - step] if i >= step else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                guess = left + up - corner
                near = min(
                    (abs(guess - left), 0, left),
                    (abs(guess - up), 1, up),
                    (abs(guess - corner), 2, corner),
                )
                line[i] = (line[i] + near[2]) & 0xFF
        rows.append([(line[x], line[x + 1], line[x + 2]) for x in range(0, stride, step)])
        previous = line
    return rows
