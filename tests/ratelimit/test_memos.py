"""What a check keeps from one request to the next, and how much of it.

A client's requests within one fine bucket make the same check: its limit keeps the
:class:`~ratelimit_app.config.limits.Check` of each recent subject, and the sliding-window
step the subject's namespace, plan and operation for the fine bucket (``RUNTIME.ready``). Both are
bounded (a botnet of new subjects starts them over), and a settings change that may change
a namespace forgets them.
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


def test_a_limit_keeps_one_counted_check_per_subject(monkeypatch: pytest.MonkeyPatch) -> None:
    limit = limits.build("memo-checks", "ip", "5/m")
    first = limit.check(request("192.0.2.1"))
    assert limit.check(request("192.0.2.1")) is first
    assert limit.check(request("192.0.2.1"), increment=False) is not first  # a look: made
    assert limit.check(request("192.0.2.2")) is not first
    monkeypatch.setattr(limits, "CHECK_MEMO", 2)
    limit.check(request("192.0.2.3"))
    assert len(limit._checks) == 1  # full: started over


def test_a_check_finds_its_fine_bucket_made_and_a_new_bucket_makes_it_again() -> None:
    limit = limits.build("memo-ready", "ip", "5/m")
    check = limit.check(request("192.0.2.10"))
    assert check is not None
    key = (check.scope, check.subject)
    with frozen_clock(T0) as clock:
        check_many([check])
        made = RUNTIME.ready[key]
        clock.advance(0.1)  # the same fine bucket (one second for '5/m')
        check_many([check])
        assert RUNTIME.ready[key] is made
        clock.advance(1.0)  # the next one
        check_many([check])
        assert RUNTIME.ready[key] is not made
        assert RUNTIME.ready[key][4] is not made[4]  # its plan


def test_the_ready_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sliding_window, "READY_MEMO", 2)
    limit = limits.build("memo-bounded", "ip", "5/m")
    with frozen_clock(T0):
        for i in range(5):
            check_many([limit.check(request(f"192.0.2.{20 + i}"))])  # type: ignore[list-item]
            assert len(RUNTIME.ready) <= 2


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
