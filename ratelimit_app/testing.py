"""Helpers for your own test suite.

``frozen_clock`` moves ratelimit_app's clock (and only its clock) so a test can travel
through a day in milliseconds::

    from ratelimit_app.testing import frozen_clock

    with frozen_clock(1_700_000_000) as clock:
        client.post("/login/", ...)
        clock.advance(61)  # one minute later
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from unittest import mock

from ratelimit_app import clock
from ratelimit_app.runtime import RUNTIME


class FrozenClock:
    """A clock that stands still until told to move, at Unix seconds or an aware datetime.

    ``metrics_app.testing`` has the same class for its own clock: neither app imports the
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
    """Make :func:`ratelimit_app.clock.now` a :class:`FrozenClock` at ``t`` inside the block."""
    fake = FrozenClock(t)
    with mock.patch.object(clock, "now", fake):
        yield fake


def forget_refusals() -> None:
    """Forget every refusal this process remembers (:mod:`ratelimit_app.engine.refusals.memory`).

    Needed only by tests that flood (the memory keeps refusals from 50 a second) or turn the
    memory on (:func:`remember_refusals`) and then clear the counters: otherwise each refusal
    is checked, so ``cache.clear()`` resets every limit, as in django-ratelimit. (Overriding
    any ``RATELIMIT_*`` setting, and :func:`ratelimit_app.operators.operations.reset`, forget them
    too.)
    """
    if RUNTIME.refusals is not None:  # (None: no check was imported yet)
        RUNTIME.refusals.clear()


@contextmanager
def remember_refusals() -> Iterator[None]:
    """Remember every refusal, not only a flood's, for tests of what the memory does (a
    flood served from memory, its round trips). Call :func:`forget_refusals` where such a
    test clears the counters."""
    from ratelimit_app.engine.refusals.remembered import remember_always

    before = remember_always(True)
    try:
        yield
    finally:
        remember_always(before)
