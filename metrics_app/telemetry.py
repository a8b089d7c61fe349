"""The metrics buffer's Prometheus and OpenTelemetry instruments.

Installing ``prometheus-client`` or ``opentelemetry-api`` is enough: the app's ``ready()``
calls :func:`connect`, which makes the instruments of the sinks ``RATELIMIT_TELEMETRY``
chooses (the one setting of both apps' instruments; read here by name, since this app never
imports ``ratelimit_app``) once per process and hooks them into the buffer:
:data:`~metrics_app.buffer.aggregator.DROPS` (each dropped count) and
:data:`~metrics_app.buffer.flusher.FLUSHES` (each flush that wrote). The gauges read this
process's buffer when scraped. Under prometheus-client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``) a scrape reads files, not processes: each flush also writes
the gauges' values there, so a worker's gauges are those of its last flush.

What the gauges read is the in-memory buffer; with ``METRICS_BUFFER = "redis"`` they stay 0.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from metrics_app import buffer
from metrics_app.buffer.aggregator import DROPS
from metrics_app.buffer.flusher import FLUSHES, Flusher

__all__ = ["BUFFERED_KEYS", "DROPPED", "FLUSH_LAG", "FLUSH_SECONDS", "connect"]

BUFFERED_KEYS = "bucketry_metrics_buffered_keys"
DROPPED = "bucketry_metrics_dropped_total"
FLUSH_SECONDS = "bucketry_metrics_flush_seconds"
FLUSH_LAG = "bucketry_metrics_flush_lag_seconds"
#: A flush's time, in seconds: a few rows to a local database, up to a batch retried against
#: a slow one.
FLUSH_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_DOCS = {
    BUFFERED_KEYS: "(series, minute) keys buffered in this process, not yet written.",
    DROPPED: "Counted events dropped: the buffer was at a bound, or the Redis buffer failed.",
    FLUSH_SECONDS: "Time of a flush of the metrics buffer to the database, in seconds.",
    FLUSH_LAG: "Age of the oldest count not yet written to the database, in seconds.",
}


def buffered_keys() -> float:
    return float(buffer.stats()["buffered_keys"])


def flush_lag() -> float:
    return buffer.current().aggregator.lag()


class Prometheus:
    """The instruments in prometheus-client's default registry. Across workers the gauges
    add up (buffered keys) and take the worst (lag) of the living ones."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.keys = Gauge(BUFFERED_KEYS, _DOCS[BUFFERED_KEYS], multiprocess_mode="livesum")
        self.lag = Gauge(FLUSH_LAG, _DOCS[FLUSH_LAG], multiprocess_mode="livemax")
        self.keys.set_function(buffered_keys)
        self.lag.set_function(flush_lag)
        self.dropped = Counter(DROPPED, _DOCS[DROPPED])
        self.seconds = Histogram(FLUSH_SECONDS, _DOCS[FLUSH_SECONDS], buckets=FLUSH_BUCKETS)

    def dropped_events(self, events: int) -> None:
        self.dropped.inc(events)

    def flushed(self, flusher: Flusher, seconds: float) -> None:
        self.seconds.observe(seconds)
        # What a multiprocess scrape reads (set_function serves a single process).
        self.keys.set(flusher.aggregator.stats()["buffered_keys"])
        self.lag.set(flusher.aggregator.lag())


class OpenTelemetry:
    """The same instruments on the meter ``bucketry``; the gauges are observed when the
    project's reader collects."""

    def __init__(self, meter: Any = None) -> None:
        from opentelemetry import metrics

        meter = meter or metrics.get_meter("bucketry")

        def observed(read: Callable[[], float]) -> Callable[[Any], Iterable[Any]]:
            return lambda options: [metrics.Observation(read())]

        meter.create_observable_gauge(
            BUFFERED_KEYS, [observed(buffered_keys)], "1", _DOCS[BUFFERED_KEYS]
        )
        meter.create_observable_gauge(FLUSH_LAG, [observed(flush_lag)], "s", _DOCS[FLUSH_LAG])
        self.dropped = meter.create_counter(DROPPED, "1", _DOCS[DROPPED])
        self.seconds = meter.create_histogram(
            FLUSH_SECONDS,
            "s",
            _DOCS[FLUSH_SECONDS],
            explicit_bucket_boundaries_advisory=FLUSH_BUCKETS,
        )

    def dropped_events(self, events: int) -> None:
        self.dropped.add(events)

    def flushed(self, flusher: Flusher, seconds: float) -> None:
        self.seconds.record(seconds)


PROMETHEUS = "prometheus"
OTEL = "otel"
#: What ``RATELIMIT_TELEMETRY`` may be (as :data:`ratelimit_app.operators.telemetry.CHOICES`).
CHOICES = ("auto", PROMETHEUS, OTEL, "both", "off")
#: The module each sink needs, and the extra that installs it.
NEEDS = {PROMETHEUS: ("prometheus_client", "prometheus"), OTEL: ("opentelemetry.metrics", "otel")}
#: OpenTelemetry's Prometheus exporter: with it, OpenTelemetry's instruments reach the same
#: scrape as prometheus-client's, under the same names.
OTEL_TO_PROMETHEUS = "opentelemetry.exporter.prometheus"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def chosen(value: object, has: Callable[[str], bool] = installed) -> tuple[str, ...]:
    """The sinks ``RATELIMIT_TELEMETRY = value`` turns on, given which modules ``has``:
    the same as :func:`ratelimit_app.operators.telemetry.chosen` (a test holds them together)."""
    if value not in CHOICES:
        raise ImproperlyConfigured(
            f"RATELIMIT_TELEMETRY = {value!r}: expected one of "
            + ", ".join(repr(c) for c in CHOICES)
            + "."
        )
    if value == "off":
        return ()
    if value == "auto":
        found = tuple(name for name, (module, _) in NEEDS.items() if has(module))
        if PROMETHEUS in found and has(OTEL_TO_PROMETHEUS):
            return (PROMETHEUS,)
        return found
    names = (PROMETHEUS, OTEL) if value == "both" else (str(value),)
    for name in names:
        module, extra = NEEDS[name]
        if not has(module):
            raise ImproperlyConfigured(
                f"RATELIMIT_TELEMETRY = {value!r} needs {module.partition('.')[0]}: "
                f"pip install 'django-bucketry[{extra}]', or choose another value."
            )
    return names


SINKS: dict[str, Callable[[], Prometheus | OpenTelemetry]] = {
    PROMETHEUS: Prometheus,
    OTEL: OpenTelemetry,
}

_lock = threading.Lock()
_connected: list[Prometheus | OpenTelemetry] = []


def connect() -> list[Prometheus | OpenTelemetry]:
    """Make the instruments of the sinks ``RATELIMIT_TELEMETRY`` chooses and hook them into
    the buffer, once per process (later calls return the same); none when no sink is on."""
    with _lock:
        if _connected:
            return _connected
        for name in chosen(getattr(settings, "RATELIMIT_TELEMETRY", "auto")):
            sink = SINKS[name]()
            DROPS.append(sink.dropped_events)
            FLUSHES.append(sink.flushed)
            _connected.append(sink)
        return _connected
