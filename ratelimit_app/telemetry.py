"""The limiter's Prometheus and OpenTelemetry instruments, fed by the one enforcement path.

Installing ``prometheus-client`` (extra ``[prometheus]``) or ``opentelemetry-api`` (extra
``[otel]``) is enough: the app's ``ready()`` calls :func:`connect`, which makes the
instruments once per process (in Prometheus's default registry; on the OpenTelemetry meter
``bucketry``) and hooks them into :data:`ratelimit_app.engine.enforce.OBSERVERS` (every
verdict) and :data:`ratelimit_app.engine.checking.TRIPS` (every check's round trip). With
neither package installed nothing is hooked, and a check pays nothing.

Labels are bounded by what the project declares: the limit's name, six decisions, five kinds
of backend. Never a subject, a path or a series name. docs/observability.rst shows the
instruments, the scrape set-up and alerts.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ratelimit_app.backends.base import Backend
from ratelimit_app.engine import checking, enforce
from ratelimit_app.signals import ban_skipped

__all__ = [
    "BACKEND_BUCKETS",
    "BACKEND_ERRORS",
    "BACKEND_SECONDS",
    "BANS_SKIPPED",
    "REQUESTS",
    "Telemetry",
    "backend_kind",
    "connect",
    "label",
]

logger = logging.getLogger("ratelimit_app")

REQUESTS = "bucketry_ratelimit_requests_total"
BACKEND_SECONDS = "bucketry_ratelimit_backend_seconds"
BACKEND_ERRORS = "bucketry_ratelimit_backend_errors_total"
#: Refusals that would have banned their subject, but the process held the most bans it
#: keeps (:data:`ratelimit_app.engine.bans.MOST`): no ban was made.
BANS_SKIPPED = "bucketry_ratelimit_bans_skipped_total"
#: A check's round trip, in seconds: from a memcached reply on loopback (0.1 ms) to a
#: backend at its timeout (the default socket timeout is 0.1 s).
BACKEND_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
#: The backend classes we ship, by class name, and the ``backend`` label of each (a
#: project's subclass takes its parent's).
KINDS = {
    "MemcachedBackend": "memcached",
    "RedisClusterBackend": "redis-cluster",
    "RedisBackend": "redis",
    "CacheBackend": "cache",
    "DummyBackend": "dummy",
}
#: The most label values bound to instruments ahead of time; past it (a project with more
#: limits than that) each count binds its labels again, at a microsecond's cost.
MAX_BOUND = 1000
#: The longest label value: a limit's name past it is cut (a decorator's group may be any
#: string a developer wrote).
MAX_LABEL = 200

Count = Callable[[], None]
Timing = Callable[[float], None]


class Sink(Protocol):
    """One library's instruments: each hands out a function bound to its labels."""

    def decision(self, limit: str, decision: str) -> Count: ...

    def trip(self, backend: str) -> tuple[Timing, Count]: ...

    def skipped(self, limit: str) -> Count: ...


class Prometheus:
    """The instruments in prometheus-client's default registry (made once per process: a
    second registration of a name is an error)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        self.requests = Counter(
            REQUESTS, "Rate-limit decisions, by limit and decision.", ["limit", "decision"]
        )
        self.seconds = Histogram(
            BACKEND_SECONDS,
            "Round trip of a rate-limit check to its counters, in seconds.",
            ["backend"],
            buckets=BACKEND_BUCKETS,
        )
        self.errors = Counter(
            BACKEND_ERRORS, "Rate-limit checks whose counters failed.", ["backend"]
        )
        self.skipped_bans = Counter(
            BANS_SKIPPED, "Bans not made: the process held the most bans it keeps.", ["limit"]
        )

    def decision(self, limit: str, decision: str) -> Count:
        return self.requests.labels(limit, decision).inc

    def trip(self, backend: str) -> tuple[Timing, Count]:
        errors = self.errors.labels(backend)
        return self.seconds.labels(backend).observe, errors.inc

    def skipped(self, limit: str) -> Count:
        return self.skipped_bans.labels(limit).inc


class OpenTelemetry:
    """The same instruments on an OpenTelemetry meter (default: ``bucketry`` of the global
    meter provider, which forwards to whatever SDK the project sets, even later).

    The decisions are an observable counter: a check adds one to a total of ours, and the
    reader collects the totals, since an SDK's synchronous ``add`` costs several times a
    Prometheus increment, on every decision."""

    def __init__(self, meter: Any = None) -> None:
        from opentelemetry import metrics

        if meter is None:
            meter = metrics.get_meter("bucketry")
        self._totals: dict[tuple[str, str], list[int]] = {}
        self._lock = threading.Lock()

        def totals(options: Any) -> list[Any]:
            with self._lock:
                found = [(key, cell[0]) for key, cell in self._totals.items()]
            return [
                metrics.Observation(n, {"limit": limit, "decision": decision})
                for (limit, decision), n in found
            ]

        meter.create_observable_counter(
            REQUESTS, [totals], "1", "Rate-limit decisions, by limit and decision."
        )
        self.seconds = meter.create_histogram(
            BACKEND_SECONDS,
            unit="s",
            description="Round trip of a rate-limit check to its counters, in seconds.",
            explicit_bucket_boundaries_advisory=BACKEND_BUCKETS,
        )
        self.errors = meter.create_counter(
            BACKEND_ERRORS, unit="1", description="Rate-limit checks whose counters failed."
        )
        self.skipped_bans = meter.create_counter(
            BANS_SKIPPED,
            unit="1",
            description="Bans not made: the process held the most bans it keeps.",
        )

    def decision(self, limit: str, decision: str) -> Count:
        with self._lock:
            cell = self._totals.setdefault((limit, decision), [0])
        lock = self._lock

        def count() -> None:
            with lock:
                cell[0] += 1

        return count

    def trip(self, backend: str) -> tuple[Timing, Count]:
        attributes = {"backend": backend}
        record = self.seconds.record
        later = _LATER.append
        return (
            lambda seconds: later((record, seconds, attributes)),
            functools.partial(self.errors.add, 1, attributes),
        )

    def skipped(self, limit: str) -> Count:
        return functools.partial(self.skipped_bans.add, 1, {"limit": limit})


#: Round trips waiting to be recorded in an OpenTelemetry histogram: an SDK's ``record``
#: costs ten microseconds and more, so a check only queues its time, and a thread of this
#: process records the queue every :data:`RECORD_EVERY` seconds (at most :data:`QUEUED`
#: waiting: past that, the oldest are dropped, never the request's time).
QUEUED = 100_000
RECORD_EVERY = 0.5
_LATER: deque[tuple[Callable[..., Any], float, dict[str, str]]] = deque(maxlen=QUEUED)
_recorder: tuple[int, threading.Thread] | None = None
_recorder_lock = threading.Lock()


def _record_later_forever() -> None:
    while True:
        time.sleep(RECORD_EVERY)
        record_queued()


def record_queued() -> int:
    """Record the queued round trips now (the recorder thread does it; tests call it);
    the number recorded. Starts the recorder thread of this process if it has none (a
    forked worker does not inherit its parent's)."""
    global _recorder
    if _recorder is None or _recorder[0] != os.getpid():
        with _recorder_lock:
            if _recorder is None or _recorder[0] != os.getpid():
                thread = threading.Thread(
                    target=_record_later_forever, name="bucketry-otel", daemon=True
                )
                thread.start()
                _recorder = (os.getpid(), thread)
    done = 0
    while True:
        try:
            record, seconds, attributes = _LATER.popleft()
        except IndexError:
            return done
        try:
            record(seconds, attributes)
        except Exception:  # an SDK's failure never reaches a request
            logger.exception("ratelimit: could not record a round trip")
        done += 1


class Telemetry:
    """Counts verdicts and round trips into ``sinks``; each label set is bound once (a
    count is then a dict look-up and one call a sink)."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks
        self._counts: dict[tuple[str, str], list[Count]] = {}
        self._trips: dict[type, tuple[list[Timing], list[Count]]] = {}

    def observe(self, verdict: enforce.Verdict) -> None:
        """:data:`~ratelimit_app.engine.enforce.OBSERVERS`: one count per decided limit. A
        look (``increment=False``: ``get_usage`` reading a counter) decides nothing."""
        counts = self._counts
        for d in verdict.decisions:
            if not d.check.increment:
                continue
            decision = enforce.outcome(d, verdict)
            if decision is None:
                continue
            key = (enforce.limit_name(d), decision)
            bound = counts.get(key)
            if bound is None:
                found = [s.decision(label(key[0]), decision) for s in self.sinks]
                bound = self._bind(counts, key, found)
            for count in bound:
                count()

    def trip(self, backend: Backend, seconds: float, failed: bool) -> None:
        """:data:`~ratelimit_app.engine.checking.TRIPS`: the round trip's time, and an error
        when it failed."""
        cls = type(backend)
        bound = self._trips.get(cls)
        if bound is None:
            found = [s.trip(backend_kind(cls)) for s in self.sinks]
            bound = self._bind(self._trips, cls, ([t for t, _ in found], [e for _, e in found]))
        for timing in bound[0]:
            timing(seconds)
        if failed:
            for error in bound[1]:
                error()

    def ban_skipped(self, sender: Any = None, limit: str = "", **kwargs: Any) -> None:
        """:data:`~ratelimit_app.signals.ban_skipped`: a ban not made (rare: no binding)."""
        for s in self.sinks:
            s.skipped(label(limit))()

    @staticmethod
    def _bind(cache: dict[Any, Any], key: Any, value: Any) -> Any:
        if len(cache) < MAX_BOUND:
            cache[key] = value
        return value


def label(text: str) -> str:
    """``text`` as a label value: at most :data:`MAX_LABEL` characters, and encodable (a
    lone surrogate would fail the whole scrape)."""
    text = text[:MAX_LABEL]
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@functools.cache
def backend_kind(cls: type[Backend]) -> str:
    """The ``backend`` label of a backend class: the kind of the nearest class we ship,
    else ``other``."""
    for c in cls.__mro__:
        if c.__module__.startswith("ratelimit_app.backends.") and c.__name__ in KINDS:
            return KINDS[c.__name__]
    return "other"


_lock = threading.Lock()
_connected: list[Telemetry] = []


def connect() -> Telemetry | None:
    """Make the instruments of every installed library and hook them into the enforcement
    path, once per process (later calls return the same); None when neither is installed."""
    with _lock:
        if _connected:
            return _connected[0]
        sinks: list[Sink] = []
        for make in (Prometheus, OpenTelemetry):
            with contextlib.suppress(ImportError):  # the extra is not installed
                sinks.append(make())
        if not sinks:
            return None
        telemetry = Telemetry(sinks)
        enforce.OBSERVERS.append(telemetry.observe)
        checking.TRIPS.append(telemetry.trip)
        ban_skipped.connect(telemetry.ban_skipped, weak=False, dispatch_uid=BANS_SKIPPED)
        _connected.append(telemetry)
        return telemetry
