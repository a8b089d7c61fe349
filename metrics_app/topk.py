"""The most frequent keys of a stream in bounded memory: the space-saving sketch.

A :class:`SpaceSaving` of capacity ``k`` holds at most ``k`` keys. A key it holds is counted;
a new key, once it is full, takes the place of the least counted one and starts from that
count (its ``error``: how much of the count may be another key's). So a key seen more than
``n / k`` times in ``n`` events is always held, a count is never below the key's true count
and at most ``error`` above it, and a flood of distinct keys (a botnet's addresses) costs
``k`` entries whatever its size (Metwally, Agrawal and El Abbadi, 2005).

:class:`Sketches` keeps one sketch per name, at most :data:`MAX_SKETCHES` of them, and hands
them over whole (:meth:`Sketches.take`) for a flush. Pure: no I/O, no Django, no clock.
"""

from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass, field

#: Keys each sketch holds: the subjects a page can show per name and flush.
CAPACITY = 100
#: Sketches a process keeps between flushes; a new name beyond them is dropped.
MAX_SKETCHES = 200


@dataclass(slots=True)
class Entry:
    """A key's count (at most ``error`` over its true count), when the sketch first and last
    saw it, and the caller's ``label`` and ``ref`` (what it shows, what it acts on)."""

    count: int
    error: int
    first: float
    last: float
    label: str = ""
    ref: str = ""


@dataclass(slots=True)
class SpaceSaving:
    """At most ``capacity`` keys with their counts (see the module docstring)."""

    capacity: int = CAPACITY
    entries: dict[str, Entry] = field(default_factory=dict)
    #: ``(count when pushed, order, key)``, one per held key; a count that grew since is
    #: pushed again when it surfaces, so the top is the least counted key once fresh.
    _heap: list[tuple[int, int, str]] = field(default_factory=list)
    _order: int = 0

    def add(self, key: str, t: float, label: str = "", ref: str = "", count: int = 1) -> None:
        """Count ``count`` events of ``key`` at ``t``."""
        entry = self.entries.get(key)
        if entry is not None:
            entry.count += count
            entry.last = max(entry.last, t)
            return
        floor = 0
        if len(self.entries) >= self.capacity:
            floor = self._evict()
        self.entries[key] = Entry(floor + count, floor, t, t, label, ref)
        self._push(floor + count, key)

    def _push(self, count: int, key: str) -> None:
        self._order += 1
        heapq.heappush(self._heap, (count, self._order, key))

    def _evict(self) -> int:
        """Forget the least counted key; its count."""
        while True:
            count, _, key = heapq.heappop(self._heap)
            current = self.entries[key].count
            if current == count:
                del self.entries[key]
                return count
            self._push(current, key)

    def top(self, n: int | None = None) -> list[tuple[str, Entry]]:
        """The keys held, most counted first."""
        ranked = sorted(self.entries.items(), key=lambda item: -item[1].count)
        return ranked if n is None else ranked[:n]


class Sketches:
    """A sketch per name, thread-safe; what a process gathers between two flushes."""

    def __init__(self, capacity: int = CAPACITY, max_sketches: int = MAX_SKETCHES) -> None:
        self.capacity = capacity
        self.max_sketches = max_sketches
        self._lock = threading.Lock()
        self._sketches: dict[str, SpaceSaving] = {}
        #: Seconds the rows of each name are kept, as the last ``add`` said.
        self._keep: dict[str, float] = {}
        #: Events dropped because no sketch was left for their name.
        self.dropped = 0

    def add(
        self, name: str, key: str, t: float, label: str = "", ref: str = "", keep: float = 0
    ) -> None:
        """Count one event of ``key`` under ``name`` at ``t``; its rows are kept ``keep``
        seconds once stored."""
        with self._lock:
            sketch = self._sketches.get(name)
            if sketch is None:
                if len(self._sketches) >= self.max_sketches:
                    self.dropped += 1
                    return
                sketch = self._sketches[name] = SpaceSaving(self.capacity)
            self._keep[name] = keep
            sketch.add(key, t, label, ref)

    def take(self) -> dict[str, tuple[float, SpaceSaving]]:
        """Every sketch with its ``keep``, emptied here: the flush owns them now."""
        with self._lock:
            taken = {name: (self._keep[name], s) for name, s in self._sketches.items()}
            self._sketches, self._keep = {}, {}
        return taken

    def size(self) -> int:
        """Entries held, over every sketch (what the memory bound counts)."""
        with self._lock:
            return sum(len(s.entries) for s in self._sketches.values())
