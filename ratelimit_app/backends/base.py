"""The counter backend interface and what every backend shares.

A backend runs a :class:`~ratelimit_app.windows.Plan` for one subject in one round trip:
increment the plan's write buckets (when counting), then read its buckets, and return the
values in the order of ``plan.reads``. Any failure raises :class:`BackendError`; a backend
never returns zeros it did not read.

Leaky buckets (:mod:`ratelimit_app.gcra`) are metered by :meth:`Backend.meter_many`: read a
subject's TAT, decide, and store the new one only if nothing else changed it meanwhile. The
default implementation, on any Django cache, is atomic within one process only (for
development); memcached and Redis override it.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

from django.conf import settings
from django.core.cache import caches

from ratelimit_app import gcra
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


class MeterReply(NamedTuple):
    """What a leaky-bucket op found and did: the TAT it ``read`` (ticks; None: nothing
    stored), the TAT it ``written`` (None: the request was not admitted, or only looked), and
    the backend's ``token`` for taking it back (memcached: the item's CAS id)."""

    read: int | None
    written: int | None = None
    token: Any = None


class MeterOp(NamedTuple):
    """One subject's leaky bucket in a round trip: admit (``increment``) when one more
    fits, or only look. With ``take_back`` (the reply of this request's admitting op), take
    that request back instead, if nothing has changed the TAT since (else it stays counted:
    taking back a request another one's TAT depends on could be lenient)."""

    namespace: str
    meter: gcra.Meter
    increment: bool = False
    take_back: MeterReply | None = None


#: The default meter's read-decide-write is atomic within a process, not across processes.
_meter_lock = threading.Lock()


class Encoded:
    """A plan's key suffixes as bytes, and where each one sits in ``plan.reads``.

    Plans are memoised and shared by every subject (:mod:`ratelimit_app.windows`), so their
    byte forms are computed once, and a check's per-request work does not grow with the
    number of buckets it reads.
    """

    __slots__ = ("index", "plan", "proofs", "reads", "write_index", "writes")

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.reads = [s.encode() for s in plan.reads]
        self.writes = [(s.encode(), ttl) for s, ttl in plan.writes]
        self.index = {s: i for i, s in enumerate(self.reads)}
        #: For each write, the position of the same bucket in the reads (or -1).
        self.write_index = [self.index.get(s, -1) for s, _ in self.writes]
        #: (position in the reads, position in the writes) of each written bucket a check
        #: also reads (the current coarse bucket of each rate): what :meth:`merge` compares.
        self.proofs: list[tuple[int, int]] = []
        self.refresh_proofs()

    def refresh_proofs(self) -> None:
        """Derive :attr:`proofs` from :attr:`write_index` (after a backend reorders it)."""
        self.proofs = [(i, j) for j, i in enumerate(self.write_index) if i >= 0]

    def merge(self, values: list[int], written: Sequence[int | bytes | str]) -> None:
        """Raise each written bucket's read value to what its increment returned.

        The increment's reply is proof of the write; a read that found less (an eviction
        between the two, a replica) must not make the check more lenient than that proof. A
        read that found more (hits of other clients that came in between, on a server that
        does not run the round trip atomically) is kept: under concurrency a hit may then be
        refused where it would have fit, never admitted where it would not. (Deciding on the
        reply alone was tried while a CI run saw 13 admitted of a limit of 10 across four
        gunicorn workers on memcached; a race found since explains it: the clock-order race at
        bucket boundaries that :func:`ratelimit_app.windows.lookahead` closes. This rule,
        the stricter, stays.) ``written`` holds one reply per write, in the order of
        :attr:`writes`.
        """
        if len(written) != len(self.writes):
            raise ValueError(f"{len(written)} write replies for {len(self.writes)} writes")
        for i, j in self.proofs:
            proof = int(written[j])
            if values[i] < proof:
                values[i] = proof


def cache_settings(alias: str) -> tuple[Any, dict[str, Any]]:
    """The ``LOCATION`` and ``OPTIONS`` of ``settings.CACHES[alias]`` (``""`` and ``{}`` when
    absent), for a backend that talks to the cache's servers itself."""
    config = settings.CACHES[alias]
    return config.get("LOCATION", ""), dict(cast(dict[str, Any], config.get("OPTIONS") or {}))


class Backend(ABC):
    """Counts bucket hits for subjects. One instance per cache alias and process.

    The contract (``docs/backends.rst``, "Your own backend", states it for users):

    * built as ``cls(alias, cache)``: the key of ``CACHES`` and Django's cache object for it
      (:func:`ratelimit_app.backends.build`); call ``super().__init__(alias, cache)``, and
      read the cache's ``LOCATION`` and ``OPTIONS`` with :func:`cache_settings` if needed;
    * must implement :meth:`run_many` and :meth:`delete`;
    * may override :meth:`meter_many` (leaky buckets; the default runs on the Django cache
      under a process lock), :meth:`exchange` (both kinds in one round trip), :meth:`close`,
      and set :attr:`inline_ok`.
    """

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

    def meter_many(self, ops: Sequence[MeterOp], now_us: int) -> list[MeterReply]:
        """Meter every op's leaky bucket at ``now_us`` (the client's clock, microseconds);
        one reply per op. Raise BackendError on any failure.

        This default runs on any Django cache (``get`` and ``set``), under a process-wide
        lock: exact in one process, racy across processes (for development).
        """
        cache = caches[self.alias]  # Django's cache objects are per thread.
        replies = []
        with _meter_lock:
            for op in ops:
                key = self.rl_prefix + op.namespace + gcra.SUFFIX  # make_key adds prefixes
                try:
                    read = gcra.decode(op.meter, cache.get(key))
                    written = self._meter_decision(op, read, now_us)
                    if op.take_back is not None:
                        if read is not None and read == op.take_back.written:
                            restored = gcra.take_back(op.meter, read)
                            ttl = gcra.ttl_seconds(op.meter, restored, now_us)
                            cache.set(key, gcra.encode(op.meter, restored).decode(), ttl)
                    elif written is not None:
                        ttl = gcra.ttl_seconds(op.meter, written, now_us)
                        cache.set(key, gcra.encode(op.meter, written).decode(), ttl)
                except Exception as exc:  # includes a TAT that is not one
                    raise BackendError(f"{self.alias}: {exc}") from exc
                replies.append(MeterReply(read, written))
        return replies

    @staticmethod
    def _meter_decision(op: MeterOp, read: int | None, now_us: int) -> int | None:
        """The TAT ``op`` stores when it read ``read`` (None: it stores nothing)."""
        if op.take_back is None and op.increment and gcra.fits(op.meter, read, now_us):
            return gcra.advance(op.meter, read, now_us)
        return None

    def exchange(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        """:meth:`run_many` and :meth:`meter_many` (the rules of a request of both
        algorithms) in as few round trips as the backend can: here one call each."""
        return (
            self.run_many(ops) if ops else [],
            self.meter_many(meters, now_us) if meters else [],
        )

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
