"""Counts per ``(series, minute)`` in memory, sealed into batches for the flusher.

**Adding** takes one lock and adds to a dict keyed by ``(name, minute)``: no I/O, no setting
read.

**Sealing** (:meth:`Aggregator.seal`) swaps the dict for an empty one under the lock and
queues it as a :class:`Batch` with an id ``<process uuid>:<sequence>``. A batch leaves the
queue only once it is written (:meth:`Aggregator.written`), so a batch that failed keeps its
id for the retry, and the flush ledger knows a retry whose first commit succeeded.

**The bounds.** Buffered keys (the live dict plus queued batches) never exceed ``max_keys``
(:data:`MAX_BUFFERED_KEYS`), and of them, keys whose name a client chose (``client_chosen``:
built from a URL, say) never exceed ``max_client_keys`` (:data:`MAX_CLIENT_KEYS`). So a
client that makes up a new name per request fills at most its share, and the rest,
``max_keys - max_client_keys``, stays free for the names the code
chooses (the limiter's ``ratelimit:<rule>`` among them): a flood of junk names cannot push
out the counts that chart the attack.

The default bounds hold a flush interval of a crowd's traffic: 100,000 series seen in one
interval that straddles a minute's end are 200,000 keys, and while that batch is written the
next interval's first keys come in; whether a client chose the names (short URLs) or the code
did. A key costs about 170 bytes (a tuple, its name, a dict slot: the minute's int is shared
by the minute's keys), so a full buffer holds some 60 MB (``test_buffer``'s
``test_the_default_bound_holds_a_flush_interval_of_a_crowd`` measures it).

At a bound, counts for keys already buffered are still added; a count for a *new*
``(name, minute)`` is dropped and counted. The first drop at each bound until the next flush
sends the ``buffer_full`` signal, and :meth:`Aggregator.take_dropped` hands the flusher the
totals and the bounds met, which it logs at ERROR in one line per flush. Memory therefore
stays bounded while the database is down, and what is lost is said out loud, once a flush.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metrics_app.signals import buffer_full

logger = logging.getLogger("metrics_app")

#: ``{(series name, minute index): count}``; minute index = Unix seconds // 60.
CountsDict = dict[tuple[str, int], int]

#: Functions told of every dropped count, ``fn(events)``: the exporters' counter
#: (:mod:`metrics_app.telemetry`). Empty unless one is installed.
DROPS: list[Callable[[int], None]] = []

#: The most ``(series, minute)`` keys a process buffers, live and queued (about 170 bytes
#: each: some 60 MB); also the most fields of the Redis buffer's live hash.
MAX_BUFFERED_KEYS = 350_000
#: Of :data:`MAX_BUFFERED_KEYS`, the most keys whose name a client chose: enough for a flush
#: interval of 100,000 short URLs across a minute's end (200,000 keys) beside the interval
#: before being written; 50,000 keys stay for the names the code chooses, whatever clients
#: send.
MAX_CLIENT_KEYS = 300_000


@dataclass(frozen=True)
class Dropped:
    """What was dropped since the last flush: events, new keys, and each bound met."""

    events: int = 0
    keys: int = 0
    #: ``{bound: first name dropped at it}``, the bound ``"MAX_BUFFERED_KEYS"`` or
    #: ``"MAX_CLIENT_KEYS"`` (or ``"redis"``: the Redis buffer's script said no).
    bounds: dict[str, str] = field(default_factory=dict)

    def message(self, limits: dict[str, int]) -> str:
        """One line for the log: the totals, each bound with its value, a name dropped."""
        met = "; ".join(
            f"{bound}={limits[bound]:,} met, e.g. {name!r:.80}"
            if bound in limits
            else f"{bound}, e.g. {name!r:.80}"
            for bound, name in self.bounds.items()
        )
        return (
            f"metrics buffer full: dropped {self.events:,} events in {self.keys:,} new "
            f"(series, minute) keys since the last flush ({met or 'no bound named'})"
        )


def notify(observers: list[Callable[..., None]], *args: Any) -> None:
    """Call each of ``observers`` with ``args``; one that raises is logged and removed (an
    exporter never fails a count or a flush)."""
    for fn in list(observers):
        try:
            fn(*args)
        except Exception:
            logger.exception("metrics: observer %r failed; removed", fn)
            observers.remove(fn)


@dataclass(frozen=True)
class Batch:
    """Counts sealed together, written in one transaction under ``flush_id``."""

    flush_id: str
    counts: CountsDict
    #: How many of ``counts``' keys have a client-chosen name.
    client_keys: int = 0
    #: When its first count was added (``time.monotonic()``).
    since: float = 0.0


class Aggregator:
    """This process's counts: the live dict, the queue of sealed batches, what was dropped."""

    def __init__(
        self, max_keys: int = MAX_BUFFERED_KEYS, max_client_keys: int = MAX_CLIENT_KEYS
    ) -> None:
        #: Keys (live and queued) past which a new key is dropped.
        self.max_keys = max_keys
        #: Keys with a client-chosen name (live and queued) past which a new one is dropped.
        self.max_client_keys = max_client_keys
        #: The first part of every flush id: unique to this aggregator, so to this process.
        self.process_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._counts: CountsDict = {}
        self._pending: deque[Batch] = deque()
        self._pending_keys = 0
        self._live_client_keys = 0
        self._pending_client_keys = 0
        self._sequence = 0
        self._dropped_events = 0
        self._dropped_keys = 0
        #: ``{bound: first name dropped}`` since the last flush (see :class:`Dropped`).
        self._dropped_at: dict[str, str] = {}
        #: The minute of the last new key: its keys share this one int.
        self._minute = 0
        #: When the first live count was added (meaningful while there are live counts).
        self._since = 0.0

    def add(self, name: str, minute: int, count: int, client_chosen: bool = False) -> None:
        """Add ``count`` to ``(name, minute)``, or drop it at a bound (see the module)."""
        key = (name, minute)
        with self._lock:
            counts = self._counts
            old = counts.get(key)
            if old is not None:
                counts[key] = old + count
                return
            # Client-chosen names meet their own bound first (their share of the buffer).
            share_full = client_chosen and (
                self._live_client_keys + self._pending_client_keys >= self.max_client_keys
            )
            if not share_full and len(counts) + self._pending_keys < self.max_keys:
                if not counts:
                    self._since = time.monotonic()
                if minute == self._minute:
                    key = (name, self._minute)  # one int per minute, not one per key
                else:
                    self._minute = minute
                counts[key] = count
                self._live_client_keys += client_chosen
                return
            self._dropped_events += count
            self._dropped_keys += 1
            bound = "MAX_CLIENT_KEYS" if share_full else "MAX_BUFFERED_KEYS"
            first = bound not in self._dropped_at
            if first:
                self._dropped_at[bound] = name
        if DROPS:
            notify(DROPS, count)
        if first:
            limit = self.max_client_keys if share_full else self.max_keys
            buffer_full.send(sender=None, name=name, count=count, max_keys=limit, bound=bound)

    def drop(self, count: int, name: str = "", bound: str = "") -> None:
        """Count ``count`` events that could not be buffered elsewhere as dropped; ``bound``
        (if any) names why, for the flush's log line."""
        with self._lock:
            self._dropped_events += count
            self._dropped_keys += 1
            if bound:
                self._dropped_at.setdefault(bound, name)
        if DROPS:
            notify(DROPS, count)

    def seal(self, blocking: bool = True) -> bool:
        """Queue the live counts as a new batch (if any). False if the lock was busy."""
        if not self._lock.acquire(blocking):
            return False
        try:
            counts, self._counts = self._counts, {}
            client_keys, self._live_client_keys = self._live_client_keys, 0
            if counts:
                self._sequence += 1
                flush_id = f"{self.process_id}:{self._sequence}"
                self._pending.append(Batch(flush_id, counts, client_keys, self._since))
                self._pending_keys += len(counts)
                self._pending_client_keys += client_keys
        finally:
            self._lock.release()
        return True

    def take_dropped(self) -> Dropped:
        """What was dropped since the last call; the next drop is signalled again."""
        with self._lock:
            if not self._dropped_keys:
                return Dropped()
            dropped = Dropped(self._dropped_events, self._dropped_keys, self._dropped_at)
            self._dropped_events = self._dropped_keys = 0
            self._dropped_at = {}
        return dropped

    def limits(self) -> dict[str, int]:
        """The bounds by name, as :meth:`Dropped.message` names them."""
        return {"MAX_BUFFERED_KEYS": self.max_keys, "MAX_CLIENT_KEYS": self.max_client_keys}

    def oldest(self) -> Batch | None:
        """The batch to write next, or None when the queue is empty."""
        return self._pending[0] if self._pending else None

    def written(self, batch: Batch) -> None:
        """Take ``batch``, the oldest, off the queue: it is in the database."""
        self._pending.popleft()
        with self._lock:
            self._pending_keys -= len(batch.counts)
            self._pending_client_keys -= batch.client_keys

    @property
    def pending_keys(self) -> int:
        """Keys in the queued batches (what a failed flush still holds)."""
        return self._pending_keys

    def lag(self) -> float:
        """Seconds since the oldest count not yet written was added (0.0: none is)."""
        with self._lock:
            if self._pending:
                since = self._pending[0].since
            elif self._counts:
                since = self._since
            else:
                return 0.0
        return max(0.0, time.monotonic() - since)

    def live_counts(self) -> CountsDict:
        """A copy of the counts not yet sealed into a batch."""
        with self._lock:
            return dict(self._counts)

    def stats(self) -> dict[str, int]:
        """Buffered keys (client-chosen ones apart too), queued batches and events dropped
        since the last flush."""
        with self._lock:
            return {
                "buffered_keys": len(self._counts) + self._pending_keys,
                "client_keys": self._live_client_keys + self._pending_client_keys,
                "pending_batches": len(self._pending),
                "dropped_events": self._dropped_events,
            }
