"""A page of another site full of the demo's short links, read in a real browser, does not get
its reader banned (docs/operators.rst, "Which requests count toward a ban").

The demo's ``shorturl-scan`` rule bans an address from the whole site after 5 refusals of
wrong short keys. The "forum" page here, on another site (``127.0.0.1`` against the live
server's ``localhost``: another host, so cross-site, and both are potentially trustworthy
origins, to which Chromium sends Fetch Metadata), holds 35 ``<img>`` of unknown short keys.
Here rather than in ``tests/demo`` because the browser lives in this package.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.core.cache import caches
from django.test.utils import override_settings

from ratelimit_app import store
from ratelimit_app.backends import reset_backends
from ratelimit_app.models import Ban
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.demo.conftest import SITE_SETTINGS, load_settings

if TYPE_CHECKING:
    from playwright.sync_api import Page

T0 = 1_800_000_000.0
IMAGES = 35


@pytest.fixture(scope="module")
def demo_settings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return load_settings(Path(tmp_path_factory.mktemp("demo-state")))


@pytest.fixture(autouse=True)
def site(demo_settings: dict[str, Any], transactional_db: None) -> Iterator[None]:
    """The demo's URLconf, middleware and rules, with no count, ban or refusal left."""
    overrides = {name: demo_settings[name] for name in SITE_SETTINGS}
    with override_settings(**overrides):
        reset_backends()
        store.forget()
        forget_refusals()
        for alias in ("default", "ratelimit"):
            caches[alias].clear()
        yield
        for alias in ("default", "ratelimit"):
            caches[alias].clear()
    store.forget()
    forget_refusals()
    reset_backends()


@pytest.fixture
def forum(live_server: Any) -> Iterator[str]:
    """The address of a page on another site (a server of its own on ``127.0.0.1``; Chromium
    lets only a loopback page reach the loopback live server) whose images are ``IMAGES``
    unknown short keys of the demo."""
    images = "".join(f'<img src="{live_server.url}/s/zz{n}" alt="">' for n in range(IMAGES))

    class Forum(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = images.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forum)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/forum/"
    server.shutdown()
    server.server_close()
    thread.join()


def read(page: Page, url: str) -> int:
    """Open the page at ``url``; how many of its short-link images were answered. (Their
    statuses are the server's to tell: Chromium's opaque-response blocking drops an HTML
    answer to an ``<img>`` of another site before the page sees it.)"""
    done: list[str] = []
    for event in ("requestfinished", "requestfailed"):
        page.on(event, lambda r: done.append(r.url) if "/s/zz" in r.url else None)
    page.goto(url, wait_until="load")  # the load event waits for every image
    return len(done)


def test_a_page_of_images_does_not_ban_its_reader(
    page: Page, live_server: Any, forum: str
) -> None:
    site = live_server.url
    assert site.startswith("http://localhost:")  # another host than the forum's
    with frozen_clock(T0):
        assert read(page, forum) == IMAGES
        refused = page.goto(f"{site}/s/zz1")  # the images used the reader's budget up
        home = page.goto(f"{site}/")
        login = page.goto(f"{site}/accounts/login/")
    assert refused is not None and refused.status == 429
    assert home is not None and home.status == 200
    assert login is not None and login.status == 200
    assert not Ban.objects.exists()
