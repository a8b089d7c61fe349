"""Counters in this process's memory: what a limit counts while its counter server is down.

A :class:`MemoryBackend` runs the same plans (:mod:`ratelimit_app.algorithms.windows`) and
meters the same leaky buckets (:mod:`ratelimit_app.algorithms.gcra`) as every other backend,
with the same rates, costs and keys, on counters that live in a dict of this process. Each
process counts alone, so a limit of N spread over P processes admits up to P times N: this
store is a fallback for the time a server is marked down, not a counter to share.

**Bounded.** It holds at most ``max_subjects`` subjects (a subject is a namespace: one limit's
counters for one client), kept in least recently used order. When one more would exceed
the bound, the least recently used subject is forgotten whole: its window buckets and its
leaky bucket's TAT. A forgotten subject starts again from 0 the next time it is seen, which
is lenient for that subject only (it may be admitted up to its limit again within the
window); so size the bound above the number of subjects active within a window, and a
flood of new subjects forgets idle ones before busy ones. Within a subject, a bucket lives
its TTL from the moment it is created (as memcached's ``add`` then ``incr``), a TAT its
TTL from the moment it is written; both read as nothing once expired, and the expired ones
are dropped when their subject is next used, so a subject holds no more buckets than its
plans can still read. Expiry runs on the backend's own ``clock`` (``time.time``: real
seconds, as a server's TTLs do), not on :func:`ratelimit_app.clock.now`.

**Atomic.** Each :meth:`~MemoryBackend.run_many` and :meth:`~MemoryBackend.meter_many`
call (the rules of one request) runs whole under one lock: exact between the threads of the
process, as a server is between its clients. It does no I/O, so an event loop may run it
inline.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from ratelimit_app.algorithms import gcra
from ratelimit_app.algorithms.windows import Plan
from ratelimit_app.backends.base import Backend, MeterOp, MeterReply, Op
from ratelimit_app.conf import conf
from ratelimit_app.exceptions import BackendError

#: Subjects a :class:`MemoryBackend` holds by default before it forgets the least recently
#: used one.
MAX_SUBJECTS = 10_000


class _Bucket:
    """One bucket counter: its ``count`` and the clock time it ``expires`` at."""

    __slots__ = ("count", "expires")

    def __init__(self, count: int, expires: float) -> None:
        self.count = count
        self.expires = expires


class _Subject:
    """What is held for one namespace: its bucket counters by key suffix, and its leaky
    bucket's TAT (ticks; None: none) until ``tat_expires``."""

    __slots__ = ("buckets", "next_expiry", "tat", "tat_expires")

    def __init__(self) -> None:
        self.buckets: dict[str, _Bucket] = {}
        #: The earliest expiry of a bucket held (infinity: none): nothing to drop before it.
        self.next_expiry = float("inf")
        self.tat: int | None = None
        self.tat_expires = 0.0

    def empty(self) -> bool:
        """True when it holds nothing (its entry can go)."""
        return not self.buckets and self.tat is None

    def expire(self, now: float) -> None:
        """Drop the buckets and the TAT expired at ``now``."""
        if self.tat is not None and now >= self.tat_expires:
            self.tat = None
        if now < self.next_expiry:
            return
        self.buckets = {s: b for s, b in self.buckets.items() if now < b.expires}
        self.next_expiry = min((b.expires for b in self.buckets.values()), default=float("inf"))

    def value(self, suffix: str) -> int:
        """The count of bucket ``suffix`` (0 when it holds none; call :meth:`expire` first)."""
        bucket = self.buckets.get(suffix)
        return 0 if bucket is None else bucket.count

    def add(self, suffix: str, amount: int, ttl: int, now: float) -> None:
        """Add ``amount`` to bucket ``suffix``, creating it (at 0, expiring ``ttl`` seconds
        from ``now``) when it holds none."""
        bucket = self.buckets.get(suffix)
        if bucket is None:
            expires = now + ttl
            bucket = self.buckets[suffix] = _Bucket(0, expires)
            if expires < self.next_expiry:
                self.next_expiry = expires
        bucket.count += amount

    def subtract(self, suffix: str, amount: int) -> None:
        """Take ``amount`` from bucket ``suffix``, stopping at 0 as memcached's decrement
        does; a bucket it does not hold stays unheld (reads 0)."""
        bucket = self.buckets.get(suffix)
        if bucket is not None:
            bucket.count = max(0, bucket.count - amount)

    def store_tat(self, tat: int, ttl: int, now: float) -> None:
        """Keep ``tat`` for ``ttl`` seconds from ``now``."""
        self.tat = tat
        self.tat_expires = now + ttl


class MemoryBackend(Backend):
    """Counts in this process's memory, at most ``max_subjects`` subjects (least recently
    used forgotten); ``clock`` (seconds) times the buckets' and TATs' expiry.

    Built as ``MemoryBackend(alias, cache)`` like every backend (the cache is not used: its
    key prefix does not matter to counters no other process reads), or with no cache at all
    as a fallback store."""

    inline_ok = True  # no I/O at all

    def __init__(
        self,
        alias: str = "memory",
        cache: Any = None,
        max_subjects: int = MAX_SUBJECTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_subjects < 1:
            raise ValueError(f"max_subjects is {max_subjects!r}: it must be at least 1")
        self.alias = alias
        #: No cache's key function: nothing outside this process reads these counters.
        self.cache_prefix = ""
        #: ``RATELIMIT_CACHE_PREFIX``.
        self.rl_prefix = conf.CACHE_PREFIX
        self.key_prefix = self.cache_prefix + self.rl_prefix
        self._encodings = {}
        self.max_subjects = max_subjects
        self.clock = clock
        #: Subjects by namespace, least recently used first.
        self._subjects: OrderedDict[str, _Subject] = OrderedDict()
        self._lock = threading.Lock()

    # -- the subjects ------------------------------------------------------------------------

    def subjects(self) -> int:
        """How many subjects it holds now (at most ``max_subjects``)."""
        return len(self._subjects)

    def clear(self) -> None:
        """Forget every subject."""
        with self._lock:
            self._subjects.clear()

    def _find(self, namespace: str, now: float) -> _Subject | None:
        """The subject of ``namespace`` with its expired entries dropped, now the most
        recently used; None when it holds nothing (its entry is gone)."""
        subject = self._subjects.get(namespace)
        if subject is None:
            return None
        subject.expire(now)
        if subject.empty():
            del self._subjects[namespace]
            return None
        self._subjects.move_to_end(namespace)
        return subject

    def _hold(self, namespace: str, now: float) -> _Subject:
        """The subject of ``namespace``, created when it holds none (forgetting the least
        recently used subjects over the bound)."""
        subject = self._find(namespace, now)
        if subject is None:
            subject = self._subjects[namespace] = _Subject()
            while len(self._subjects) > self.max_subjects:
                self._subjects.popitem(last=False)
        return subject

    def _drop_if_empty(self, namespace: str, subject: _Subject | None) -> None:
        """Forget ``subject`` when an op left it holding nothing."""
        if subject is not None and subject.empty() and namespace in self._subjects:
            del self._subjects[namespace]

    # -- sliding windows ---------------------------------------------------------------------

    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        """Each op in turn, all under the lock: take back its ``undo`` plan's writes (each
        bucket stops at 0), add ``amount`` to its plan's writes (when ``increment``), then
        read ``plan.reads`` (0 for a bucket it does not hold)."""
        with self._lock:
            now = self.clock()
            return [self._run(op, now) for op in ops]

    def _run(self, op: Op, now: float) -> list[int]:
        plan: Plan = op.plan
        if op.increment:
            subject: _Subject | None = self._hold(op.namespace, now)
        else:
            subject = self._find(op.namespace, now)
        if op.undo is not None and subject is not None:
            for suffix, _ in op.undo.writes:
                subject.subtract(suffix, op.amount)
        if subject is None:
            return [0] * len(plan.reads)
        if op.increment:
            for suffix, ttl in plan.writes:
                subject.add(suffix, op.amount, ttl, now)
        values = [subject.value(s) for s in plan.reads]
        self._drop_if_empty(op.namespace, subject)
        return values

    # -- leaky buckets -----------------------------------------------------------------------

    def meter_many(self, ops: Sequence[MeterOp], now_us: int) -> list[MeterReply]:
        """Each op's leaky bucket at ``now_us``, all under the lock (exact: the TAT read is
        the one a write replaces): admit when it fits (or always, ``force``), only look, or
        take back an admitted request when its TAT is still the one stored."""
        with self._lock:
            now = self.clock()
            try:
                return [self._meter(op, now_us, now) for op in ops]
            except Exception as exc:  # as the base does (a rate of 0 charged has no TTL)
                raise BackendError(f"{self.alias}: {exc!r}") from exc

    def _meter(self, op: MeterOp, now_us: int, now: float) -> MeterReply:
        subject = self._find(op.namespace, now)
        read = None if subject is None else subject.tat
        written = self._meter_decision(op, read, now_us)
        if op.take_back is not None:
            if subject is not None and read is not None and read == op.take_back.written:
                restored = gcra.take_back(op.meter, read, op.cost)
                subject.store_tat(restored, gcra.ttl_seconds(op.meter, restored, now_us), now)
        elif written is not None:
            if subject is None:
                subject = self._hold(op.namespace, now)
            subject.store_tat(written, gcra.ttl_seconds(op.meter, written, now_us), now)
        return MeterReply(read, written)

    # -- forgetting --------------------------------------------------------------------------

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        """Forget the given buckets of a subject (:data:`gcra.SUFFIX`: its TAT); a subject
        left holding nothing is forgotten, and one it does not hold is no error."""
        with self._lock:
            subject = self._subjects.get(namespace)
            if subject is None:
                return
            for suffix in suffixes:
                if suffix == gcra.SUFFIX:
                    subject.tat = None
                else:
                    subject.buckets.pop(suffix, None)
            self._drop_if_empty(namespace, subject)
