"""Named limits from elsewhere than RATELIMIT_RULES (:mod:`ratelimit_app.config.sources`): the
operations, the admin and the system checks find them there, never by importing their module."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from django.test import override_settings

from ratelimit_app import checks
from ratelimit_app.config import sources
from ratelimit_app.config.limits import Limit
from ratelimit_app.operators import operations
from ratelimit_app.operators.admin import UsageForm


@pytest.fixture
def empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """No source registered, as when the throttles were never imported."""
    monkeypatch.setattr(sources, "_sources", {})


@pytest.fixture
def api() -> Limit:
    return operations.find_limit("api", key="ip", rate="5/m")


def register(prefix: str, found: dict[str, Limit], problems: Sequence[str] = ()) -> list[str]:
    """Register ``found`` under ``prefix``; returns the log of the source's calls."""
    calls: list[str] = []

    def limits() -> dict[str, Limit]:
        calls.append("limits")
        return found

    def mistakes(patterns: Sequence[Any]) -> list[str]:
        calls.append("problems")
        return list(problems)

    sources.register(prefix, kind="test throttle", limits=limits, problems=mistakes)
    return calls


@pytest.mark.usefixtures("empty")
def test_a_name_is_looked_up_in_its_own_source_only(api: Limit) -> None:
    calls = register("fake", {"fake:api": api})
    assert sources.limit("other:api") is None
    assert sources.limit("api") is None
    assert calls == []  # another prefix, or none: the source is not asked
    assert sources.limit("fake:api") is api
    assert sources.limit("fake:nope") is None
    assert [s.prefix for s in sources.registered()] == ["fake"]
    assert sources.get("fake") is not None and sources.get("drf") is None


@pytest.mark.django_db
@pytest.mark.usefixtures("empty")
def test_the_operations_find_a_registered_limit(api: Limit) -> None:
    with pytest.raises(ValueError, match="No rule named 'fake:api'"):
        operations.find_limit("fake:api")
    register("fake", {"fake:api": api})
    assert operations.find_limit("fake:api") is api


class Token:
    """An object a source stands a limit for, as a throttle class."""


@pytest.mark.usefixtures("empty")
def test_the_operations_resolve_an_object_through_its_source(api: Limit) -> None:
    with pytest.raises(ValueError, match="no rule, group or throttle"):
        operations.find_limit(Token)
    register("plain", {})  # a source that resolves nothing is skipped
    seen: list[object] = []

    def resolve(obj: object) -> Limit | None:
        seen.append(obj)
        return api if obj is Token else None

    sources.register("fake", kind="test", limits=dict, problems=list, resolve=resolve)
    assert operations.find_limit(Token) is api
    assert sources.resolve(object) is None
    assert seen == [Token, object]


@pytest.mark.django_db
@pytest.mark.usefixtures("empty")
def test_the_admin_offers_registered_limits(api: Limit) -> None:
    assert not [n for n, _ in UsageForm().fields["rule"].choices if n.startswith("fake:")]
    register("fake", {"fake:api": api})
    choices = dict(UsageForm().fields["rule"].choices)
    assert choices["fake:api"] == "fake:api — test throttle, 5/m"


@override_settings(REST_FRAMEWORK={})
@pytest.mark.usefixtures("empty")
def test_the_checks_report_the_drf_sources_problems() -> None:
    register("fake", {}, ["not DRF's"])
    assert checks.check_throttling() == []  # DRF's source never registered: nothing to check
    calls = register(sources.DRF, {}, ["a mistake"])
    [message] = checks.check_throttling()
    assert (message.id, calls) == ("ratelimit_app.E021", ["problems"])
    assert message.msg.endswith(" a mistake")


def test_the_throttles_register_themselves() -> None:
    throttling = pytest.importorskip("ratelimit_app.throttling")
    source = sources.get(sources.DRF)
    assert source is not None and source.kind == "DRF throttle"
    assert (source.limits, source.problems, source.resolve) == (
        throttling.scope_limits,
        throttling.problems,
        throttling.resolve,
    )
