"""The per-process aggregator behind :func:`metrics_app.record`, and its flusher thread.

**Recording** takes one lock and adds to a dict keyed by ``(name, minute)``: no I/O, no
setting read. The first ``record()`` of a process starts the flusher thread and installs the
``atexit`` and ``SIGTERM`` hooks; importing this module starts nothing.

**Flushing** swaps the dict for an empty one under the lock and turns it into a *batch* with
an id ``<process uuid>:<sequence>``. Batches are written oldest first by
:func:`metrics_app.storage.write_counts`; a batch that fails stays queued, with its id, and is
retried with exponential backoff (``METRICS_FLUSH_INTERVAL`` doubled per failure, at most
``METRICS_MAX_RETRY_DELAY``). Because the id never changes, a retry of a batch whose first
commit succeeded is recognised by the flush ledger and not counted twice.

**The bound.** Buffered keys (the live dict plus queued batches) never exceed
``METRICS_MAX_BUFFERED_KEYS``. At the bound, counts for keys already buffered are still
added; a count for a *new* ``(name, minute)`` is dropped, the drop is logged at ERROR and the
``buffer_full`` signal is sent (first drop of each flush interval), and the next flush logs
the totals dropped. Memory therefore stays bounded while the database is down, and what is
lost is said out loud.

**Fork safety.** ``os.register_at_fork`` gives a forked child (gunicorn ``--preload``) an empty
buffer, a new lock, a new process uuid and no thread: the parent flushes what it recorded and
the child starts its own thread on its first ``record()``.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from types import FrameType
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from metrics_app import clock
from metrics_app.conf import conf
from metrics_app.names import MAX_NAME_LENGTH, check_name

__all__ = ["MAX_NAME_LENGTH", "flush", "record", "reset", "stats"]

logger = logging.getLogger("metrics_app")


@dataclass
class Batch:
    flush_id: str
    counts: dict[tuple[str, int], int]


_lock = threading.Lock()
_counts: dict[tuple[str, int], int] = {}
_started = False
_start_lock = threading.Lock()
_flush_lock = threading.Lock()
_pending: deque[Batch] = deque()
_pending_keys = 0
_max_keys = 100_000
_redis_mode = False
_process_id = uuid.uuid4().hex
_sequence = 0
_dropped_events = 0
_dropped_keys = 0
_drop_reported = False
_failures = 0
_thread: threading.Thread | None = None
_wakeup = threading.Event()
_hooks_pid: int | None = None
_previous_sigterm: Any = None


def record(name: str, count: int = 1, at: datetime | float | None = None) -> None:
    """Count ``count`` events of series ``name`` in the minute of ``at`` (default now).

    Thread-safe and free of I/O (unless ``METRICS_BUFFER = "redis"``): the counts reach the
    database at the next flush. ``at`` is an aware datetime or Unix seconds.
    """
    if type(name) is not str or not 0 < len(name) <= MAX_NAME_LENGTH or not name.isprintable():
        # Three cheap tests pass the usual name without a call (this runs on every counted
        # request); check_name rules on the rest, and raises for what it refuses.
        check_name(name)
    if count != 1 and (type(count) is not int or count < 0):
        raise ValueError(f"count must be a non-negative int, got {count!r}")
    if at is None:
        minute = int(clock.now() // 60)
    elif isinstance(at, datetime):
        if at.tzinfo is None:
            raise ValueError("record(at=...) needs an aware datetime")
        minute = int(at.timestamp() // 60)
    else:
        minute = int(at // 60)
    if not _started:
        _start()
    if _redis_mode:
        from metrics_app import redis_buffer

        try:
            redis_buffer.record(name, minute, count)
        except Exception as exc:  # Redis down: the count is lost, the request is not
            _report_redis_failure(name, count, exc)
        return
    key = (name, minute)
    global _dropped_events, _dropped_keys
    with _lock:
        old = _counts.get(key)
        if old is not None:
            _counts[key] = old + count
            return
        if len(_counts) + _pending_keys < _max_keys:
            _counts[key] = count
            return
        _dropped_events += count
        _dropped_keys += 1
    _report_drop(name, count)


_redis_failure_logged = 0.0


def _report_redis_failure(name: str, count: int, exc: Exception) -> None:
    """Count what the Redis buffer could not take as dropped; log at most once a minute."""
    global _dropped_events, _dropped_keys, _redis_failure_logged
    with _lock:
        _dropped_events += count
        _dropped_keys += 1
    now = time.monotonic()
    if now - _redis_failure_logged > 60:
        _redis_failure_logged = now
        logger.error("metrics: the Redis buffer failed, counts of %r dropped: %s", name, exc)


def _report_drop(name: str, count: int) -> None:
    global _drop_reported
    if _drop_reported:
        return
    _drop_reported = True
    logger.error(
        "metrics buffer full (METRICS_MAX_BUFFERED_KEYS=%d): dropping counts for new keys "
        "such as %r until a flush succeeds",
        _max_keys,
        name,
    )
    from metrics_app.signals import buffer_full

    buffer_full.send(sender=None, name=name, count=count, max_keys=_max_keys)


def _refresh_settings() -> float:
    global _max_keys, _redis_mode
    _max_keys = conf.MAX_BUFFERED_KEYS
    _redis_mode = conf.BUFFER == "redis"
    return conf.FLUSH_INTERVAL


def _start() -> None:
    global _started
    with _start_lock:
        if _started:
            return
        interval = _refresh_settings()
        _install_exit_hooks()
        if interval > 0 and not _redis_mode:
            _start_thread()
        _started = True


def _start_thread() -> None:
    global _thread
    if _thread is not None and _thread.is_alive():
        return
    _wakeup.clear()
    _thread = threading.Thread(target=_run, name="metrics-flusher", daemon=True)
    _thread.start()


#: The settings this module caches once started (the rest are read where they are used).
_CACHED_SETTINGS = frozenset(
    {"METRICS_BUFFER", "METRICS_FLUSH_INTERVAL", "METRICS_MAX_BUFFERED_KEYS"}
)


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if _started and setting in _CACHED_SETTINGS:
        interval = _refresh_settings()
        if interval > 0 and not _redis_mode:
            _start_thread()
        else:
            _wakeup.set()


def _run() -> None:
    from django.db import connections

    try:
        _loop()
    finally:
        # This thread's own database connections; nobody else would close them.
        connections.close_all()


def _loop() -> None:
    delay = conf.FLUSH_INTERVAL
    while True:
        _wakeup.wait(delay)
        _wakeup.clear()
        interval = conf.FLUSH_INTERVAL
        if (
            not _started
            or threading.current_thread() is not _thread
            or interval <= 0
            or conf.BUFFER == "redis"
        ):
            return
        ok = flush(raise_errors=False) is not None
        delay = interval if ok else min(interval * 2**_failures, conf.MAX_RETRY_DELAY)


def _take(blocking: bool = True) -> bool:
    """Move the live dict into the queue as a new batch. False if the lock was busy."""
    global _counts, _sequence, _pending_keys
    if not _lock.acquire(blocking):
        return False
    try:
        counts, _counts = _counts, {}
        if counts:
            _sequence += 1
            _pending.append(Batch(f"{_process_id}:{_sequence}", counts))
            _pending_keys += len(counts)
    finally:
        _lock.release()
    return True


def flush(*, raise_errors: bool = True, blocking: bool = True) -> int | None:
    """Write everything buffered in this process to the database, now.

    Returns the number of ``(series, minute)`` keys written, or None when a batch failed (and
    ``raise_errors`` is False); failed batches stay queued for the next flush.
    """
    global _pending_keys, _failures, _dropped_events, _dropped_keys, _drop_reported
    if not _flush_lock.acquire(blocking):
        return None
    try:
        if not _take(blocking):
            return None
        if _dropped_events:
            with _lock:
                events, keys = _dropped_events, _dropped_keys
                _dropped_events = _dropped_keys = 0
            logger.error(
                "metrics buffer full: dropped %d events in %d new (series, minute) keys",
                events,
                keys,
            )
        _drop_reported = False
        if not _pending:
            return 0
        from metrics_app import storage
        from metrics_app.signals import flush_failed, flushed

        written = batches = 0
        while _pending:
            batch = _pending[0]
            try:
                applied = storage.write_counts(batch.counts, batch.flush_id)
            except Exception as exc:
                _failures += 1
                logger.warning(
                    "metrics flush failed (attempt %d, %d keys kept buffered): %s",
                    _failures,
                    _pending_keys,
                    exc,
                )
                flush_failed.send(
                    sender=None, exception=exc, buffered_keys=_pending_keys, attempt=_failures
                )
                if raise_errors:
                    raise
                return None
            _pending.popleft()
            with _lock:
                _pending_keys -= len(batch.counts)
            if applied:
                written += len(batch.counts)
                batches += 1
        _failures = 0
        flushed.send(sender=None, buckets=written, batches=batches)
        return written
    finally:
        _flush_lock.release()


def stats() -> dict[str, int]:
    """Buffered keys, queued batches and events dropped since the last flush."""
    with _lock:
        return {
            "buffered_keys": len(_counts) + _pending_keys,
            "pending_batches": len(_pending),
            "dropped_events": _dropped_events,
            "failures": _failures,
        }


def _flush_at_exit() -> None:
    if os.getpid() != _hooks_pid:
        return
    try:
        flush(raise_errors=True)
    except Exception:
        logger.exception("metrics: final flush failed; %d keys lost", _pending_keys)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    previous = _previous_sigterm
    if callable(previous):
        # A server's own graceful shutdown (gunicorn, Celery): flush what we can, then let it
        # run; atexit flushes the rest. The signal may have interrupted this thread inside a
        # database call (or holding the buffer's lock): flushing on its connection would wait
        # on itself, so the flush runs in a thread of its own, with its own connection.
        _flush_beside(SIGTERM_FLUSH_TIMEOUT)
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:
        # Default action would kill us without atexit: exit through SystemExit instead, which
        # unwinds (releasing any lock) and runs the atexit flush.
        raise SystemExit(128 + signum)


#: Seconds a SIGTERM waits for its flush before the server's own handler runs.
SIGTERM_FLUSH_TIMEOUT = 10.0


def _flush_beside(timeout: float) -> None:
    """Flush from a new thread (its own database connection) and wait up to ``timeout``."""

    def run() -> None:
        from django.db import connections

        try:
            flush(raise_errors=False, blocking=False)
        except Exception:  # pragma: no cover  (flush logs its own failures)
            logger.exception("metrics: flush on SIGTERM failed")
        finally:
            connections.close_all()  # this thread's own

    thread = threading.Thread(target=run, name="metrics-sigterm-flush", daemon=True)
    thread.start()
    thread.join(timeout)


def _install_exit_hooks() -> None:
    global _hooks_pid, _previous_sigterm
    if _hooks_pid == os.getpid():
        return
    _hooks_pid = os.getpid()
    atexit.register(_flush_at_exit)
    if conf.HANDLE_SIGTERM and threading.current_thread() is threading.main_thread():
        current = signal.getsignal(signal.SIGTERM)
        if current is not _on_sigterm:
            _previous_sigterm = current
            signal.signal(signal.SIGTERM, _on_sigterm)


def connect_celery_shutdown() -> None:
    """Flush in each Celery pool process as it shuts down (prefork children skip atexit)."""
    try:
        from celery.signals import worker_process_shutdown
    except ImportError:  # celery is an optional extra
        return
    worker_process_shutdown.connect(_celery_shutdown, weak=False)


def _celery_shutdown(**kwargs: Any) -> None:
    if _started:
        flush(raise_errors=False)


def _after_fork_in_child() -> None:
    global _lock, _counts, _started, _start_lock, _flush_lock, _pending, _pending_keys
    global _process_id, _sequence, _thread, _wakeup, _dropped_events, _dropped_keys
    global _failures, _drop_reported
    _lock = threading.Lock()
    _start_lock = threading.Lock()
    _flush_lock = threading.Lock()
    _counts = {}
    _pending = deque()
    _pending_keys = 0
    _process_id = uuid.uuid4().hex
    _sequence = 0
    _thread = None
    _wakeup = threading.Event()
    _dropped_events = _dropped_keys = _failures = 0
    _drop_reported = False
    _started = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def reset() -> None:
    """Forget everything buffered and stop the thread (for tests)."""
    global _started, _counts, _pending, _pending_keys, _failures, _dropped_events
    global _dropped_keys, _drop_reported, _thread
    thread = _thread
    _started = False
    _wakeup.set()
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=5)
    _thread = None
    with _lock:
        _counts = {}
        _pending = deque()
        _pending_keys = 0
        _failures = _dropped_events = _dropped_keys = 0
        _drop_reported = False
