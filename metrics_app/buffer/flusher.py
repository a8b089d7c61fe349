"""Writing an aggregator's batches to the database: on demand, and from a thread of its own.

A flush seals the live counts into a batch and writes the queued batches oldest first with
:func:`metrics_app.storage.write_counts`. A batch that fails stays queued, with its id, and
the thread retries with exponential backoff (:data:`FLUSH_INTERVAL` doubled per failure, at
most :data:`MAX_RETRY_DELAY`). Because the id never changes, a retry of a
batch whose first commit succeeded is recognised by the flush ledger and not counted twice.

The top keys gathered since the last flush (:mod:`metrics_app.topk`) are written after the
counts, with :func:`metrics_app.storage.write_tops`. They are a view of what happens lately,
not counts to keep: a write that fails loses them (logged), so memory stays bounded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connections

from metrics_app.buffer.aggregator import Aggregator, Batch, notify
from metrics_app.signals import flush_failed, flushed
from metrics_app.topk import Sketches

logger = logging.getLogger("metrics_app")

#: Seconds between the thread's flushes: how late a count reaches the database. 0 (only
#: :func:`metrics_app.testing.manual_flush` sets it) starts no thread.
FLUSH_INTERVAL = 10.0
#: Longest wait, in seconds, between retries of a failing flush.
MAX_RETRY_DELAY = 300.0

#: Functions told of every flush that wrote (or tried to write) a batch,
#: ``fn(flusher, seconds)``: the exporters (:mod:`metrics_app.telemetry`). Empty unless one
#: is installed.
FLUSHES: list[Callable[[Flusher, float], None]] = []


class Flusher:
    """Flushes one :class:`Aggregator`; at most one flush runs at a time."""

    def __init__(self, aggregator: Aggregator, tops: Sketches | None = None) -> None:
        self.aggregator = aggregator
        self.tops = Sketches() if tops is None else tops
        #: Flushes failed in a row (the backoff's exponent); 0 after a success.
        self.failures = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._wakeup = threading.Event()

    @property
    def thread(self) -> threading.Thread | None:
        """The thread that flushes every :data:`FLUSH_INTERVAL` (the last one started)."""
        return self._thread

    def flush(self, *, raise_errors: bool = True, blocking: bool = True) -> int | None:
        """Write everything buffered, now; see :func:`metrics_app.flush`.

        With ``blocking=False`` it gives up (returns None) rather than wait for a lock.
        """
        if not self._lock.acquire(blocking):
            return None
        try:
            written = self._flush(raise_errors, blocking)
            if written is not None:
                self._flush_tops(raise_errors)
            return written
        finally:
            self._lock.release()

    def _flush_tops(self, raise_errors: bool) -> None:
        taken = self.tops.take()
        if not taken:
            return
        from metrics_app import storage  # (the models need a ready app registry)

        try:
            storage.write_tops(taken)
        except Exception as exc:
            keys = sum(len(sketch.entries) for _, sketch in taken.values())
            logger.warning("metrics: %d top keys lost, their write failed: %s", keys, exc)
            if raise_errors:
                raise

    def _flush(self, raise_errors: bool, blocking: bool) -> int | None:
        aggregator = self.aggregator
        if not aggregator.seal(blocking):
            return None
        dropped = aggregator.take_dropped()
        if dropped.keys:
            # The one log line of a flush interval's drops, however many there were.
            logger.error(dropped.message(aggregator.limits()))
        batch = aggregator.oldest()
        if batch is None:
            return 0
        start = time.perf_counter()
        try:
            return self._write(batch, raise_errors)
        finally:
            if FLUSHES:
                notify(FLUSHES, self, time.perf_counter() - start)

    def _write(self, batch: Batch | None, raise_errors: bool) -> int | None:
        """Write the queued batches, ``batch`` (the oldest) first."""
        aggregator = self.aggregator
        # storage imports the models, which need a ready app registry; this module is
        # imported with the metrics_app package, before the registry is.
        from metrics_app import storage

        written = batches = 0
        while batch is not None:
            try:
                applied = storage.write_counts(batch.counts, batch.flush_id)
            except Exception as exc:
                self.failures += 1
                kept = aggregator.pending_keys
                logger.warning(
                    "metrics flush failed (attempt %d, %d keys kept buffered): %s",
                    self.failures,
                    kept,
                    exc,
                )
                flush_failed.send(
                    sender=None, exception=exc, buffered_keys=kept, attempt=self.failures
                )
                if raise_errors:
                    raise
                return None
            aggregator.written(batch)
            if applied:
                written += len(batch.counts)
                batches += 1
            batch = aggregator.oldest()
        self.failures = 0
        flushed.send(sender=None, buckets=written, batches=batches)
        return written

    def start(self) -> None:
        """Start the thread, unless it runs already."""
        if not self._stopped and self._thread is not None and self._thread.is_alive():
            return
        self._stopped = False
        self._wakeup.clear()
        self._thread = threading.Thread(target=self._run, name="metrics-flusher", daemon=True)
        self._thread.start()

    def stop(self, *, wait: bool = False) -> None:
        """Let the thread end (it does on waking); with ``wait``, up to 5 s for it to end."""
        self._stopped = True
        self._wakeup.set()
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            # This thread's own database connections; nobody else would close them.
            connections.close_all()

    def _loop(self) -> None:
        delay = FLUSH_INTERVAL
        while True:
            self._wakeup.wait(delay)
            self._wakeup.clear()
            interval = FLUSH_INTERVAL
            # A thread that start() replaced is no longer ``_thread``; one that reads an
            # interval of 0 before it is stopped must not spin on wait(0).
            if self._stopped or threading.current_thread() is not self._thread or interval <= 0:
                return
            ok = self.flush(raise_errors=False) is not None
            delay = interval if ok else min(interval * 2**self.failures, MAX_RETRY_DELAY)
