"""Helpers for tests, ours and yours: a clock you can move."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from metrics_app import clock


class FrozenClock:
    """A settable clock; ``advance(seconds)`` moves it."""

    def __init__(self, t: float) -> None:
        self.t = float(t)

    def __call__(self) -> float:
        return self.t

    def set(self, t: float | datetime) -> None:
        self.t = t.timestamp() if isinstance(t, datetime) else float(t)

    def advance(self, seconds: float) -> None:
        self.t += seconds


@contextmanager
def frozen_clock(t: float | datetime) -> Iterator[FrozenClock]:
    """Make :func:`metrics_app.clock.now` return a time you control, inside the block."""
    fake = FrozenClock(t.timestamp() if isinstance(t, datetime) else t)
    original = clock.now
    clock.now = fake
    try:
        yield fake
    finally:
        clock.now = original
