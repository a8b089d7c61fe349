"""This process's buffer behind :func:`metrics_app.record`, and the functions that reach it.

All the state lives in one :class:`ProcessBuffer`: its aggregator, its flusher and the target
``record()`` hands counts to. A forked child and :func:`reset` replace that one instance, so
what they start from cannot drift apart.

Importing this module starts nothing. The first ``record()`` (or ``record_top()``) of a
process starts its buffer: it installs the exit hooks (:mod:`.lifecycle`), chooses the
target (the in-memory aggregator, or Redis with ``METRICS_BUFFER = "redis"``) and starts the
flusher thread (which, for the Redis target, writes the top keys only). A change to
``METRICS_BUFFER`` chooses again.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any, Protocol

from django.core.signals import setting_changed
from django.dispatch import receiver

from metrics_app import clock
from metrics_app.buffer import aggregator, flusher, lifecycle, shared
from metrics_app.buffer.aggregator import Aggregator
from metrics_app.buffer.flusher import Flusher
from metrics_app.conf import conf
from metrics_app.names import MAX_NAME_LENGTH, check_name
from metrics_app.topk import Sketches

logger = logging.getLogger("metrics_app")

#: Whether a started buffer installs the SIGTERM handler that flushes before the process
#: exits (:mod:`.lifecycle`); :func:`metrics_app.testing.manual_flush` turns it off.
HANDLE_SIGTERM = True


class Target(Protocol):
    """Where ``record()`` adds a count once the buffer has started."""

    def add(self, name: str, minute: int, count: int, client_chosen: bool = False) -> None: ...


class RedisTarget:
    """``METRICS_BUFFER = "redis"``: one script call per count (:mod:`metrics_app.buffer.shared`).

    When Redis fails, or the shared hash is at a bound, the count is lost, not the request:
    it is counted as dropped in the aggregator's stats; a failure is logged at most once a
    minute, the drops at a bound by the next flush, in its one line.
    """

    def __init__(self, aggregator: Aggregator) -> None:
        self._aggregator = aggregator
        self._logged_at: float | None = None

    def add(self, name: str, minute: int, count: int, client_chosen: bool = False) -> None:
        try:
            if shared.record(name, minute, count, client_chosen):
                return
        except Exception as exc:
            self._aggregator.drop(count)
            now = time.monotonic()
            if self._logged_at is None or now - self._logged_at > 60:
                self._logged_at = now
                logger.error(
                    "metrics: counts of %r dropped: the Redis buffer failed: %s", name, exc
                )
            return
        # At a bound of the shared hash: counted, and logged by the next flush in one line.
        self._aggregator.drop(count, name, "the Redis buffer's bounds")


class ProcessBuffer:
    """What this process has buffered, the thread that flushes it, and where counts go."""

    def __init__(self) -> None:
        self.aggregator = Aggregator()
        #: The top keys of each name since the last flush (:func:`record_top`).
        self.tops = Sketches()
        self.flusher = Flusher(self.aggregator, self.tops)
        self.redis = RedisTarget(self.aggregator)
        # Until the first record() the target is this object: its add() starts the buffer,
        # which chooses the real target, and hands the count on.
        self.target: Target = self
        self.started = False
        self._start_lock = threading.Lock()

    def add(self, name: str, minute: int, count: int, client_chosen: bool = False) -> None:
        """Start, then add through the target just chosen."""
        self.start()
        self.target.add(name, minute, count, client_chosen)

    def start(self) -> None:
        """Install the exit hooks, then choose the target and start the thread (once)."""
        with self._start_lock:
            if self.started:
                return
            _exit_hooks.install(sigterm=HANDLE_SIGTERM)
            self.started = True
            self.configure()

    def configure(self) -> None:
        """Read what this buffer caches (the bounds, ``METRICS_BUFFER``): choose the target,
        start or stop the thread."""
        if not self.started:
            return
        self.aggregator.max_keys = aggregator.MAX_BUFFERED_KEYS
        self.aggregator.max_client_keys = aggregator.MAX_CLIENT_KEYS
        in_memory = conf.BUFFER != "redis"
        self.target = self.aggregator if in_memory else self.redis
        # With the Redis buffer the thread writes the top keys only (counts stay in Redis).
        if flusher.FLUSH_INTERVAL > 0:
            self.flusher.start()
        else:
            self.flusher.stop()

    def stats(self) -> dict[str, int]:
        """The aggregator's stats and the flusher's failures in a row."""
        return {**self.aggregator.stats(), "failures": self.flusher.failures}


_buffer = ProcessBuffer()


def current() -> ProcessBuffer:
    """This process's buffer (for tests and introspection; it is replaced on fork)."""
    return _buffer


#: The most events one call may count: the database's 64-bit counts must hold a bucket's
#: sum and a series' total, and a count no batch can write would block every later batch.
MAX_COUNT = 2**48


def record(
    name: str,
    count: int = 1,
    at: datetime | float | None = None,
    *,
    client_chosen: bool = False,
) -> None:
    """Count ``count`` events of series ``name`` in the minute of ``at`` (default now).

    Thread-safe and free of I/O (unless ``METRICS_BUFFER = "redis"``): the counts reach the
    database at the next flush. ``at`` is an aware datetime or Unix seconds. Raises
    ``ValueError`` for a name no database can store, or a count that is not an int from 0
    to :data:`MAX_COUNT`.

    ``client_chosen=True`` says a client chose ``name`` (it holds part of a URL, say): such
    names share :data:`~metrics_app.buffer.aggregator.MAX_CLIENT_KEYS` of the buffer, so a
    client that makes up a new name per request cannot crowd out the names the code chooses.
    """
    if type(name) is not str or not 0 < len(name) <= MAX_NAME_LENGTH or not name.isprintable():
        # Three cheap tests pass the usual name without a call (this runs on every counted
        # request); check_name rules on the rest, and raises for what it refuses.
        check_name(name)
    if count != 1 and (type(count) is not int or not 0 <= count <= MAX_COUNT):
        raise ValueError(f"count must be a non-negative int up to 2**48, got {count!r:.40}")
    if at is None:
        minute = int(clock.now() // 60)
    elif isinstance(at, datetime):
        if at.tzinfo is None:
            raise ValueError("record(at=...) needs an aware datetime")
        minute = int(at.timestamp() // 60)
    else:
        minute = int(at // 60)
    _buffer.target.add(name, minute, count, client_chosen)


def record_top(name: str, key: str, label: str = "", ref: str = "", *, keep: float) -> None:
    """Count one event of ``key`` among the most frequent keys of ``name`` (a bounded
    sketch per name, :mod:`metrics_app.topk`), written at the next flush as ``TopKey`` rows
    that are deleted ``keep`` seconds after; a row's count is never above the key's true
    count. ``label`` is what a page shows of the key, ``ref`` what it acts on. Thread-safe,
    no I/O."""
    buffer = _buffer
    if not buffer.started:
        buffer.start()
    buffer.tops.add(check_name(name), key, clock.now(), label, ref, keep)


def flush(*, raise_errors: bool = True, blocking: bool = True) -> int | None:
    """Write everything buffered in this process to the database, now.

    Returns the number of ``(series, minute)`` keys written, or None when a batch failed (and
    ``raise_errors`` is False); failed batches stay queued for the next flush.
    """
    return _buffer.flusher.flush(raise_errors=raise_errors, blocking=blocking)


def stats() -> dict[str, int]:
    """Buffered keys, queued batches, events dropped since the last flush, failures in a row."""
    return _buffer.stats()


def reset() -> None:
    """Forget everything buffered and stop the thread (for tests)."""
    global _buffer
    old, _buffer = _buffer, ProcessBuffer()
    old.flusher.stop(wait=True)


def _renew_after_fork() -> None:
    # The child owns nothing of its parent's buffer: not its counts (the parent flushes
    # them), not its locks (another thread may have held one at the fork), not its thread
    # (fork copies only the calling thread), not its process id (flush ids must differ).
    global _buffer
    _buffer = ProcessBuffer()


def connect_celery_shutdown() -> None:
    """Flush in each Celery pool process as it shuts down (prefork children skip atexit)."""
    lifecycle.on_celery_child_shutdown(_flush_if_started)


def _flush_if_started() -> None:
    if _buffer.started:
        flush(raise_errors=False)


_exit_hooks = lifecycle.ExitHooks(flush, kept_keys=lambda: _buffer.aggregator.pending_keys)
lifecycle.on_fork_in_child(_renew_after_fork)


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    # The one setting a started buffer caches (it chose its target from it).
    if setting == "METRICS_BUFFER":
        _buffer.configure()
