"""What a process remembers of its refusals, so a flood costs less than serving.

When a check refuses a subject with an exact wait of R seconds, the window cannot admit it
again before R has passed: later hits of other clients only add to its counts, and refused
hits are not counted. So this process refuses the subject's later requests under the same
limit **from memory**, with no round trip, until R has passed or a cap has (5 s,
:data:`ratelimit_app.engine.refusals.remembered.REFUSAL_MEMORY`; whichever comes first). That
keeps the limiter *never lenient*. The cap bounds what memory cannot see: a reset made in another
process, or a rule changed in the admin, reaches this process within that many seconds; a reset
made in this process (:func:`ratelimit_app.operators.operations.reset`) is seen at once.

When the cap has run out but the wait has not, the refusal is **due**: the caller confirms
it with a look that counts nothing (:func:`ratelimit_app.engine.refusals.recall.recall_many`: one
round trip with no writes, where a counted check that is refused makes two) and remembers it
again, or forgets it when the window has room after all. The same look confirms the refusals that
will be due **soon** (:meth:`Memory.soon`) among those that were answered from memory since they
were remembered (**hot**: their subjects come back within the cap), so a botnet of many refused
subjects costs a few looks per cap, not one per subject; a crowd whose subjects come back less
often than the cap costs one look of its own per due refusal, never a batch of looks at subjects
that will not come back in time.

A refusal is **settled** for as long as the events that were in its window before the last
few seconds keep the window full (:func:`ratelimit_app.algorithms.windows.settled_wait`):
those are admitted hits, not another client's refused hit that is still to be taken back,
and nothing but a reset or a changed rule takes them away before they leave. While the process
knows that neither happened (:meth:`Memory.vouch`: its look at the version counters, about once
a second, found no count lowered and no rule changed), a settled refusal is answered from
memory past its cap, until it is no longer settled: a crowd of refused subjects, each back
later than the cap, costs no round trip but its first in each process. A process that stops
looking (no request through the middleware) falls back to the cap within one cap.

The memory keeps refusals only while the process is refusing a **flood**
(:attr:`Memory.flood` refusals within a second or so; :meth:`Memory.flooding`): below that
each refusal is checked by a round trip, which a trickle can afford, and a count that went
down by any means (a reset, ``cache.clear()`` in a test suite) is seen at once.

The memory is a bounded least-recently-used map (:attr:`Memory.size` subjects),
O(1) and thread-safe, and a forked child starts with its own lock (the parent's refusals
stay true in the child). Times are the limiter's clock (:mod:`ratelimit_app.clock`).
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

__all__ = ["Memory"]

T = TypeVar("T")

#: A refusal remembered: (refused at, refused from memory until, the wait ends at, what it
#: was, hot, settled until).
Entry = tuple[float, float, float, T, bool, float]


class Memory(Generic[T]):
    """Refusals by key: each with the time it was made, the time it ends, and what it was
    (the caller's result)."""

    def __init__(self, size: int = 10_000, flood: int = 50) -> None:
        self.size = size
        #: Refusals within about a second from which the process remembers them.
        self.flood = flood
        #: Remember every refusal, flood or not (tests of the memory itself).
        self.always = False
        #: The second refusals are being counted in, their number, the second before's.
        self._second = 0
        self._counted = self._before = 0
        self._lock = threading.Lock()
        #: key -> (refused at, refused from memory until, the wait ends at, what it was,
        #: answered from memory since it was remembered: hot, settled until).
        #: Read it only to know whether any refusal is held: ``if memory.entries`` is the
        #: request path's test, without the call ``len()`` makes.
        self.entries: OrderedDict[Hashable, Entry[T]] = OrderedDict()
        #: ``(refused from memory until, n, key)`` of each hot refusal, soonest due first:
        #: what :meth:`soon` reads without a pass over :attr:`entries`. An item whose entry
        #: is gone or was remembered again is stale, dropped when it comes up.
        self._due: list[tuple[float, int, Hashable]] = []
        self._n = itertools.count()
        #: When the process last learnt that no count was lowered and no rule changed
        #: (:meth:`vouch`); -inf: never, or not since it forgot everything.
        self.vouched = -math.inf

    def __len__(self) -> int:
        return len(self.entries)

    def flooding(self, at: float) -> bool:
        """Count a refusal made at ``at``: True when the process has refused at least
        :attr:`flood` requests in this second and the one before (this one included), or
        when told to remember :attr:`always`. No lock: a race miscounts one refusal."""
        second = int(at)
        if second != self._second:
            self._before = self._counted if second == self._second + 1 else 0
            self._second, self._counted = second, 0
        self._counted += 1
        return self.always or self._counted + self._before >= self.flood

    def in_flood(self, at: float) -> bool:
        """True while the process refuses a flood at ``at`` (as :meth:`flooding` counts it,
        without counting one more; :attr:`always` aside)."""
        second = int(at)
        if second == self._second:
            return self._counted + self._before >= self.flood
        return second == self._second + 1 and self._counted >= self.flood

    def remember(
        self,
        key: Hashable,
        at: float,
        until: float,
        what: T,
        ends: float | None = None,
        settled: float = -math.inf,
    ) -> None:
        """Refuse ``key`` from ``at`` until ``until``, and know that its wait ``ends`` then
        (default: ``until``) and that it is settled until ``settled`` (answered past
        ``until`` while :meth:`vouch` says so; a refusal remembered again keeps the later of
        the two). The least recently used refusal is forgotten when the memory is full."""
        if until <= at or self.size <= 0:
            return
        ends = until if ends is None else max(ends, until)
        with self._lock:
            entries = self.entries
            before = entries.get(key)
            if before is not None and before[5] > settled:
                settled = before[5]
            entries[key] = (at, until, ends, what, False, min(settled, ends))
            entries.move_to_end(key)
            if len(entries) > self.size:
                entries.popitem(last=False)

    def vouch(self, at: float) -> None:
        """At ``at``, the process learnt that no count was lowered and no rule changed since
        it last looked: each settled refusal is answered from memory past its cap, until it
        is no longer settled or for one cap's length after ``at`` (whichever comes first)."""
        self.vouched = at

    def unsettle(self, keys: Iterable[Hashable]) -> None:
        """Answer the refusals of ``keys`` from memory only until their cap: their counts may
        go down before their waits end (a failure-only limit's hits, taken back after the
        view when the request did not fail)."""
        with self._lock:
            entries = self.entries
            for key in keys:
                e = entries.get(key)
                if e is not None and e[5] > -math.inf:
                    entries[key] = (e[0], e[1], e[2], e[3], e[4], -math.inf)

    def _vouched(self, entry: Entry[T], now: float) -> bool:
        """Whether the memory is vouched for at ``now`` as far as ``entry`` goes: within its
        cap's length after the last :meth:`vouch`."""
        return now < self.vouched + entry[1] - entry[0]

    def _held(self, entry: Entry[T], now: float) -> bool:
        """Whether ``entry`` is answered from memory at ``now`` (ended or not): within its
        cap, or settled and vouched for."""
        return now < entry[1] or (now < entry[5] and self._vouched(entry, now))

    def settles(self, key: Hashable, now: float, after: float) -> bool:
        """Whether ``key``'s refusal may have settled by ``now``: it is not known settled,
        it was remembered ``after`` seconds ago or more (its hits have aged since), and the
        memory is vouched for (:meth:`vouch`), so knowing would hold it past its cap."""
        e = self.entries.get(key)
        return e is not None and e[5] <= now and now - e[0] >= after and self._vouched(e, now)

    def _heat(self, key: Hashable, entry: Entry[T]) -> None:
        """Mark ``key``'s refusal hot: answered from memory, so its subject comes back within
        the cap, and :meth:`soon` may confirm it in a look (call with the lock held)."""
        self.entries[key] = (entry[0], entry[1], entry[2], entry[3], True, entry[5])
        due = self._due
        heapq.heappush(due, (entry[1], next(self._n), key))
        if len(due) > 2 * len(self.entries) + 1024:  # mostly stale: made again
            self._due = [(e[1], next(self._n), k) for k, e in self.entries.items() if e[4]]
            heapq.heapify(self._due)

    def _entry(self, key: Hashable, now: float) -> Entry[T] | None:
        """``key``'s refusal if its wait has not ended at ``now`` (call with the lock held;
        an ended refusal, or one from a clock that went back, is forgotten)."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        if not entry[0] <= now < entry[2]:  # ended, or the clock went back: ask the backend
            del self.entries[key]
            return None
        self.entries.move_to_end(key)
        return entry

    def holds(self, keys: Iterable[Hashable | None]) -> bool:
        """True when one of ``keys`` (None: no key) has an entry, ended or not.

        No lock: one dict lookup per key, atomic under the GIL. A site that refused anyone
        lately holds entries, and then every checked request asks: this is its common
        case, the request's own subjects not refused. A refusal remembered by another
        thread just after the look is missed, and the caller makes its counted check, as if
        the look had come first."""
        entries = self.entries
        for key in keys:  # noqa: SIM110 (a loop: any() would make a generator every request)
            if key is not None and key in entries:
                return True
        return False

    def recall(self, key: Hashable, now: float) -> tuple[float, T] | None:
        """``(seconds since the refusal, what it was)`` while ``key`` is refused from memory
        at ``now``; None otherwise (see :meth:`due`)."""
        if not self.entries:  # the common case: no flood, no lock
            return None
        with self._lock:
            entry = self._entry(key, now)
            if entry is None or not self._held(entry, now):
                return None
            if not entry[4] and now < entry[1]:  # (answered from memory for the first time
                # since remembered, within its cap: a settled one held past it needs no look)
                self._heat(key, entry)
        return now - entry[0], entry[3]

    def due(self, key: Hashable, now: float) -> tuple[float, float, T] | None:
        """``(seconds since the refusal, seconds until its wait ends, what it was)`` when
        the cap has run out at ``now`` but the wait has not: confirm, then remember again."""
        if not self.entries:
            return None
        with self._lock:
            entry = self._entry(key, now)
        if entry is None or self._held(entry, now):
            return None
        return now - entry[0], entry[2] - now, entry[3]

    def soon(
        self, now: float, within: float, limit: int, besides: Iterable[Hashable] = ()
    ) -> list[tuple[Hashable, float, float, T]]:
        """Up to ``limit`` refusals (but those of ``besides``) whose cap runs out before
        ``now + within`` while their wait goes on, among the hot ones (answered from memory
        since they were remembered): ``(key, seconds since the refusal, seconds until its
        wait ends, what it was)``, the soonest due first. Read from the due index of the hot
        refusals, never by a pass over the memory (a crowd's memory holds tens of
        thousands): for a caller that confirms a due refusal and may as well confirm these
        in the same round trip."""
        if limit <= 0:
            return []
        skip = set(besides)
        horizon = now + within
        found: list[tuple[Hashable, float, float, T]] = []
        with self._lock:
            due, entries = self._due, self.entries
            put_back = []
            while due and due[0][0] < horizon and len(found) < limit:
                item = heapq.heappop(due)
                key = item[2]
                e = entries.get(key)
                if e is None or not e[4] or e[1] != item[0] or not e[0] <= now < e[2]:
                    continue  # stale: forgotten, remembered again, ended or from a clock back
                if now < e[5] and self._vouched(e, now):
                    continue  # settled, and answered from memory while vouched for: no look
                put_back.append(item)  # (still its entry's until it is remembered again)
                if key not in skip:
                    skip.add(key)  # (twice in the index: remembered again at the same time)
                    found.append((key, now - e[0], e[2] - now, e[3]))
            for item in put_back:
                heapq.heappush(due, item)
        return found

    def forget(self, keys: Iterable[Hashable]) -> None:
        """Forget the refusals of ``keys`` (their counters were reset)."""
        with self._lock:
            for key in keys:
                self.entries.pop(key, None)

    def clear(self) -> None:
        """Forget every refusal (settings changed, a count lowered elsewhere), and the flood's
        count; vouch for none until told again."""
        with self._lock:
            self.entries.clear()
            self._due.clear()
            self._counted = self._before = 0
            self.vouched = -math.inf

    def _after_fork(self) -> None:
        # Another thread may have held the lock when the process forked: a new one. The
        # refusals themselves stay true in the child.
        self._lock = threading.Lock()


def after_fork(memory: Memory[T]) -> None:
    """Give ``memory`` a fresh lock in every forked child (gunicorn ``--preload``)."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=memory._after_fork)
