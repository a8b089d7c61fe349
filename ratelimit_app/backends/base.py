"""The counter backend interface and what every backend shares.

A backend runs a :class:`~ratelimit_app.windows.Plan` for one subject in one round trip:
increment the plan's write buckets (when counting), then read its buckets, and return the
values in the order of ``plan.reads``. Any failure raises :class:`BackendError`; a backend
never returns zeros it did not read.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, NamedTuple

from ratelimit_app.conf import conf
from ratelimit_app.exceptions import BackendError
from ratelimit_app.windows import Plan

logger = logging.getLogger("ratelimit_app")

#: memcached reads a TTL over 30 days as a Unix timestamp.
MEMCACHED_MAX_RELATIVE_TTL = 30 * 86400


class Op(NamedTuple):
    """One subject's part of a round trip: count (``increment``), take back (``undo``: the
    increments of that plan, a refused hit) and read ``plan``'s buckets."""

    namespace: str
    plan: Plan
    increment: bool = False
    undo: Plan | None = None


class Encoded:
    """A plan's key suffixes as bytes, and where each one sits in ``plan.reads``.

    Plans are memoised and shared by every subject (:mod:`ratelimit_app.windows`), so their
    byte forms are computed once, and a check's per-request work does not grow with the
    number of buckets it reads.
    """

    __slots__ = ("index", "plan", "reads", "write_index", "writes")

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.reads = [s.encode() for s in plan.reads]
        self.writes = [(s.encode(), ttl) for s, ttl in plan.writes]
        self.index = {s: i for i, s in enumerate(self.reads)}
        #: For each write, the position of the same bucket in the reads (or -1).
        self.write_index = [self.index.get(s, -1) for s, _ in self.writes]

    def merge(self, values: list[int], written: Sequence[int | bytes | str]) -> None:
        """Raise each written bucket's read value to what its increment returned.

        The increment's reply is proof of the write; a read that found less (an eviction
        between the two, a replica) must not make the check more lenient than that proof.
        """
        for i, value in zip(self.write_index, written, strict=True):
            if i >= 0 and values[i] < int(value):
                values[i] = int(value)


class Backend(ABC):
    """Counts bucket hits for subjects. One instance per cache alias and process."""

    #: True when a check is bounded loopback-class I/O an event loop may run inline.
    inline_ok = False
    #: How this backend encodes a plan (see :meth:`encoded`).
    encoding: type[Encoded] = Encoded

    def __init__(self, alias: str, cache: Any) -> None:
        self.alias = alias
        #: Prepended to every key: the cache's KEY_PREFIX and VERSION (as Django's key
        #: function writes them) and ``RATELIMIT_CACHE_PREFIX``.
        self.cache_prefix = str(cache.make_key(""))
        #: ``RATELIMIT_CACHE_PREFIX``; keys are cache_prefix + rl_prefix + namespace + suffix.
        self.rl_prefix = conf.CACHE_PREFIX
        self._dead_until = 0.0
        self._encodings: dict[int, Encoded] = {}

    def encoded(self, plan: Plan) -> Encoded:
        """The byte form of ``plan``, cached by identity (plans are memoised objects)."""
        entry = self._encodings.get(id(plan))
        if entry is None or entry.plan is not plan:
            if len(self._encodings) > 1024:
                self._encodings.clear()
            entry = self.encoding(plan)
            self._encodings[id(plan)] = entry
        return entry

    @abstractmethod
    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        """Run every op (several subjects: the rules of one request) in one round trip where
        the backend can; return each op's values in the order of its ``plan.reads``.

        Each op first takes back its ``undo`` plan's increments, then increments its plan's
        write buckets (when ``increment``), then reads. Raise BackendError on any failure.
        """

    def run(
        self, namespace: str, plan: Plan, increment: bool, undo: Plan | None = None
    ) -> list[int]:
        """:meth:`run_many` for one subject."""
        return self.run_many((Op(namespace, plan, increment, undo),))[0]

    @abstractmethod
    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        """Forget the given buckets of a subject."""

    def close(self) -> None:  # noqa: B027  (optional hook: most backends hold nothing)
        """Release connections (settings changed, or the process is forking)."""

    # -- circuit breaker: a dead server is skipped for RATELIMIT_DEAD_RETRY seconds ----------

    def _check_alive(self) -> None:
        if self._dead_until and time.monotonic() < self._dead_until:
            raise BackendError(f"{self.alias}: server marked down, retrying later")

    def _failed(self, exc: BaseException) -> BackendError:
        self._dead_until = time.monotonic() + conf.DEAD_RETRY
        logger.warning("ratelimit: backend %r failed: %s", self.alias, exc)
        return BackendError(f"{self.alias}: {exc}")

    def _succeeded(self) -> None:
        if self._dead_until:
            self._dead_until = 0.0
