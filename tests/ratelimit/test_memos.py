"""What a check keeps from one request to the next, and how much of it.

A check keeps nothing of its subject: the sliding-window step finds its limit's plan for the
fine bucket (``RUNTIME.plans``, by the limit's scope), so a client never seen costs what a
known one does. The plans are bounded by the limits (and a memo size), never by the
subjects, and a settings change that may change a namespace forgets them.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import RequestFactory, override_settings

from ratelimit_app.config import limits
from ratelimit_app.engine import check_many, sliding_window
from ratelimit_app.identity.namespaces import namespace
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.testing import frozen_clock

T0 = 1_800_000_000.0


def request(ip: str) -> Any:
    return RequestFactory().get("/", REMOTE_ADDR=ip)


def test_a_limit_keeps_no_check_per_subject() -> None:
    limit = limits.build("memo-checks", "ip", "5/m")
    first = limit.check(request("192.0.2.1"))
    assert limit.check(request("192.0.2.1")) == first
    assert not hasattr(limit, "_checks")
    with frozen_clock(T0):
        for i in range(200):
            check_many([limit.check(request(f"198.51.100.{i}"))])  # type: ignore[list-item]
    assert list(RUNTIME.plans) == [first.scope]  # type: ignore[union-attr]


def test_every_subject_finds_its_limit_s_plan_and_a_new_bucket_makes_it_again() -> None:
    limit = limits.build("memo-ready", "ip", "5/m")
    one, two = (limit.check(request(ip)) for ip in ("192.0.2.10", "192.0.2.11"))
    assert one is not None and two is not None
    with frozen_clock(T0) as clock:
        check_many([one])
        made = RUNTIME.plans[one.scope]
        clock.advance(0.1)  # the same fine bucket (one second for '5/m'), another subject
        check_many([two])
        assert RUNTIME.plans[one.scope] is made
        clock.advance(1.0)  # the next one
        check_many([one])
        assert RUNTIME.plans[one.scope] is not made
        assert RUNTIME.plans[one.scope][2] is not made[2]  # its plan


def test_the_plans_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sliding_window, "PLAN_MEMO", 2)
    with frozen_clock(T0):
        for i in range(5):
            limit = limits.build(f"memo-bounded-{i}", "ip", "5/m")
            check_many([limit.check(request("192.0.2.20"))])  # type: ignore[list-item]
            assert len(RUNTIME.plans) <= 2


def test_a_new_secret_key_forgets_the_namespaces_made() -> None:
    limit = limits.build("memo-secret", "ip", "5/m")
    check = limit.check(request("192.0.2.30"))
    assert check is not None
    with frozen_clock(T0):
        before = check_many([check])[0].namespace
        with override_settings(SECRET_KEY="another-secret-key-for-the-memo-test-0123456789"):
            after = check_many([check])[0].namespace
            assert after == namespace(check.scope, *check.subject)
    assert after != before
