"""Helpers for tests, ours and yours: a clock you can move, and flushing by hand."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from unittest import mock

from metrics_app import clock
from metrics_app.buffer import flusher, process


class FrozenClock:
    """A clock that stands still until told to move, at Unix seconds or an aware datetime.

    ``ratelimit_app.testing`` has the same class for its own clock: neither app imports the
    other (docs/architecture.rst), so each keeps a copy; a test keeps the two the same.
    """

    def __init__(self, t: float | datetime) -> None:
        self.set(t)

    def __call__(self) -> float:
        return self.t

    def set(self, t: float | datetime) -> None:
        """Jump to ``t``."""
        self.t = t.timestamp() if isinstance(t, datetime) else float(t)

    def advance(self, seconds: float) -> None:
        """Move forward (back, when negative)."""
        self.t += seconds


@contextmanager
def frozen_clock(t: float | datetime) -> Iterator[FrozenClock]:
    """Make :func:`metrics_app.clock.now` a :class:`FrozenClock` at ``t`` inside the block."""
    fake = FrozenClock(t)
    with mock.patch.object(clock, "now", fake):
        yield fake


@contextmanager
def manual_flush() -> Iterator[None]:
    """Inside the block, this process's buffer flushes only when told: no flusher thread
    (a running one stops), and a buffer that starts installs no SIGTERM handler. A test calls
    :func:`metrics_app.flush`.

    Use it around a whole test session (a session-scoped autouse fixture, or a test
    runner's ``setup_test_environment``) or around one test. On leaving, a started buffer
    starts its thread again. Counting, the ``atexit`` flush and the Redis buffer work as
    usual.
    """
    try:
        with (
            mock.patch.object(flusher, "FLUSH_INTERVAL", 0),
            mock.patch.object(process, "HANDLE_SIGTERM", False),
        ):
            process.current().configure()  # stops a running thread
            yield
    finally:
        process.current().configure()  # a started buffer starts its thread again
