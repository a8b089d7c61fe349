"""The most frequent keys of a stream in bounded memory, with counts that never overstate.

A :class:`SpaceSaving` of capacity ``k`` holds at most ``k`` keys, each with two numbers:
``count``, the events counted while the key was held, and ``error``, a bound on its events
before that. So a key's true count lies in ``[count, count + error]``: ``count`` is what a
page may show as certain. Its ``weight``, ``count + error``, is never below the true count;
when a new key finds the sketch full, it takes the place of the held key of least weight
(among equals, the one left unchanged longest).

Plain space-saving (Metwally, Agrawal and El Abbadi, 2005) gives the new key the evicted
weight as its error. A flood of keys seen once each then climbs in weight, one step per
``k`` newcomers, until it pushes out a key seen twenty times, and shows its inherited
weight as a count. Here the error is the smaller of two upper bounds of the key's earlier
events: the largest weight evicted so far (space-saving's), and what a :class:`Doorkeeper`
(a count-min sketch of the evicted keys' counts) remembers of the key. A key never seen
before enters at weight 1 (bar a collision in the doorkeeper), so a flood of one-off keys
only takes the places of one-off keys; a key seen before enters above them.

What holds for any stream (``tests/metrics/test_topk.py`` checks it):

* ``count <= true count <= count + error``: a key that came back after an eviction is
  counted from its return, its earlier events are only bounded;
* a held key is evicted only when no held key weighs less: a key counted ``c`` times is lost
  only while every other held key may have been seen ``c`` times or more;
* the weights add up to at most the ``n`` events, so, as in space-saving, a key seen more
  than ``n / k`` times is held. (With ``F`` the largest weight evicted and ``T`` the counts
  evicted, ``T - sum(error) - sum(max(0, F - weight))`` over the held keys starts at 0 and
  no step lowers it; the held counts and ``T`` add up to ``n``.)

The doorkeeper can only over-count (keys share its cells), which raises a newcomer's weight
at most to space-saving's: a flood of far more keys than its cells tends to plain
space-saving.

:class:`Sketches` keeps one sketch per name, at most :data:`MAX_SKETCHES` of them, and hands
them over whole (:meth:`Sketches.take`) for a flush. Pure: no I/O, no Django, no clock.
"""

from __future__ import annotations

import heapq
import operator
import random
import struct
import threading
from dataclasses import dataclass, field
from itertools import repeat

#: Keys each sketch holds: the subjects a page can show per name and flush.
CAPACITY = 100
#: Sketches a process keeps between flushes; a new name beyond them is dropped.
MAX_SKETCHES = 200
#: Cells per row of a doorkeeper (a power of two), and its rows: 16 KiB, made only for a
#: sketch that had to evict. Collisions stay rare up to a few thousand evictions a flush.
DOORKEEPER_WIDTH, DOORKEEPER_ROWS = 4096, 4

_MASK = 2**64 - 1
#: A 64-bit hash as four 16-bit chunks (a doorkeeper's rows' cells), and what a row's cell
#: is read, set and masked with, called from ``map``.
_CHUNKS = struct.Struct("<4H")
_CELL, _SET_CELL, _AND = bytearray.__getitem__, bytearray.__setitem__, operator.and_
#: A doorkeeper cell this full says "unknown": it is not counted higher.
_FULL = 255


class Doorkeeper:
    """Upper bounds of how often keys were seen, in ``rows * width`` bytes whatever the keys:
    a count-min sketch with conservative update. A key's estimate is the least of its cells,
    one per row; an addition raises its cells only as far as its estimate needs, so it is
    never below the key's true additions and sharing cells can only raise it.

    A flood of one-off subjects evicts a key from a full sketch on every refusal, and each
    eviction asks the doorkeeper twice: a key's cells are found and read in C (its hash cut
    into 16-bit chunks, one a row, by :mod:`struct`; ``map`` over the rows), with no Python
    loop per row."""

    def __init__(
        self, width: int = DOORKEEPER_WIDTH, rows: int = DOORKEEPER_ROWS, seed: int | None = None
    ) -> None:
        bits = width.bit_length() - 1
        if width < 1 or width != 1 << bits or bits > 16 or not 1 <= rows <= 4:
            raise ValueError(
                f"width must be a power of two up to 65536 and rows 1 to 4: {width}, {rows}"
            )
        self._rows = [bytearray(width) for _ in range(rows)]
        self._masks = [width - 1] * rows
        # Each row takes its own 16 bits of Python's hash (keyed per process) times a random
        # odd factor: which keys share cells differs from one doorkeeper to the next.
        self._factor = random.Random(seed).getrandbits(64) | 1

    def _slots(self, key: str) -> list[int]:
        """``key``'s cell in each row."""
        x = ((hash(key) & _MASK) * self._factor) & _MASK
        return list(map(_AND, _CHUNKS.unpack(x.to_bytes(8, "little")), self._masks))

    def estimate(self, key: str) -> int | None:
        """At least how often ``key`` was added, or None when its cells are too full to say."""
        least = min(map(_CELL, self._rows, self._slots(key)))
        return None if least >= _FULL else least

    def add(self, key: str, count: int) -> None:
        """Add ``count`` sightings of ``key``."""
        rows, slots = self._rows, self._slots(key)
        cells = list(map(_CELL, rows, slots))
        target = min(_FULL, min(cells) + count)
        # Each cell raised to ``target`` where it is lower (conservative update), in C.
        list(map(_SET_CELL, rows, slots, map(max, cells, repeat(target))))


@dataclass(slots=True)
class Entry:
    """A key's ``count`` while held (a lower bound of its true count), ``error`` (its
    possible events before; see the module docstring), when the sketch first and last saw
    it, and the caller's ``label`` and ``ref`` (what it shows, what it acts on)."""

    count: int
    error: int
    first: float
    last: float
    label: str = ""
    ref: str = ""

    @property
    def weight(self) -> int:
        """The most events the key may have had: never below its true count."""
        return self.count + self.error


@dataclass(slots=True)
class SpaceSaving:
    """At most ``capacity`` keys with their counts (see the module docstring)."""

    capacity: int = CAPACITY
    entries: dict[str, Entry] = field(default_factory=dict)
    #: The largest weight evicted so far: no key that is not held was seen more often.
    evicted: int = 0
    #: The evicted keys' counts; made at the first eviction (a sketch that never fills, the
    #: usual one, has none).
    doorkeeper: Doorkeeper | None = None
    #: Its cells per row (tests make it tiny, to make every key share them).
    doorkeeper_width: int = DOORKEEPER_WIDTH
    #: ``(weight when pushed, order, key)``, one per held key; a weight that grew since is
    #: pushed again when it surfaces, so the top is the lightest key once fresh.
    _heap: list[tuple[int, int, str]] = field(default_factory=list)
    _order: int = 0

    def add(self, key: str, t: float, label: str = "", ref: str = "", count: int = 1) -> None:
        """Count ``count`` events of ``key`` at ``t``."""
        entry = self.entries.get(key)
        if entry is not None:
            entry.count += count
            entry.last = max(entry.last, t)
            return
        error = self._evict(key) if len(self.entries) >= self.capacity else 0
        self.entries[key] = Entry(count, error, t, t, label, ref)
        self._push(count + error, key)

    def _push(self, weight: int, key: str) -> None:
        self._order += 1
        heapq.heappush(self._heap, (weight, self._order, key))

    def _evict(self, newcomer: str) -> int:
        """Forget the lightest key, its count kept by the doorkeeper; the most events
        ``newcomer`` may have had before."""
        while True:
            weight, _, key = heapq.heappop(self._heap)
            entry = self.entries[key]
            if entry.weight == weight:
                break
            self._push(entry.weight, key)
        del self.entries[key]
        self.evicted = max(self.evicted, weight)
        if self.doorkeeper is None:
            self.doorkeeper = Doorkeeper(self.doorkeeper_width)
        # Its events before this stay are in the doorkeeper already (added at its last
        # eviction): add those of this stay.
        self.doorkeeper.add(key, entry.count)
        known = self.doorkeeper.estimate(newcomer)
        return self.evicted if known is None else min(known, self.evicted)

    def top(self, n: int | None = None) -> list[tuple[str, Entry]]:
        """The keys held, most surely counted first (by ``count``, then ``weight``)."""
        ranked = sorted(self.entries.items(), key=lambda item: (-item[1].count, -item[1].weight))
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
