"""Each known limit's ``admitted`` and ``refused`` series exist from 0 before its first
decision (docs/observability.rst): settings rules when the exporter connects, database rules
when the configuration in force changes, a decorator's group and a throttle's scope when
first seen. And the documented ``RateLimitRefusalSpike`` alert, which needs yesterday's
refused series of a limit that refused nothing yesterday, fires.

:func:`spike` evaluates the documented expression's logic (PromQL's ``rate``, ``offset``,
``sum by``, ``>`` and ``and`` on instant vectors, ``for``) over what Prometheus would have
scraped from the real exporter every 30 s; tests/ratelimit/test_promtool.py runs the rule
itself through ``promtool test rules``.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path
from prometheus_client import REGISTRY, CollectorRegistry

from ratelimit_app import store
from ratelimit_app.core import get_usage
from ratelimit_app.engine import checking
from ratelimit_app.operators import telemetry
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = telemetry.REQUESTS
T0 = 1_800_000_000.0
DAY = 86_400.0
_unique = itertools.count()


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("spiky/", plain), path("steady/", plain)]
pytestmark = pytest.mark.urls(__name__)


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    forget_refusals()
    with override_settings(MIDDLEWARE=MIDDLEWARE):
        yield
    forget_refusals()


def rule(name: str, where: str = "/spiky/", rate: str = "2/m") -> dict[str, Any]:
    return {"name": name, "path": where, "key": "ip", "rate": rate}


def value(registry: CollectorRegistry, limit: str, decision: str) -> float | None:
    return registry.get_sample_value(REQUESTS, {"limit": limit, "decision": decision})


# -- series from 0 -----------------------------------------------------------------------


def test_a_settings_rules_series_are_0_when_the_exporter_connects() -> None:
    """What :func:`ratelimit_app.operators.telemetry.connect` does with the limits known then."""
    name = f"series-{next(_unique)}"
    registry = CollectorRegistry()
    with override_settings(RATELIMIT_RULES=[rule(name)]):
        telemetry.Telemetry([telemetry.Prometheus(registry)]).welcome_configured()
    assert value(registry, name, "admitted") == 0.0
    assert value(registry, name, "refused") == 0.0


def test_a_new_configurations_rules_are_0_before_their_first_decision(client: Client) -> None:
    """The exporter connected at start-up: a rule of a later configuration has its series at
    the next decision of any limit."""
    name = f"series-{next(_unique)}"
    with override_settings(RATELIMIT_RULES=[rule(name, where="/nowhere/")]):
        store.current()
        get_usage(RequestFactory().get("/"), group=f"other-{name}", key="ip", rate="5/m")
        assert value(REGISTRY, name, "admitted") == 0.0
        assert value(REGISTRY, name, "refused") == 0.0


@pytest.mark.django_db
def test_a_database_rules_series_are_0_before_its_first_decision() -> None:
    from ratelimit_app.models import Rule

    name = f"series-db-{next(_unique)}"
    Rule.objects.create(name=name, path="/nowhere/", key="ip", rate="2/m")
    store.forget()
    store.current()
    get_usage(RequestFactory().get("/"), group=f"other-{name}", key="ip", rate="5/m")
    assert value(REGISTRY, name, "admitted") == 0.0
    assert value(REGISTRY, name, "refused") == 0.0


@pytest.mark.django_db
def test_a_rule_saved_in_the_admin_is_0_before_any_decision() -> None:
    """The process that saves a rule (the admin's) makes its series at once: a rule whose
    very first decision comes before any other limit's is not born at 1 there."""
    from ratelimit_app.models import Rule

    name = f"series-saved-{next(_unique)}"
    Rule.objects.create(name=name, path="/nowhere/", key="ip", rate="2/m")
    assert value(REGISTRY, name, "admitted") == 0.0
    assert value(REGISTRY, name, "refused") == 0.0


def test_a_decorators_group_is_refused_from_0_after_its_first_admission() -> None:
    group = f"series-group-{next(_unique)}"
    get_usage(RequestFactory().get("/"), group=group, key="ip", rate="5/m", increment=True)
    assert value(REGISTRY, group, "admitted") == 1.0
    assert value(REGISTRY, group, "refused") == 0.0


@pytest.mark.parametrize(
    ("cache", "kind"),
    [
        ("django.core.cache.backends.locmem.LocMemCache", "cache"),
        ("django.core.cache.backends.dummy.DummyCache", "dummy"),
    ],
)
def test_the_backends_series_are_0_before_its_first_round_trip(cache: str, kind: str) -> None:
    """The counters' backend: its errors and its round trips' histogram exist from 0 when
    the exporter connects, so ``increase()`` and the backend errors alert count the first."""
    registry = CollectorRegistry()
    with override_settings(CACHES={"default": {"BACKEND": cache}}):
        telemetry.Telemetry([telemetry.Prometheus(registry)]).welcome_configured()
    labels = {"backend": kind}
    assert registry.get_sample_value(telemetry.BACKEND_ERRORS, labels) == 0.0
    assert registry.get_sample_value(f"{telemetry.BACKEND_SECONDS}_count", labels) == 0.0


def test_welcomed_labels_hold_only_limit_names() -> None:
    """A rule's path, key or rate never becomes a label: only its name."""
    name = f"series-{next(_unique)}"
    registry = CollectorRegistry()
    keyed = {**rule(name, where="/secret-path/"), "key": "header:x-secret-header"}
    with override_settings(RATELIMIT_RULES=[keyed]):
        telemetry.Telemetry([telemetry.Prometheus(registry)]).welcome_configured()
    found = {
        (s.labels["limit"], s.labels["decision"])
        for m in registry.collect()
        for s in m.samples
        if s.name == REQUESTS
    }
    assert found == {(name, "admitted"), (name, "refused")}


# -- the documented alert ----------------------------------------------------------------

#: The documented expression, whitespace folded; :func:`spike` evaluates exactly this.
SPIKE = (
    'sum by (limit) (rate(bucketry_ratelimit_requests_total{decision=~"refused|banned"}[5m])) '
    '> 5 * sum by (limit) (rate(bucketry_ratelimit_requests_total{decision=~"refused|banned"}'
    "[5m] offset 1d)) "
    'and sum by (limit) (rate(bucketry_ratelimit_requests_total{decision=~"refused|banned"}'
    "[5m])) > 1"
)
RANGE = 300.0  # [5m]
FOR = 600.0  # for: 10m
EVERY = 60.0  # the rule's evaluation interval
SCRAPE = 30.0


def documented_rule(alert: str) -> tuple[str, str]:
    """(expr, for) of ``alert`` in docs/observability.rst's alerting rules."""
    text = (ROOT / "docs/observability.rst").read_text()
    block = text[text.index(f"- alert: {alert}") :]
    block = block[: block.index("- alert:", 10)]
    expr = re.search(r"expr: \|\n((?:\s{13,}.*\n)+)", block)
    assert expr is not None, block
    held = re.search(r"for: (\S+)", block)
    assert held is not None, block
    return " ".join(expr.group(1).split()), held.group(1)


Series = dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]


def scrape(registry: CollectorRegistry, at: float, into: Series) -> None:
    for metric in registry.collect():
        for s in metric.samples:
            if s.name == REQUESTS:
                into[tuple(sorted(s.labels.items()))].append((at, s.value))


def rates(series: Series, at: float) -> dict[str, float]:
    """``sum by (limit) (rate(requests{decision=~"refused|banned"}[5m]))`` at ``at``: a
    series with fewer than two samples in the range has no rate, and a limit none of whose
    series has one is absent (no extrapolation: it changes no comparison here)."""
    found: dict[str, float] = {}
    for labels, samples in series.items():
        tags = dict(labels)
        if tags["decision"] not in ("refused", "banned"):
            continue
        inside = [(t, v) for t, v in samples if at - RANGE < t <= at]
        if len(inside) < 2:
            continue
        (t1, v1), (t2, v2) = inside[0], inside[-1]
        found[tags["limit"]] = found.get(tags["limit"], 0.0) + (v2 - v1) / (t2 - t1)
    return found


def spike(series: Series, at: float) -> set[str]:
    """The limits :data:`SPIKE` returns at ``at``: ``A > 5 * B`` keeps the limits in both
    sides (one-to-one on ``limit``) where it holds; ``and A > 1`` those also over 1/s."""
    now, yesterday = rates(series, at), rates(series, at - DAY)
    return {k for k, a in now.items() if k in yesterday and a > 5 * yesterday[k] and a > 1}


def fires(series: Series, end: float) -> set[str]:
    """The limits the alert fires for at ``end``: true at every evaluation for 10 minutes."""
    points = [end - FOR + i * EVERY for i in range(int(FOR / EVERY) + 1)]
    found = spike(series, points[0])
    for at in points[1:]:
        found &= spike(series, at)
    return found


def test_the_refusal_spike_alert_fires_for_a_limit_that_refused_nothing_yesterday(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    expr, held = documented_rule("RateLimitRefusalSpike")
    assert (expr, held) == (SPIKE, "10m"), "the evaluation below no longer matches the docs"
    spiky, steady = f"spiky-{next(_unique)}", f"steady-{next(_unique)}"
    registry = CollectorRegistry()
    series: Series = defaultdict(list)
    rules = [rule(spiky), rule(steady, where="/steady/")]
    with override_settings(RATELIMIT_RULES=rules), frozen_clock(T0 - DAY - 15 * 60) as now:
        # The process starts yesterday: connect() welcomes the limits it knows.
        exporter = telemetry.Telemetry([telemetry.Prometheus(registry)])
        exporter.welcome_configured()
        monkeypatch.setattr(checking.HOOKS, "observers", [exporter.observe])
        for day, busy in ((-DAY, 0), (0.0, 40)):
            now.set(T0 + day - 15 * 60)
            for step in range(int(15 * 60 / SCRAPE)):
                # Yesterday the spiky limit admitted one request a minute and refused none;
                # today it refuses about 1.3 a second. The steady one refuses alike each day.
                n = busy or (1 if step % 2 == 0 else 0)
                for _ in range(n):
                    client.get("/spiky/", REMOTE_ADDR="192.0.2.1")
                for _ in range(40):
                    client.get("/steady/", REMOTE_ADDR="192.0.2.2")
                now.advance(SCRAPE)
                scrape(registry, now(), series)
    assert value(registry, spiky, "refused") and value(registry, steady, "refused")
    assert fires(series, T0) == {spiky}
