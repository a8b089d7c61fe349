"""Dry run (docs/operators.rst, "Dry run"): a rule's ``"shadow": True``,
``@ratelimit(shadow=True)``, ``get_usage(shadow=True)`` and a DRF throttle's ``shadow``:
nothing is refused; what would be is counted as a refusal would be, logged at INFO and
signalled with ``shadow=True``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path

from ratelimit_app import core
from ratelimit_app.decorators import ratelimit
from ratelimit_app.operators import metrics
from ratelimit_app.signals import ratelimited
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE

T0 = 1_800_000_000.0


@ratelimit(group="shadow-view", key="ip", rate="2/m", shadow=True)
def shadowed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("limited" if request.limited else "ok")


@ratelimit(group="enforced-view", key="ip", rate="2/m")
def enforced(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("shadowed/", shadowed),
    path("enforced/", enforced),
    path("api/", plain),
    path("login/", plain),
]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.usefixtures("backend_kind")]


def rule(name: str, path: str = "/api/", **fields: Any) -> dict[str, Any]:
    return {"name": name, "path": path, "key": "ip", "rate": "2/m", **fields}


class Signals:
    """The ``ratelimited`` signals sent while a test runs: (rule or group, shadow)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bool]] = []
        ratelimited.connect(self.receive)

    def receive(self, sender: Any, group: str, shadow: bool = False, **kwargs: Any) -> None:
        self.sent.append((kwargs.get("rule") or group, shadow))


@pytest.fixture
def signals() -> Iterator[Signals]:
    found = Signals()
    yield found
    ratelimited.disconnect(found.receive)


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    forget_refusals()
    with override_settings(MIDDLEWARE=MIDDLEWARE):
        yield
    forget_refusals()


def statuses(client: Client, url: str, n: int) -> list[int]:
    return [client.get(url).status_code for _ in range(n)]


def test_a_shadow_rule_refuses_nothing_and_reports_what_it_would(
    client: Client, signals: Signals, caplog: pytest.LogCaptureFixture
) -> None:
    with override_settings(RATELIMIT_RULES=[rule("api", shadow=True)]), frozen_clock(T0):
        with caplog.at_level(logging.INFO, logger="ratelimit_app"):
            answers = [client.get("/api/") for _ in range(5)]
        usage = core.lookup("api", "127.0.0.1")
    assert [a.status_code for a in answers] == [200] * 5
    assert all("Retry-After" not in a for a in answers)
    assert signals.sent == [("api", True)] * 3
    lines = [r.getMessage() for r in caplog.records if "dry run" in r.getMessage()]
    assert len(lines) == 3 and all("api would refuse GET /api/" in line for line in lines)
    assert "127.0.0.1" not in caplog.text  # the subject is named by its hash only
    # Counted as enforcing would: the would-be refusals are taken back.
    assert usage is not None and usage["count"] == 2


def test_switching_a_dry_run_to_enforcing_refuses_at_once(client: Client) -> None:
    with frozen_clock(T0):
        with override_settings(RATELIMIT_RULES=[rule("api", shadow=True)]):
            assert statuses(client, "/api/", 4) == [200] * 4
        with override_settings(RATELIMIT_RULES=[rule("api")]):
            assert statuses(client, "/api/", 1) == [429]


def test_a_shadow_rule_leaves_the_real_ones_enforcing(client: Client, signals: Signals) -> None:
    both = [rule("strict", shadow=True), rule("real", rate="3/m")]
    with override_settings(RATELIMIT_RULES=both), frozen_clock(T0):
        assert statuses(client, "/api/", 5) == [200, 200, 200, 429, 429]
    # The 3rd would be refused by "strict" (3 > 2) and is admitted; the 4th is refused by
    # "real" (4 > 3), "strict" still over; the 5th is refused by "real" from memory,
    # "strict" unchecked.
    assert signals.sent == [("strict", True), ("strict", True), ("real", False), ("real", False)]


def test_a_shadow_decorator_does_not_mark_the_request(client: Client, signals: Signals) -> None:
    with frozen_clock(T0):
        answers = [client.get("/shadowed/").content for _ in range(4)]
    assert answers == [b"ok"] * 4
    assert signals.sent == [("shadow-view", True)] * 2


def test_a_refusal_remembered_is_still_reported(client: Client, signals: Signals) -> None:
    """A flood of would-be refusals answered from the refusal memory: each reported."""
    with override_settings(RATELIMIT_RULES=[rule("api", shadow=True)]), frozen_clock(T0):
        assert statuses(client, "/api/", 12) == [200] * 12
    assert signals.sent == [("api", True)] * 10


def test_a_dry_runs_refusals_are_their_own_series(signals: Signals) -> None:
    assert metrics.series_name("api") == "ratelimit:api"
    assert metrics.series_name("api", shadow=True) == "ratelimit-shadow:api"


def test_get_usage_runs_dry_when_told(signals: Signals) -> None:
    request = RequestFactory().get("/")
    with frozen_clock(T0):
        for _ in range(3):
            usage = core.get_usage(
                request, "g-shadow", key="ip", rate="2/m", increment=True, shadow=True
            )
        enforced = core.get_usage(request, "g-shadow", key="ip", rate="2/m")
    assert usage is not None and not usage["should_limit"] and usage["shadow_limited"]
    assert enforced is not None and enforced["should_limit"]  # the same counter, enforcing
    assert signals.sent == [("g-shadow", True)]
