"""Helpers for tests, ours and yours: a clock you can move."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from unittest import mock

from metrics_app import clock


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
