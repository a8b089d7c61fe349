"""The metrics buffer's instruments (docs/observability.rst): buffered keys and flush lag
read when scraped, drops counted as they happen, each flush timed; and the scrape view
(:func:`metrics_app.views.prometheus`), with its clear answers when it cannot serve.

Prometheus's default registry lives as long as the process: counters are read as deltas.
"""

from __future__ import annotations

import itertools
import sys
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test import RequestFactory
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import REGISTRY

import metrics_app
from metrics_app import buffer, telemetry
from metrics_app.buffer import aggregator, flusher
from metrics_app.testing import FrozenClock
from metrics_app.views import prometheus


def value(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


@pytest.fixture
def otel(monkeypatch: pytest.MonkeyPatch) -> InMemoryMetricReader:
    """The instruments on an SDK meter of their own, hooked into the buffer for the test."""
    reader = InMemoryMetricReader()
    sink = telemetry.OpenTelemetry(MeterProvider(metric_readers=[reader]).get_meter("bucketry"))
    monkeypatch.setattr(aggregator, "DROPS", [*aggregator.DROPS, sink.dropped_events])
    monkeypatch.setattr(flusher, "FLUSHES", [*flusher.FLUSHES, sink.flushed])
    return reader


def otel_values(reader: InMemoryMetricReader) -> dict[str, float]:
    data = reader.get_metrics_data()
    found: dict[str, float] = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for point in m.data.data_points:
                    found[m.name] = (
                        getattr(point, "value", None) or getattr(point, "count", 0.0) or 0.0
                    )
    return found


def test_buffered_keys_and_lag_are_read_when_scraped(
    clock: FrozenClock, monkeypatch: pytest.MonkeyPatch, otel: InMemoryMetricReader
) -> None:
    times = itertools.chain([100.0], itertools.repeat(130.5))  # the first count, then scrapes
    monkeypatch.setattr(aggregator, "time", SimpleNamespace(monotonic=lambda: next(times)))
    metrics_app.record("tele-a")  # the first count: the lag counts from it
    metrics_app.record("tele-b")
    metrics_app.record("tele-a")
    assert value(telemetry.BUFFERED_KEYS) == 2
    assert value(telemetry.FLUSH_LAG) == 30.5
    assert otel_values(otel)[telemetry.BUFFERED_KEYS] == 2


def test_nothing_buffered_is_no_lag() -> None:
    assert value(telemetry.FLUSH_LAG) == 0.0 and value(telemetry.BUFFERED_KEYS) == 0.0


def test_drops_are_counted_as_they_happen(
    clock: FrozenClock, otel: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = value(telemetry.DROPPED)
    monkeypatch.setattr(aggregator, "MAX_BUFFERED_KEYS", 2)
    for i in range(4):
        metrics_app.record(f"tele-drop-{i}", 3)
    assert value(telemetry.DROPPED) - before == 6  # two new keys past the bound, 3 events each
    assert otel_values(otel)[telemetry.DROPPED] == 6


@pytest.mark.django_db
def test_a_flush_is_timed_and_a_failed_one_keeps_its_lag(
    clock: FrozenClock, otel: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes = value(telemetry.FLUSH_SECONDS + "_count")
    metrics_app.record("tele-flush")
    assert buffer.flush() == 1
    assert value(telemetry.FLUSH_SECONDS + "_count") - flushes == 1
    assert otel_values(otel)[telemetry.FLUSH_SECONDS] == 1
    assert value(telemetry.FLUSH_LAG) == 0.0
    # A flush that fails is timed too, and what it kept keeps aging.
    metrics_app.record("tele-flush")
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE metrics_app_flushledger")
    assert buffer.flush(raise_errors=False) is None
    assert value(telemetry.FLUSH_SECONDS + "_count") - flushes == 2
    assert value(telemetry.BUFFERED_KEYS) == 1 and value(telemetry.FLUSH_LAG) > 0


def test_an_empty_flush_is_not_timed() -> None:
    flushes = value(telemetry.FLUSH_SECONDS + "_count")
    assert buffer.flush() == 0
    assert value(telemetry.FLUSH_SECONDS + "_count") == flushes


def test_an_observer_that_fails_is_removed_and_counting_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(events: int) -> None:
        raise RuntimeError("exporter down")

    monkeypatch.setattr(aggregator, "DROPS", [broken])
    monkeypatch.setattr(aggregator, "MAX_BUFFERED_KEYS", 1)
    metrics_app.record("tele-x")
    metrics_app.record("tele-y")  # dropped: the observer fails, the call does not
    metrics_app.record("tele-z")
    assert aggregator.DROPS == []
    assert buffer.stats()["dropped_events"] == 2
    assert [r.getMessage().endswith("failed; removed") for r in caplog.records].count(True) == 1


def test_connect_is_once_per_process() -> None:
    sinks = telemetry.connect()
    assert sinks and telemetry.connect() is sinks
    for sink in sinks:
        assert aggregator.DROPS.count(sink.dropped_events) == 1
        assert flusher.FLUSHES.count(sink.flushed) == 1


# -- the view ----------------------------------------------------------------------------


def scrape(accept: str = "") -> tuple[int, str, str]:
    response = prometheus(RequestFactory().get("/metrics", HTTP_ACCEPT=accept))
    return response.status_code, response["Content-Type"], response.content.decode()


def test_the_view_serves_the_default_registry() -> None:
    status, content_type, text = scrape()
    assert status == 200 and content_type.startswith("text/plain; version=")
    for name in (telemetry.BUFFERED_KEYS, telemetry.DROPPED, "bucketry_ratelimit_requests"):
        assert f"# TYPE {name}" in text


def test_the_view_speaks_openmetrics_when_asked() -> None:
    status, content_type, text = scrape("application/openmetrics-text; version=1.0.0")
    assert status == 200 and content_type.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")


def test_without_the_extra_the_view_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    status, _, text = scrape()
    assert status == 501 and "django-bucketry[prometheus]" in text


@pytest.mark.parametrize("directory", ["/nonexistent/prometheus", "\x00", "x" * 5000])
def test_a_missing_multiprocess_directory_is_named_not_a_500(
    monkeypatch: pytest.MonkeyPatch, directory: str
) -> None:
    if "\x00" in directory:  # the environment cannot hold it: the closest a project can set
        directory = "/dev/null/not-a-dir"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", directory)
    status, _, text = scrape()
    assert status == 503 and "PROMETHEUS_MULTIPROC_DIR" in text and "not a directory" in text


def test_the_multiprocess_directory_serves_only_what_workers_wrote(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    status, _, text = scrape()
    assert status == 200 and text == ""  # no worker has written yet (this process is not one)
