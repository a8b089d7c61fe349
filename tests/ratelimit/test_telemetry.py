"""The exporters (docs/observability.rst): every decision counted once, through the
middleware, a decorator and a DRF throttle, in Prometheus's default registry and through the
OpenTelemetry SDK's in-memory reader; round trips and backend errors by kind of backend; no
subject, path or unbounded value in any label.

Prometheus's default registry lives as long as the process: every test reads deltas.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import REGISTRY, generate_latest
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from ratelimit_app import core, throttling
from ratelimit_app.backends import reset_backends
from ratelimit_app.backends.base import Backend
from ratelimit_app.backends.cache import CacheBackend
from ratelimit_app.backends.dummy import DummyBackend
from ratelimit_app.backends.memcached import MemcachedBackend
from ratelimit_app.backends.redis import RedisBackend, RedisClusterBackend
from ratelimit_app.core import get_usage
from ratelimit_app.decorators import ratelimit
from ratelimit_app.engine import checking, enforce
from ratelimit_app.operators import telemetry
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.peers.conftest import closed_port  # noqa: F401  (a fixture)
from tests.ratelimit.conftest import MIDDLEWARE

T0 = 1_800_000_000.0
ROOT = Path(__file__).resolve().parents[2]
REQUESTS = telemetry.REQUESTS
_unique = itertools.count()


@ratelimit(group="telemetry-view", key="ip", rate="2/m")
def decorated(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("decorated/", decorated), path("api/", plain)]

pytestmark = pytest.mark.urls(__name__)


@functools.cache
def otel_reader() -> InMemoryMetricReader:
    """The process's OpenTelemetry SDK, set once (as a project sets it, after Django has
    started: the instruments made at ``ready()`` forward to it)."""
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def otel_points(name: str) -> Iterator[Any]:
    """The data points of the meter ``bucketry``'s instrument ``name`` (round trips queued
    for the histogram recorded first, as the recorder thread does every half second)."""
    telemetry.record_queued()
    data = otel_reader().get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            metrics_ = [m for m in sm.metrics if m.name == name]
            if sm.scope.name == "bucketry" and metrics_:
                yield from metrics_[0].data.data_points


def otel_value(name: str, **labels: str) -> float:
    """The cumulative value (a counter's sum, a histogram's count) of ``name`` for ``labels``."""
    found = 0.0
    for point in otel_points(name):
        if dict(point.attributes or {}) == labels:
            found += getattr(point, "value", None) or getattr(point, "count", 0) or 0.0
    return found


def prometheus_value(name: str, **labels: str) -> float:
    """A counter's value, or a histogram's count."""
    found = REGISTRY.get_sample_value(name, labels)
    if found is None:
        found = REGISTRY.get_sample_value(name + "_count", labels)
    return found or 0.0


class Deltas:
    """What each library counted of ``name`` since it was marked, per label set."""

    def __init__(self) -> None:
        otel_reader()
        self._start: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, float]] = {}

    def mark(self, name: str, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self._start[key] = (prometheus_value(name, **labels), otel_value(name, **labels))

    def of(self, name: str, **labels: str) -> tuple[float, float]:
        """(Prometheus, OpenTelemetry) since :meth:`mark` (since 0 when not marked)."""
        key = (name, tuple(sorted(labels.items())))
        p0, o0 = self._start.get(key, (0.0, 0.0))
        return prometheus_value(name, **labels) - p0, otel_value(name, **labels) - o0

    def decisions(self, limit: str) -> dict[str, float]:
        """Each decision's count of ``limit`` (both libraries must agree)."""
        found = {}
        for decision in enforce.OUTCOMES:
            prom, otel = self.of(REQUESTS, limit=limit, decision=decision)
            assert prom == otel, (limit, decision, prom, otel)
            if prom:
                found[decision] = prom
        return found


@pytest.fixture
def deltas() -> Deltas:
    return Deltas()


@pytest.fixture
def name() -> str:
    return f"tele-{next(_unique)}"


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    forget_refusals()
    with override_settings(MIDDLEWARE=MIDDLEWARE):
        yield
    forget_refusals()


def statuses(client: Client, url: str, n: int, **extra: Any) -> list[int]:
    return [client.get(url, **extra).status_code for _ in range(n)]


def rule(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "path": "/api/", "key": "ip", "rate": "2/m", **fields}


# -- each way in -------------------------------------------------------------------------


@pytest.mark.usefixtures("backend_kind")
def test_the_middleware_counts_each_decision_once(
    client: Client, deltas: Deltas, name: str, backend_kind: str
) -> None:
    kind = {"locmem": "cache"}.get(backend_kind, backend_kind)
    deltas.mark(telemetry.BACKEND_SECONDS, backend=kind)
    with override_settings(RATELIMIT_RULES=[rule(name)]), frozen_clock(T0):
        assert statuses(client, "/api/", 5) == [200, 200, 429, 429, 429]
    assert deltas.decisions(name) == {"admitted": 2, "refused": 3}
    # Two admitted and the first refusal went to the counters; the rest were refused from
    # memory, without a round trip.
    assert deltas.of(telemetry.BACKEND_SECONDS, backend=kind) == (3, 3)


def test_a_decorator_is_counted_under_its_group(client: Client, deltas: Deltas) -> None:
    for d in enforce.OUTCOMES:
        deltas.mark(REQUESTS, limit="telemetry-view", decision=d)
    with frozen_clock(T0):
        assert statuses(client, "/decorated/", 3, REMOTE_ADDR="192.0.2.31") == [200, 200, 429]
    assert deltas.decisions("telemetry-view") == {"admitted": 2, "refused": 1}


def test_a_drf_throttle_is_counted_under_its_scope(deltas: Deltas, name: str) -> None:
    throttle = type("T", (throttling.AnonRateThrottle,), {"scope": name, "rate": "2/m"})

    class View(APIView):
        throttle_classes = [throttle]

        def get(self, request: Any) -> Response:
            return Response("ok")

    view = View.as_view()
    with frozen_clock(T0):
        codes = [view(APIRequestFactory().get("/")).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    assert deltas.decisions(f"drf:{name}") == {"admitted": 2, "refused": 1}


def test_a_dry_run_is_counted_as_a_shadow_refusal(
    client: Client, deltas: Deltas, name: str
) -> None:
    with override_settings(RATELIMIT_RULES=[rule(name, shadow=True)]), frozen_clock(T0):
        assert statuses(client, "/api/", 4) == [200] * 4
    assert deltas.decisions(name) == {"admitted": 2, "shadow_refused": 2}


@pytest.mark.django_db
def test_a_ban_is_counted_as_banned(client: Client, deltas: Deltas, name: str) -> None:
    ban = {"after": 2, "within": "1h", "for": "10m"}
    with override_settings(RATELIMIT_RULES=[rule(name, rate="1/m", ban=ban)]), frozen_clock(T0):
        assert statuses(client, "/api/", 5) == [200, 429, 429, 429, 429]
    found = deltas.decisions(name)
    assert found["admitted"] == 1 and found["refused"] == 1
    assert found["banned"] == 3  # the refusal that bans, and those the ban refuses


def test_a_look_is_not_a_decision(deltas: Deltas, name: str) -> None:
    request = RequestFactory().get("/")
    for _ in range(3):
        get_usage(request, group=name, key="ip", rate="2/m", increment=False)
    get_usage(request, group=name, key="ip", rate="2/m", increment=True)
    assert deltas.decisions(name) == {"admitted": 1}


# -- a backend failure ------------------------------------------------------------------


def test_a_backend_failure_counts_each_limit_open_or_closed_and_one_error(
    client: Client, deltas: Deltas, name: str, request: pytest.FixtureRequest
) -> None:
    port = request.getfixturevalue("closed_port")  # (tests/peers/conftest.py)
    dead = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": f"127.0.0.1:{port}",
    }
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    both = [rule(name + "-open"), rule(name + "-closed", fail_open=False)]
    deltas.mark(telemetry.BACKEND_ERRORS, backend="memcached")
    settings = override_settings(
        CACHES={**caches, "rl": dead}, RATELIMIT_USE_CACHE="rl", RATELIMIT_RULES=both
    )
    with settings:
        reset_backends()
        try:
            assert statuses(client, "/api/", 2) == [503, 503]
        finally:
            reset_backends()
    assert deltas.decisions(name + "-open") == {"failed_open": 2}
    assert deltas.decisions(name + "-closed") == {"failed_closed": 2}
    assert deltas.of(telemetry.BACKEND_ERRORS, backend="memcached") == (2, 2)


# -- labels ------------------------------------------------------------------------------


def test_no_subject_or_path_reaches_a_label(client: Client, name: str) -> None:
    subject, where = "who-7b1f2e", "/api/"
    keyed = rule(name, key="header:x-who", path=where)
    with override_settings(RATELIMIT_RULES=[keyed]), frozen_clock(T0):
        statuses(
            client,
            where + "?q=secret-query",
            3,
            HTTP_X_WHO=subject,
            REMOTE_ADDR="::ffff:198.51.100.7",
        )
    text = generate_latest().decode()
    assert f'limit="{name}"' in text
    for leaked in (subject, "198.51.100.7", "secret-query", where):
        assert leaked not in text
    # Every label of ours is one of the three we declare.
    for line in text.splitlines():
        if line.startswith("bucketry_ratelimit"):
            labels = re.findall(r'(\w+)="', line.partition("{")[2])
            assert set(labels) <= {"limit", "decision", "backend", "le"}, line


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ("g" * 5000, "g" * telemetry.MAX_LABEL),
        ("bad-\ud800-name", "bad-\\ud800-name"),
        ('quote"and\nnewline', 'quote"and\nnewline'),
    ],
)
def test_a_label_is_short_and_encodable(group: str, expected: str) -> None:
    assert telemetry.label(group) == expected
    sink = telemetry.Prometheus.__new__(telemetry.Prometheus)  # the registered counters
    sink.shared = False
    sink.totals = REGISTRY._names_to_collectors[REQUESTS].totals  # type: ignore[attr-defined]
    sink.decision(telemetry.label(group), "admitted")()
    generate_latest()  # the whole scrape still encodes


def test_an_over_long_group_is_counted_under_its_cut_name(deltas: Deltas) -> None:
    group = "long-" + "x" * 3000
    get_usage(RequestFactory().get("/"), group=group, key="ip", rate="5/m", increment=True)
    assert deltas.decisions(group[: telemetry.MAX_LABEL]) == {"admitted": 1}
    assert group not in generate_latest().decode()


@pytest.mark.parametrize(
    ("cls", "kind"),
    [
        (MemcachedBackend, "memcached"),
        (RedisBackend, "redis"),
        (RedisClusterBackend, "redis-cluster"),
        (CacheBackend, "cache"),
        (DummyBackend, "dummy"),
        (type("MyRedis", (RedisBackend,), {}), "redis"),
        (type("Elsewhere", (Backend,), {}), "other"),
    ],
)
def test_the_backend_label_is_the_kind_of_backend(cls: type, kind: str) -> None:
    assert telemetry.backend_kind(cls) == kind


class Recording:
    """A sink that records what it was told (the instruments' side is tested above)."""

    def __init__(self) -> None:
        self.counted: list[tuple[str, str]] = []
        self.binds: list[tuple[str, str]] = []

    def decision(self, limit: str, decision: str) -> telemetry.Count:
        self.binds.append((limit, decision))
        return lambda: self.counted.append((limit, decision))

    def trip(self, backend: str) -> tuple[telemetry.Timing, telemetry.Count]:
        return (lambda seconds: None), (lambda: None)

    def skipped(self, limit: str) -> telemetry.Count:
        return lambda: None


def test_label_sets_are_bound_once_and_the_cache_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(telemetry, "MAX_BOUND", 3)
    sink = Recording()
    recording = telemetry.Telemetry([sink])
    monkeypatch.setattr(checking.HOOKS, "observers", [recording.observe])
    request = RequestFactory().get("/")
    groups = [f"bound-{next(_unique)}" for _ in range(5)]
    for group in groups * 2:
        get_usage(request, group=group, key="ip", rate="5/m", increment=True)
    assert sink.counted == [(g, "admitted") for g in groups * 2]
    assert len(recording._counts) == 3
    # The three cached were bound once; a label set past the bound, each time it is counted.
    for key in recording._counts:
        assert sink.binds.count(key) == 1, key
    assert sink.binds.count((groups[-1], "admitted")) >= 2


def test_connect_is_once_per_process() -> None:
    first = telemetry.connect()
    assert first is not None and telemetry.connect() is first
    assert checking.HOOKS.observers.count(first.observe) == 1
    assert checking.HOOKS.trips.count(first.trip) == 1


# -- the Grafana dashboard ---------------------------------------------------------------


def expressions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


OURS = {
    telemetry.REQUESTS,
    telemetry.BACKEND_ERRORS,
    *(telemetry.BACKEND_SECONDS + s for s in ("_bucket", "_sum", "_count")),
    "bucketry_metrics_buffered_keys",
    "bucketry_metrics_dropped_total",
    "bucketry_metrics_flush_lag_seconds",
    *("bucketry_metrics_flush_seconds" + s for s in ("_bucket", "_sum", "_count")),
}
PROMQL_WORDS = {
    "sum", "rate", "increase", "by", "histogram_quantile", "max", "min", "le", "limit",
    "decision", "backend", "without", "topk", "irate", "avg", "clamp_min", "or", "on",
    "and", "vector", "instance", "job",
}  # fmt: skip


def test_the_grafana_dashboard_names_only_our_instruments() -> None:
    dashboard = json.loads((ROOT / "docs/_static/grafana-bucketry.json").read_text())
    panels = dashboard["panels"]
    assert panels and all(p.get("targets") for p in panels if p.get("type") != "row")
    found = list(expressions(panels))
    assert len(found) >= len([p for p in panels if p.get("type") != "row"])
    named = set()
    for expr in found:
        text = re.sub(r'"[^"]*"', "", expr)  # label values
        text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
        words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
        metrics_ = {w for w in words if w.startswith("bucketry_")}
        assert metrics_ <= OURS, expr
        assert words - metrics_ <= PROMQL_WORDS, (expr, words - metrics_ - PROMQL_WORDS)
        named |= metrics_
    # Every instrument is on the dashboard.
    assert {n.removesuffix("_bucket") for n in named if n.endswith("_bucket")} >= {
        telemetry.BACKEND_SECONDS,
        "bucketry_metrics_flush_seconds",
    }
    assert {telemetry.REQUESTS, telemetry.BACKEND_ERRORS} <= named


# -- the bench ---------------------------------------------------------------------------


def test_the_bench_times_each_exporter(memcached_server: str, redis_server: str) -> None:
    from bench.claims import telemetry as bench
    from bench.common import Servers

    saved = list(checking.HOOKS.observers), list(checking.HOOKS.trips)
    servers = Servers(memcached=memcached_server, redis=redis_server)
    rows = bench.run(rounds=2, calls=5, ips=3, servers=servers)
    assert (list(checking.HOOKS.observers), list(checking.HOOKS.trips)) == saved  # put back
    assert [(r.backend, r.contender) for r in rows] == [
        (b, c) for b in ("memcached", "redis") for c in bench.CONTENDERS
    ]
    for row in rows:
        assert row.samples == 2 * 5 and row.failed == 0 and 0 < row.median <= row.p90
    assert "added us" in bench.render(rows, 2, 5)


def test_an_opentelemetry_round_trip_is_queued_not_recorded_on_the_request(
    rf: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDK's ``record`` costs tens of microseconds: a check only queues its time, and the
    recorder thread records the queue."""
    sink = telemetry.OpenTelemetry(MeterProvider().get_meter("bucketry"))
    threads: list[str] = []
    histogram = sink.seconds

    class Spy:
        def record(self, seconds: float, attributes: Any = None) -> None:
            threads.append(threading.current_thread().name)
            histogram.record(seconds, attributes)

    sink.seconds = Spy()
    monkeypatch.setattr(checking.HOOKS, "trips", [telemetry.Telemetry([sink]).trip])
    core.get_usage(rf.get("/"), "g-queued", key="ip", rate="5/m", increment=True)
    deadline = time.monotonic() + 5 * telemetry.RECORD_EVERY
    while not threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threads == ["bucketry-otel"]


@pytest.mark.django_db
def test_a_ban_not_made_at_the_bound_is_counted(client: Client, deltas: Deltas, name: str) -> None:
    """A process that holds the most bans it keeps makes no more (docs/operators, "Bans"):
    each refusal that would have banned is counted in ``bucketry_ratelimit_bans_skipped``."""
    from ratelimit_app import store
    from ratelimit_app.bans import applied as bans
    from ratelimit_app.operators.telemetry import BANS_SKIPPED

    ban = {"after": 1, "within": "1h", "for": "10m"}
    deltas.mark(BANS_SKIPPED, limit=name)
    with (
        override_settings(RATELIMIT_RULES=[rule(name, rate="1/m", ban=ban)]),
        frozen_clock(T0),
        mock.patch.object(bans, "MOST", 0),
    ):
        store.forget()
        assert statuses(client, "/api/", 3) == [200, 429, 429]
    assert deltas.of(BANS_SKIPPED, limit=name) == (2.0, 2.0)


def test_a_prometheus_scrape_sees_every_round_trip_queued(
    rf: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check only queues its round trip's time (one append, whatever the sinks); a scrape
    of our collector records the queue first, so it misses none, however soon it comes."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    sink = telemetry.Prometheus(registry)
    monkeypatch.setattr(checking.HOOKS, "trips", [telemetry.Telemetry([sink]).trip])
    from ratelimit_app.backends import get_backend

    telemetry.record_queued()
    for _ in range(3):
        core.get_usage(rf.get("/"), "g-scraped", key="ip", rate="5/m", increment=True)
    labels = {"backend": telemetry.backend_kind(type(get_backend()))}
    count = registry.get_sample_value(f"{telemetry.BACKEND_SECONDS}_count", labels)
    assert count == 3.0


def test_a_round_trip_hook_that_fails_is_removed_and_the_others_still_told(
    rf: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    told: list[str] = []

    def first(backend: Any, seconds: float, failed: bool) -> None:
        told.append("first")

    def broken(backend: Any, seconds: float, failed: bool) -> None:
        raise RuntimeError("exporter bug")

    def last(backend: Any, seconds: float, failed: bool) -> None:
        told.append("last")

    monkeypatch.setattr(checking.HOOKS, "trips", [first, broken, last])
    for _ in range(2):
        usage = core.get_usage(rf.get("/"), "g-hooks", key="ip", rate="5/m", increment=True)
        assert usage is not None and usage["count"] >= 1
    assert told == ["first", "last", "first", "last"]  # each told once a round trip
    assert checking.HOOKS.trips == [first, last]
    assert "round-trip observer" in caplog.text and "exporter bug" in caplog.text


def test_an_observer_that_fails_is_removed_and_the_others_still_told(
    rf: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    told: list[str] = []

    def broken(verdict: Any) -> None:
        raise RuntimeError("observer bug")

    monkeypatch.setattr(
        checking.HOOKS, "observers", [lambda v: told.append("first"), broken, told.append]
    )
    for _ in range(2):
        assert core.get_usage(rf.get("/"), "g-observed", key="ip", rate="5/m", increment=True)
    assert told[0] == "first" and told[2] == "first" and len(told) == 4
    assert isinstance(told[1], enforce.Verdict) and isinstance(told[3], enforce.Verdict)
    assert len(checking.HOOKS.observers) == 2
    assert "observer bug" in caplog.text
