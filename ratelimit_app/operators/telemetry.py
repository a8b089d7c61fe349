"""The limiter's Prometheus and OpenTelemetry instruments, fed by the one enforcement path.

Installing ``prometheus-client`` (extra ``[prometheus]``) or ``opentelemetry-api`` (extra
``[otel]``) is enough: the app's ``ready()`` calls :func:`connect`, which makes the
instruments of the sinks ``RATELIMIT_TELEMETRY`` chooses (:func:`chosen`) once per process
(in Prometheus's default registry; on the OpenTelemetry meter ``bucketry``) and hooks them
into :data:`ratelimit_app.engine.checking.HOOKS` (``observers``: every verdict;
``trips``: every check's round trip). With no sink on
nothing is hooked, and a check pays nothing.

Each known limit's ``admitted`` and ``refused`` series exist from 0 before its first
decision (:meth:`Telemetry.welcome`): Prometheus's ``increase()`` reads a series' first sample
as its start, so a series born at 1 loses its first decisions.

Labels are bounded by what the project declares: the limit's name, eight decisions, five kinds
of backend. Never a subject, a path or a series name. docs/observability.rst shows the
instruments, the scrape set-up and alerts.
"""

from __future__ import annotations

import bisect
import functools
import importlib.util
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app.backends.base import Backend
from ratelimit_app.conf import read
from ratelimit_app.config import declared, sources
from ratelimit_app.engine import checking, enforce
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.signals import ban_skipped, fallback_changed

__all__ = [
    "BACKEND_BUCKETS",
    "BACKEND_ERRORS",
    "BACKEND_SECONDS",
    "BANS_SKIPPED",
    "CHOICES",
    "FALLBACK",
    "RECORDER",
    "REQUESTS",
    "Recorder",
    "Telemetry",
    "backend_kind",
    "chosen",
    "connect",
    "label",
]

logger = logging.getLogger("ratelimit_app")

REQUESTS = "bucketry_ratelimit_requests_total"
BACKEND_SECONDS = "bucketry_ratelimit_backend_seconds"
BACKEND_ERRORS = "bucketry_ratelimit_backend_errors_total"
#: Refusals that would have banned their subject, but the process held the most bans it
#: keeps (:data:`ratelimit_app.bans.applied.MOST`): no ban was made.
BANS_SKIPPED = "bucketry_ratelimit_bans_skipped_total"
#: 1 while this process counts the limits with a ``fallback`` in its memory (its counter
#: backend down), else 0: :mod:`ratelimit_app.engine.fallback`.
FALLBACK = "bucketry_ratelimit_fallback"
#: A check's round trip, in seconds: from a memcached reply on loopback (0.1 ms) to a
#: backend at its timeout (the default socket timeout is 0.1 s).
BACKEND_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
#: The backend classes we ship, by class name, and the ``backend`` label of each (a
#: project's subclass takes its parent's).
KINDS = MappingProxyType(
    {
        "MemcachedBackend": "memcached",
        "RedisClusterBackend": "redis-cluster",
        "RedisBackend": "redis",
        "CacheBackend": "cache",
        "DummyBackend": "dummy",
    }
)
#: The most label values bound to instruments ahead of time; past it (a project with more
#: limits than that) each count binds its labels again, at a microsecond's cost.
MAX_BOUND = 1000
#: The longest label value: a limit's name past it is cut (a decorator's group may be any
#: string a developer wrote).
MAX_LABEL = 200

#: The decisions whose series each known limit has from 0, before its first decision: the
#: two that every limit makes (the alerts of docs/observability.rst divide refusals by them).
WELCOMED = (enforce.ADMITTED, enforce.REFUSED)

Count = Callable[[], object]
Timing = Callable[[float], None]


class Totals:
    """Decisions counted in this process, by (limit, decision): a counter each
    (``itertools.count``, whose step is one call in C and atomic under the GIL: a decision
    costs no lock and no Python frame), read when the sink is collected."""

    def __init__(self) -> None:
        self._cells: dict[tuple[str, str], itertools.count[int]] = {}
        self._lock = threading.Lock()

    def cell(self, limit: str, decision: str) -> Count:
        """What counts one decision of ``limit`` (a series from 0 from now on)."""
        with self._lock:
            found = self._cells.setdefault((limit, decision), itertools.count())
        return found.__next__

    def items(self) -> list[tuple[tuple[str, str], int]]:
        """Each series and its count now."""
        with self._lock:
            cells = list(self._cells.items())
        # A count's repr is ``count(n)``: n steps taken (read without stepping it).
        return [(key, int(repr(cell)[6:-1])) for key, cell in cells]


class _Timing:
    """One backend's round trips: how many fell at or under each bound of
    :data:`BACKEND_BUCKETS` (the last: over every bound), and their sum, under a lock
    (prometheus-client's histogram takes a lock per bucket and per sum, and checks its
    labels, on every observation)."""

    __slots__ = ("counts", "lock", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BACKEND_BUCKETS) + 1)
        self.total = 0.0
        self.lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        at = bisect.bisect_left(BACKEND_BUCKETS, seconds)  # (a bucket holds what is <= it)
        with self.lock:
            self.counts[at] += 1
            self.total += seconds

    def read(self) -> tuple[list[tuple[str, float]], float]:
        """The cumulative buckets (``le``, count) and the sum, as a histogram shows them."""
        from prometheus_client.utils import floatToGoString

        with self.lock:
            counts, total = self.counts[:], self.total
        buckets, seen = [], 0
        for bound, n in zip((*BACKEND_BUCKETS, float("inf")), counts, strict=True):
            seen += n
            buckets.append((floatToGoString(bound), float(seen)))
        return buckets, total


class _Decisions:
    """prometheus-client's collector of :data:`REQUESTS`, read from a :class:`Totals`."""

    def __init__(self, sink: Prometheus) -> None:
        self.sink = sink

    @property
    def totals(self) -> Totals:
        """The decisions its sink reads (shared with the other sinks of its telemetry)."""
        return self.sink.totals

    def describe(self) -> list[Any]:
        return [self._family()]

    def collect(self) -> Iterable[Any]:
        family = self._family()
        for (limit, decision), n in self.totals.items():
            family.add_metric([limit, decision], n)
        yield family

    @staticmethod
    def _family() -> Any:
        from prometheus_client.core import CounterMetricFamily

        return CounterMetricFamily(
            REQUESTS, "Rate-limit decisions, by limit and decision.", labels=["limit", "decision"]
        )


class _Timings:
    """prometheus-client's collector of :data:`BACKEND_SECONDS`: a :class:`_Timing` per
    backend label."""

    def __init__(self) -> None:
        self._by: dict[str, _Timing] = {}
        self._lock = threading.Lock()

    def observer(self, backend: str) -> Timing:
        with self._lock:
            found = self._by.setdefault(backend, _Timing())
        return found.observe

    def describe(self) -> list[Any]:
        return [self._family()]

    def collect(self) -> Iterable[Any]:
        RECORDER.record()  # the round trips queued so far: a scrape sees every one
        family = self._family()
        with self._lock:
            found = list(self._by.items())
        for backend, timing in found:
            buckets, total = timing.read()
            family.add_metric([backend], buckets, total)
        yield family

    @staticmethod
    def _family() -> Any:
        from prometheus_client.core import HistogramMetricFamily

        return HistogramMetricFamily(
            BACKEND_SECONDS,
            "Round trip of a rate-limit check to its counters, in seconds.",
            labels=["backend"],
        )


class Sink(Protocol):
    """One library's instruments: each hands out a function bound to its labels."""

    def decision(self, limit: str, decision: str) -> Count: ...

    def trip(self, backend: str) -> tuple[Timing, Count]: ...

    def skipped(self, limit: str) -> Count: ...

    def fallback(self, backend: str, in_memory: bool) -> None: ...


class Prometheus:
    """The instruments in prometheus-client's default registry, or ``registry`` (made once
    per registry: a second registration of a name is an error).

    The decisions and the round trips are collectors of ours (:class:`Totals`,
    :class:`_Timing`: a decision is one call in C, a round trip a lock and two additions),
    read at each scrape; in prometheus-client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``),
    where every worker's counts live in files, they are prometheus-client's own counter and
    histogram."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram, values

        at = REGISTRY if registry is None else registry
        #: Whether the counts live in prometheus-client's files (its multiprocess mode).
        self.shared = values.ValueClass is not values.MutexValue
        self.totals = Totals()
        self.timings = _Timings()
        self.requests: Any
        self.seconds: Any
        if self.shared:
            self.requests = Counter(
                REQUESTS,
                "Rate-limit decisions, by limit and decision.",
                ["limit", "decision"],
                registry=at,
            )
            self.seconds = Histogram(
                BACKEND_SECONDS,
                "Round trip of a rate-limit check to its counters, in seconds.",
                ["backend"],
                buckets=BACKEND_BUCKETS,
                registry=at,
            )
        else:
            self.requests = _Decisions(self)
            self.seconds = self.timings
            at.register(self.requests)
            at.register(self.seconds)
        self.errors = Counter(
            BACKEND_ERRORS, "Rate-limit checks whose counters failed.", ["backend"], registry=at
        )
        self.skipped_bans = Counter(
            BANS_SKIPPED,
            "Bans not made: the process held the most bans it keeps.",
            ["limit"],
            registry=at,
        )
        self.in_memory = Gauge(
            FALLBACK,
            "1 while the process counts the limits with a fallback in its memory.",
            ["backend"],
            registry=at,
            multiprocess_mode="max",
        )

    def fallback(self, backend: str, in_memory: bool) -> None:
        self.in_memory.labels(backend).set(1 if in_memory else 0)

    def decision(self, limit: str, decision: str) -> Count:
        if self.shared:
            return self.requests.labels(limit, decision).inc
        return self.totals.cell(limit, decision)

    def trip(self, backend: str) -> tuple[Timing, Count]:
        errors = self.errors.labels(backend)
        if self.shared:
            return self.seconds.labels(backend).observe, errors.inc
        return self.timings.observer(backend), errors.inc

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
        self.totals = Totals()

        def totals(options: Any) -> list[Any]:
            return [
                metrics.Observation(n, {"limit": limit, "decision": decision})
                for (limit, decision), n in self.totals.items()
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
        #: Whether this process counts in memory, by backend label (read by the reader).
        self.in_memory: dict[str, int] = {}

        def fallback(options: Any) -> list[Any]:
            return [metrics.Observation(v, {"backend": b}) for b, v in self.in_memory.items()]

        meter.create_observable_gauge(
            FALLBACK,
            [fallback],
            "1",
            "1 while the process counts the limits with a fallback in its memory.",
        )
        # A sink whose round trips are queued starts the thread that records the queue.
        RECORDER.start()

    def fallback(self, backend: str, in_memory: bool) -> None:
        self.in_memory[backend] = 1 if in_memory else 0

    def decision(self, limit: str, decision: str) -> Count:
        return self.totals.cell(limit, decision)

    def trip(self, backend: str) -> tuple[Timing, Count]:
        attributes = {"backend": backend}
        self.errors.add(0, attributes)  # the series exists from 0, as prometheus-client's
        return (
            functools.partial(self.seconds.record, attributes=attributes),
            functools.partial(self.errors.add, 1, attributes),
        )

    def skipped(self, limit: str) -> Count:
        return functools.partial(self.skipped_bans.add, 1, {"limit": limit})


#: The most round trips waiting to be recorded (past it, the oldest are dropped), and the
#: seconds between two recordings of the queue.
QUEUED = 100_000
RECORD_EVERY = 0.5


class Recorder:
    """Round trips waiting to be recorded in the sinks' histograms, and the thread that
    records them: an OpenTelemetry SDK's ``record`` costs ten microseconds and more, and
    prometheus-client's a lock or two, so a check only queues its time (one ``append`` in
    C, whatever the sinks), and the thread records the queue every :data:`RECORD_EVERY`
    seconds; a scrape of our Prometheus collector records it first.

    Invariant: while a sink exists, each process has one recorder thread (a
    forked child starts its own, with an empty queue: its parent's round trips are the
    parent's to record), and at most :data:`QUEUED` round trips wait (past that the oldest
    are dropped, never the request's time)."""

    def __init__(self) -> None:
        #: ``(record, seconds)``: ``record(seconds)`` records a round trip in every sink.
        self.queue: deque[tuple[Timing, float]] = deque(maxlen=QUEUED)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._at_fork = False

    def start(self) -> None:
        """Start this process's recorder thread, unless it runs already."""
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return
            if not self._at_fork:
                os.register_at_fork(after_in_child=self._forked)
                self._at_fork = True
            self._thread = threading.Thread(
                target=self._forever, name="bucketry-otel", daemon=True
            )
            self._pid = os.getpid()
            self._thread.start()

    def _forked(self) -> None:
        self.queue.clear()
        self._lock = threading.Lock()  # a lock held in the parent at the fork stays held
        if self._thread is not None:
            self._thread = None
            self.start()

    def _forever(self) -> None:
        while True:
            time.sleep(RECORD_EVERY)
            self.record()

    def record(self) -> int:
        """Record the queued round trips now; the number recorded."""
        done = 0
        while True:
            try:
                record, seconds = self.queue.popleft()
            except IndexError:
                return done
            try:
                record(seconds)
            except Exception:  # an SDK's failure never reaches a request
                logger.exception("ratelimit: could not record a round trip")
            done += 1


RECORDER = Recorder()
#: Queue a round trip's ``(record, seconds)`` (the recorder's queue's ``append``).
LATER = RECORDER.queue.append


def record_queued() -> int:
    """Record the queued round trips now (the recorder thread does it every half second;
    tests call it); the number recorded."""
    return RECORDER.record()


class Telemetry:
    """Counts verdicts and round trips into ``sinks``; each label set is bound once (a
    count is then a dict look-up and one call a sink)."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks
        #: The decisions counted, shared by every sink that reads them at its collection
        #: (a decision is then one count, whatever the sinks).
        self.totals = Totals()
        for sink in sinks:
            if hasattr(sink, "totals"):
                sink.totals = self.totals
        #: What counts a decision in every sink, by (limit, decision); what times a round
        #: trip and counts a failed one in every sink, by backend class.
        self._counts: dict[tuple[str, str], Count] = {}
        self._trips: dict[type, tuple[Timing, Count]] = {}
        #: What counts an admitted decision in every sink, by limit: the common count,
        #: found with one look-up of the limit's name (a ``str``, whose hash is kept).
        self._admitted: dict[str, Count] = {}
        #: The configuration in force whose limits were last welcomed (a new one, after a
        #: change of settings or of the database's rules, is welcomed on the next verdict).
        self._config: object = None
        # The sinks' round trips are queued and recorded by this thread.
        RECORDER.start()

    def welcome(self, limits: Iterable[str]) -> None:
        """Make the :data:`WELCOMED` series of each limit named, at 0 (those it has are
        kept)."""
        for name in limits:
            for decision in WELCOMED:
                self._bound((name, decision))

    def welcome_configured(self) -> None:
        """Welcome every limit of the configuration in force (settings and database rules)
        and every named limit of a registered source (the DRF throttles' scopes)."""
        snap = RUNTIME.snapshot
        self._config = snap
        rules = declared.rules() if snap is None else snap.rules.rules
        self.welcome(rule.name for rule in rules)
        self._welcome_backend()
        for source in sources.registered():
            try:
                self.welcome(source.limits())
            except Exception:  # its configuration's mistakes are the system checks' to report
                logger.exception("ratelimit: the limits of %r not welcomed", source.kind)

    def observe(self, verdict: enforce.Verdict) -> None:
        """A hook of ``HOOKS.observers``: one count per decided limit. A
        look (``increment=False``: ``get_usage`` reading a counter) decides nothing."""
        if RUNTIME.snapshot is not self._config:
            self.welcome_configured()
        admitted = self._admitted
        plain = verdict.plain
        if plain is not None:  # plain limits' counts, each admitted (no decision made yet)
            for i, p in enumerate(plain):
                count = admitted.get(p.name or p.limit.group)  # (enforce.limit_name, inline)
                if count is None:  # first seen: its decision, made now
                    self._count(verdict.decisions[i], verdict)
                else:
                    count()
            return
        if (
            verdict.limited
            or verdict.remembered
            or verdict.failed is not None
            or verdict.in_memory
        ):
            for d in verdict.decisions:
                self._count(d, verdict)
            return
        # Nothing refused, every limit checked: the common case inline, an admitted count
        # bound to the limit's name (a dry run's would-be refusal apart).
        for d in verdict.decisions:
            if d.shadowed or not d.check.increment:
                self._count(d, verdict)
                continue
            count = admitted.get(d.name or d.limit.group)  # (enforce.limit_name, inline)
            if count is None:
                self._count(d, verdict)
            else:
                count()

    def _count(self, d: enforce.Decision, verdict: enforce.Verdict) -> None:
        """Count ``d``'s outcome (none for a look, or a limit not decided)."""
        if not d.check.increment:
            return
        decision = enforce.outcome(d, verdict)
        if decision is None:
            return
        name = enforce.limit_name(d)
        count = self._counts.get((name, decision))
        if count is None:
            # First seen (a decorator's group, a throttle's scope): its refusals start
            # from 0 too.
            self.welcome([name])
            count = self._bound((name, decision))
        if decision == enforce.ADMITTED:
            self._bind(self._admitted, name, count)
        count()

    def _bound(self, key: tuple[str, str]) -> Count:
        bound = self._counts.get(key)
        if bound is None:
            found = _every([s.decision(label(key[0]), key[1]) for s in self.sinks])
            bound = self._bind(self._counts, key, found)
        return bound

    def _welcome_backend(self) -> None:
        """Make the counters' backend's series (its errors at 0, and in prometheus-client
        its round trips' histogram at 0) before its first round trip, so that ``increase()``
        and the backend errors alert count a process's first ones."""
        from ratelimit_app.backends import backend_class

        try:
            cls = backend_class(read("RATELIMIT_USE_CACHE"))
        except Exception:  # a mistake of the settings: the system checks report it
            return
        self._trip_bound(cls)
        for s in self.sinks:  # (the gauge from 0: not counting in memory)
            s.fallback(backend_kind(cls), False)

    def _trip_bound(self, cls: type) -> tuple[Timing, Count]:
        bound = self._trips.get(cls)
        if bound is None:
            found = [s.trip(backend_kind(cls)) for s in self.sinks]
            timings = _every([t for t, _ in found])
            bound = self._bind(self._trips, cls, (timings, _every([e for _, e in found])))
        return bound

    def trip(self, backend: Backend, seconds: float, failed: bool) -> None:
        """A hook of ``HOOKS.trips``: the round trip's time, and an error
        when it failed."""
        bound = self._trips.get(type(backend)) or self._trip_bound(type(backend))
        LATER((bound[0], seconds))  # recorded in every sink by the recorder's thread
        if failed:
            bound[1]()

    def fallback_changed(self, sender: Any = None, in_memory: bool = False, **kwargs: Any) -> None:
        """:data:`~ratelimit_app.signals.fallback_changed`: the gauge of the counters'
        backend set (1: counting in memory)."""
        from ratelimit_app.backends import backend_class

        try:
            kind = backend_kind(backend_class(read("RATELIMIT_USE_CACHE")))
        except Exception:  # a mistake of the settings: the system checks report it
            return
        for s in self.sinks:
            s.fallback(kind, in_memory)

    def ban_skipped(self, sender: Any = None, limit: str = "", **kwargs: Any) -> None:
        """:data:`~ratelimit_app.signals.ban_skipped`: a ban not made (rare: no binding)."""
        for s in self.sinks:
            s.skipped(label(limit))()

    @staticmethod
    def _bind(cache: dict[Any, Any], key: Any, value: Any) -> Any:
        if len(cache) < MAX_BOUND:
            cache[key] = value
        return value


def _every(calls: list[Callable[..., Any]]) -> Callable[..., Any]:
    """One call that makes each of ``calls`` with its arguments (the one itself, when one:
    a decision in one sink is one call)."""
    calls = list(dict.fromkeys(calls))  # (sinks that share a count count it once)
    if len(calls) == 1:
        return calls[0]

    def every(*args: Any) -> None:
        for call in calls:
            call(*args)

    return every


def label(text: str) -> str:
    """``text`` as a label value: at most :data:`MAX_LABEL` characters, and encodable (a
    lone surrogate would fail the whole scrape)."""
    text = text[:MAX_LABEL]
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def backend_kind(cls: type[Backend]) -> str:
    """The ``backend`` label of a backend class: the kind of the nearest class we ship,
    else ``other`` (found once per class, kept in the runtime)."""
    return RUNTIME.compile(("backend-kind", cls), _backend_kind, cls)


def _backend_kind(cls: type[Backend]) -> str:
    for c in cls.__mro__:
        if c.__module__.startswith("ratelimit_app.backends.") and c.__name__ in KINDS:
            return KINDS[c.__name__]
    return "other"


# -- which sinks ---------------------------------------------------------------------------

PROMETHEUS = "prometheus"
OTEL = "otel"
#: What ``RATELIMIT_TELEMETRY`` may be.
CHOICES = ("auto", PROMETHEUS, OTEL, "both", "off")
#: The module each sink needs, and the extra that installs it.
NEEDS = MappingProxyType(
    {PROMETHEUS: ("prometheus_client", "prometheus"), OTEL: ("opentelemetry.metrics", "otel")}
)
#: OpenTelemetry's Prometheus exporter: with it, OpenTelemetry's instruments reach the same
#: scrape as prometheus-client's, under the same names.
OTEL_TO_PROMETHEUS = "opentelemetry.exporter.prometheus"
SINKS: Mapping[str, Callable[[], Sink]] = MappingProxyType(
    {
        PROMETHEUS: lambda: Prometheus(),
        OTEL: lambda: OpenTelemetry(),
    }
)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def chosen(value: object, has: Callable[[str], bool] = installed) -> tuple[str, ...]:
    """The sinks ``RATELIMIT_TELEMETRY = value`` turns on, given which modules ``has``.

    ``"auto"``: each sink whose library is installed, except that prometheus-client's alone
    is made when OpenTelemetry's Prometheus exporter is installed (both would register the
    same names in one scrape). A sink named explicitly must be installed."""
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


_lock = threading.Lock()


def connected() -> Telemetry | None:
    """The instruments hooked into the enforcement path (None: none)."""
    found: Telemetry | None = checking.HOOKS.exporter
    return found


def connect() -> Telemetry | None:
    """Make the instruments of the sinks ``RATELIMIT_TELEMETRY`` chooses and hook them into
    the enforcement path, once per process (later calls return the same); None when no sink
    is on. The limits known now start their series at 0."""
    with _lock:
        found = connected()
        if found is not None:
            return found
        sinks = [SINKS[name]() for name in chosen(read("RATELIMIT_TELEMETRY"))]
        if not sinks:
            return None
        telemetry = Telemetry(sinks)
        telemetry.welcome_configured()
        hooks = checking.HOOKS
        hooks.observers.append(telemetry.observe)
        hooks.trips.append(telemetry.trip)
        hooks.exporter = telemetry
        ban_skipped.connect(telemetry.ban_skipped, weak=False, dispatch_uid=BANS_SKIPPED)
        fallback_changed.connect(telemetry.fallback_changed, weak=False, dispatch_uid=FALLBACK)
        return telemetry


def welcome_saved(name: str) -> None:
    """A rule saved in this process (the admin's): its series start at 0 now, before its
    first decision in any process (prometheus-client's multiprocess mode shares them; other
    processes make theirs at their next decision after they read the change)."""
    telemetry = connected()
    if telemetry is not None:
        telemetry.welcome([name])
