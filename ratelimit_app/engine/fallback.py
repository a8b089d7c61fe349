"""Counting in this process's memory while the counters cannot be reached: a limit's
``fallback``.

A limit whose policy falls back (``fallback="memory"``, or ``RATELIMIT_FALLBACK =
"memory"`` for every limit that does not say ``False``) is neither failed open nor failed
closed when its backend fails: :func:`ratelimit_app.engine.enforce.decide` checks it again on
this process's :class:`~ratelimit_app.backends.memory.MemoryBackend`, with the same
algorithm, rates, costs and keys, so a subject is refused after N hits in a window in each
process (with P processes, at most P times N across a site). A hit counted in memory is taken
back, charged and given back in memory too.

Each request still asks its backend first: a server marked down answers at once (it is
skipped for ``DEAD_RETRY`` seconds), and the first check that reaches it again counts there
again; counts made in memory are not replayed, and they stay (until their buckets expire)
for another outage. A process logs one line and sends one
:data:`~ratelimit_app.signals.fallback_changed` when it starts counting in memory and one when
it stops, never one per request.
"""

from __future__ import annotations

import logging
import threading

from ratelimit_app import clock
from ratelimit_app.backends.memory import MemoryBackend
from ratelimit_app.conf import conf
from ratelimit_app.exceptions import BackendError
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.signals import fallback_changed

__all__ = ["MAX_SUBJECTS", "Fallback", "fallback", "falls_back", "recovered"]

logger = logging.getLogger("ratelimit_app")

#: The subjects a process counts in memory during an outage at most (a subject is one
#: limit's counters for one client, a few hundred bytes): the least recently used is
#: forgotten first, and starts again from 0.
MAX_SUBJECTS = 10_000


def _now() -> float:
    return clock.now()  # (read through the module: a test's frozen clock moves expiry too)


class Fallback:
    """A process's memory counters (:attr:`memory`, :data:`MAX_SUBJECTS` subjects at most,
    the least recently used forgotten) and whether it counts in them now (:attr:`active`)."""

    __slots__ = ("_lock", "active", "memory")

    def __init__(self) -> None:
        self.memory = MemoryBackend("memory", None, MAX_SUBJECTS, clock=_now)
        #: True from the first check counted in memory until the backend answers again.
        self.active = False
        self._lock = threading.Lock()

    def start(self, error: BackendError) -> None:
        """The backend failed and a check counts in memory: logged and signalled once."""
        with self._lock:
            if self.active:
                return
            self.active = True
        alias = conf.USE_CACHE
        logger.warning(
            "ratelimit: counter backend %r failed (%s): the limits with a fallback count in "
            "each process's memory until it answers again",
            alias,
            error,
        )
        fallback_changed.send(sender=BackendError, alias=alias, in_memory=True, error=error)

    def end(self) -> None:
        """The backend answered again: logged and signalled once."""
        with self._lock:
            if not self.active:
                return
            self.active = False
        alias = conf.USE_CACHE
        logger.warning(
            "ratelimit: counter backend %r answers again: the limits count on it again", alias
        )
        fallback_changed.send(sender=BackendError, alias=alias, in_memory=False, error=None)

    def close(self) -> None:
        """Forget the counts (the settings changed)."""
        self.memory.clear()


def fallback() -> Fallback:
    """This process's :class:`Fallback` (made on first use)."""
    return RUNTIME.part(Fallback)


def recovered() -> None:
    """A check reached the backend: if this process counted in memory, it stops (one call
    per request that counts on the backend; nothing to do unless a fallback happened)."""
    found = RUNTIME.parts.get(Fallback)
    if found is not None and found.active:
        found.end()


def falls_back(policy_fallback: bool | None) -> bool:
    """True when a policy's ``fallback`` counts in memory (None: as the setting says)."""
    return conf.FALLBACK if policy_fallback is None else policy_fallback
