"""Round trips as values: the engine's checks say what they send, a driver sends it.

The engine's work on a request (:func:`ratelimit_app.engine.enforce.deciding`, the checks of
:mod:`.checking`, the looks of :mod:`.refusals.recall`) is written once, as generators that
**yield** each round trip they need, a :class:`Trip` (the backend, its ops, the time of the
check), and receive its replies, or the :class:`~ratelimit_app.exceptions.BackendError` it
raised (thrown into them). They hold no socket. Two drivers run them:

- :func:`run`, for a sync caller: each trip through
  :meth:`~ratelimit_app.backends.base.Backend.execute`, on the calling thread;
- :func:`arun`, for an async one (an async view, the middleware's ``__acall__``,
  :func:`~ratelimit_app.core.aget_usage`): each trip through
  :meth:`~ratelimit_app.backends.base.Backend.aexecute`, awaited, so the event loop serves
  other requests while the counters answer.

Everything between the trips (the steps, the verdict, the refusal memory, the signals) is
the same code on both paths: there is one engine, and the two paths cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator, Sequence
from typing import Any, NamedTuple, TypeVar

from ratelimit_app.backends.base import Backend, adrive, drive

__all__ = ["Checking", "Trip", "arun", "run"]

T = TypeVar("T")


class Trip(NamedTuple):
    """One round trip a check needs: ``backend.execute(ops, now_us)``."""

    backend: Backend
    ops: Sequence[Any]
    now_us: int


#: A generator of the engine's: yields trips, receives their replies, returns its answer.
Checking = Generator[Trip, Any, T]


def run(checking: Checking[T]) -> T:
    """Run ``checking`` on this thread: each trip through the backend's ``execute``."""
    return drive(checking, _execute)


async def arun(checking: Checking[T]) -> T:
    """Run ``checking`` on the event loop: each trip through the backend's ``aexecute``,
    awaited (the loop serves other requests meanwhile)."""
    return await adrive(checking, _aexecute)


def _execute(trip: Trip) -> list[Any]:
    return trip.backend.execute(trip.ops, trip.now_us)


def _aexecute(trip: Trip) -> Awaitable[list[Any]]:
    return trip.backend.aexecute(trip.ops, trip.now_us)
