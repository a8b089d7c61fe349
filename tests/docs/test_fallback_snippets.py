"""docs/operators.rst's fallback snippet, run as printed: the log-in rule counts in memory
while its server is down, and the setting turns the fallback on for every limit."""

from __future__ import annotations

from typing import Any

from django.test import override_settings

from ratelimit_app.conf import conf
from ratelimit_app.config.rules import parse_rule
from tests.docs.snippets import snippet

RUNS = [("operators", 7)]


def run() -> dict[str, Any]:
    shown = snippet("operators", 7, '"fallback": "memory"', 'RATELIMIT_FALLBACK = "memory"')
    namespace: dict[str, Any] = {"__name__": "docs_operators"}
    exec(compile(shown.code, shown.where, "exec"), namespace)  # (our own docs)
    return namespace


def test_the_login_rule_falls_back_and_the_setting_turns_it_on_for_all() -> None:
    found = run()
    (login,) = [parse_rule(raw) for raw in found["RATELIMIT_RULES"]]
    assert login.policy.fallback is True and not login.fail_open
    assert login.failures_only
    with override_settings(RATELIMIT_FALLBACK=found["RATELIMIT_FALLBACK"]):
        assert conf.FALLBACK is True
    with override_settings(RATELIMIT_FALLBACK=None):
        assert conf.FALLBACK is False
