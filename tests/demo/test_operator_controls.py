"""The demo's dry-run rule (``signup-strict``) and its costly link pages (``link-pages``),
through the demo's URLconf, middleware and rules."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from demo_site.shortener.models import Link
from ratelimit_app.testing import frozen_clock
from tests.demo.test_accounts import TestSignup, assert_demo_429

T0 = 1_800_000_000.0


def test_the_strict_sign_up_rule_runs_dry(caplog: pytest.LogCaptureFixture) -> None:
    with frozen_clock(T0), caplog.at_level(logging.INFO, logger="ratelimit_app"):
        codes = [TestSignup.sign_up(Client(), n, ip="203.0.113.40") for n in range(5)]
    assert codes == [302] * 5  # "signup-strict" (3/h) would refuse the last two
    found = [r.getMessage() for r in caplog.records if "dry run" in r.getMessage()]
    assert len(found) == 2
    assert all("signup-strict would refuse POST /accounts/signup/" in m for m in found)


def test_a_link_page_costs_ten_of_the_hours_three_hundred(client: Client) -> None:
    Link.objects.create(key="abc", url="https://example.com/")
    with frozen_clock(T0):
        codes = [
            client.get("/links/abc/", REMOTE_ADDR="203.0.113.41").status_code for _ in range(30)
        ]
        refused = client.get("/links/abc/", REMOTE_ADDR="203.0.113.41")
        other = client.get("/links/abc/", REMOTE_ADDR="203.0.113.42")
    assert codes == [200] * 30
    assert_demo_429(refused, "link-pages")
    assert other.status_code == 200
