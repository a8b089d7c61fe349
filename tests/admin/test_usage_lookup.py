"""The usage lookup shows waits as people read them
(``ratelimit_app.operators.admin.format_duration``)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.core.cache import caches
from django.test import Client, override_settings

from ratelimit_app import core, store
from ratelimit_app.operators.admin import format_duration
from ratelimit_app.testing import frozen_clock

T0 = 1_800_000_000.0
USAGE = "/admin/ratelimit_app/rule/usage/"
RULE = {"name": "daily", "path": "/rules/named/", "key": "ip", "rate": "5/m;2/d"}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (-3, "0 s"),
        (0.2, "1 s"),  # a wait is never shown as none
        (1, "1 s"),
        (45, "45 s"),
        (59, "59 s"),
        (59.01, "1 min"),
        (60, "1 min"),
        (61, "1 min 1 s"),
        (90, "1 min 30 s"),
        (3599, "59 min 59 s"),
        (3600, "1 h"),
        (3601, "1 h 0 min 1 s"),
        (3660, "1 h 1 min"),
        (86399, "23 h 59 min 59 s"),
        (86400, "1 d"),
        (86401, "1 d"),  # three units at most: the seconds of a day-long wait are left out
        (86460, "1 d 0 h 1 min"),
        (87154, "1 d 0 h 12 min"),
        (90061, "1 d 1 h 1 min"),
        (7 * 86400, "7 d"),
        (10**9, "11574 d 1 h 46 min"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.fixture
def site(db: None) -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.ratelimit.urls", RATELIMIT_RULES=[RULE]):
        store.forget()
        caches["default"].clear()
        yield
    store.forget()


@pytest.fixture
def admin_client_(site: None) -> Client:
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def test_the_usage_page_shows_readable_waits(client: Client, admin_client_: Client) -> None:
    with frozen_clock(T0) as clock:
        assert [client.get("/rules/named/").status_code for _ in range(3)] == [200, 200, 429]
        clock.advance(754)
        page = admin_client_.post(USAGE, {"rule": "daily", "subject": "127.0.0.1"})
        usage = core.lookup("daily", "127.0.0.1")
    assert usage is not None
    text = page.content.decode()
    table = text[text.index('id="usage"') :]
    assert "empty in (s)" not in table and ">empty in<" in table
    cells = re.findall(r'<td><span title="(\d+) seconds?">([^<]*)</span></td>', table)
    assert cells == [(str(r["reset"]), format_duration(r["reset"])) for r in usage["rates"]]
    # The day's window (about a day less the 754 seconds gone: the oldest bucket counts in
    # full), in days, hours and minutes, not 87,000-odd seconds.
    day = cells[1]
    assert re.fullmatch(r"(1 d 0 h|23 h) \d+ min", day[1]), day
    wait = format_duration(usage["retry_after"])
    assert re.fullmatch(r"(1 d 0 h|23 h) \d+ min", wait), wait
    assert f"The next request is admitted in {wait}." in table
