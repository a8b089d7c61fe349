"""Which bucket counters a hit writes and a check reads: pure logic, no I/O.

A rate of N per W seconds is a sliding window over bucket counters. Two layouts:

* **Uniform** (the default): each window is cut into ``G`` buckets of ``W/G`` seconds
  (``RATELIMIT_BUCKETS_PER_WINDOW``, 60). A hit increments the current bucket; a check sums the
  ``G + 1`` buckets that touch ``[t - W, t]``. The oldest bucket is counted in full although
  part of it is older than the window, so the limiter is **never lenient** (no window of length
  W ever admits more than N) and blocks early by at most one bucket, ``W/G``.
* **Hierarchical** (``RATELIMIT_HIERARCHICAL``): the seeds' second / minute / hour counters. A
  hit increments one bucket of each level; a check covers ``[T - W, T]`` (whole seconds) with
  the fewest buckets, adding a coarse bucket and subtracting the fine buckets outside the
  window where that is cheaper. A one-day window is exact to one second in at most 150 reads.

Bucket keys are suffixes; the backend prefixes them with the subject's namespace. Plans depend
only on the rates and the clock, so they are memoised and shared by every subject.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ratelimit_app.rates import Rate

#: Levels of the hierarchical layout, coarsest first; each divides the previous one.
LEVELS = (3600, 60, 1)
#: Longest window the hierarchical layout serves; longer ones use the uniform layout.
HIERARCHICAL_MAX = 86400
#: Seconds a counter outlives the last check that reads it (memcached's clock ticks in
#: whole seconds).
TTL_FUDGE = 2

Term = tuple[int, int]  # (index into Plan.reads, +1 or -1)


@dataclass(frozen=True, slots=True)
class Segment:
    """Events in ``[start, end)`` whose count is the signed sum of ``terms``."""

    end: float
    terms: tuple[Term, ...]


@dataclass(frozen=True, slots=True)
class RatePlan:
    """How to count one rate from the values read: a run of uniform buckets or segments."""

    rate: Rate
    start: int = 0  # uniform: Plan.reads[start:stop] are the buckets, oldest first
    stop: int = 0
    first_end: float = 0.0  # uniform: end time of the oldest bucket
    width: float = 0.0  # uniform: bucket width in seconds
    segments: tuple[Segment, ...] = ()  # hierarchical: oldest first


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything one check of one subject does, in one backend round trip."""

    writes: tuple[tuple[str, int], ...]  # (key suffix, TTL seconds)
    reads: tuple[str, ...]  # distinct key suffixes
    rates: tuple[RatePlan, ...]


@dataclass(frozen=True, slots=True)
class Usage:
    """The state of one rate after a check."""

    rate: Rate
    count: int  # events in the window, this one included when it was counted
    remaining: int  # how many more the window admits now
    limited: bool  # counted: count > limit; a look: count >= limit (no room for one more)
    retry_after: float  # seconds until one more event would be admitted (0 if now)
    reset: float  # seconds until every counted event has left the window


def plan(
    rates: tuple[Rate, ...], t: float, per_window: int = 60, hierarchical: bool = False
) -> Plan:
    """The plan for checking ``rates`` at time ``t``."""
    if hierarchical:
        return _hierarchical_plan(rates, math.floor(t), per_window)
    indexes = tuple(int(t * per_window // r.seconds) for r in rates)
    return _uniform_plan(rates, indexes, per_window)


@lru_cache(maxsize=512)
def _uniform_plan(rates: tuple[Rate, ...], indexes: tuple[int, ...], g: int) -> Plan:
    reads: list[str] = []
    writes: list[tuple[str, int]] = []
    runs: dict[int, tuple[int, int]] = {}
    rate_plans = []
    for rate, k in zip(rates, indexes, strict=True):
        w = rate.seconds
        width = w / g
        if w not in runs:
            start = len(reads)
            level = f":{w}/{g}:"
            reads.extend(f"{level}{i}" for i in range(k - g, k + 1))
            runs[w] = (start, len(reads))
            writes.append((f"{level}{k}", math.ceil(w + width) + TTL_FUDGE))
        start, stop = runs[w]
        first_end = (k - g + 1) * width + w
        rate_plans.append(RatePlan(rate, start, stop, first_end, width))
    return Plan(tuple(writes), tuple(reads), tuple(rate_plans))


# -- hierarchical layout --------------------------------------------------------------------

RawTerm = tuple[int, int, int]  # (level seconds, bucket index, sign)
RawSegment = tuple[int, int, tuple[RawTerm, ...]]  # (start, end, terms)


def _size(segments: list[RawSegment]) -> int:
    return sum(len(s[2]) for s in segments)


def _negated(segments: list[RawSegment]) -> tuple[RawTerm, ...]:
    return tuple((lv, k, -sign) for _, _, terms in segments for lv, k, sign in terms)


def _with_coarse(
    lo: int, hi: int, size: int, c: int, finer: tuple[int, ...], now: int
) -> RawSegment:
    """``[lo, hi)`` as the coarse bucket ``[c, c + size)`` minus what lies outside it.

    What lies at or after ``now`` has not happened yet, so it is not read: a client whose
    clock runs ahead could have written there, and counting that is the safe direction.
    """
    outside = _cover(c, lo, finer, now) + _cover(hi, min(c + size, now), finer, now)
    return (lo, hi, ((size, c // size, 1), *_negated(outside)))


def _part(lo: int, hi: int, levels: tuple[int, ...], now: int) -> list[RawSegment]:
    """Cheapest exact cover of ``[lo, hi)``, which lies inside one bucket of ``levels[0]``."""
    if lo >= hi:
        return []
    size, finer = levels[0], levels[1:]
    c = lo // size * size
    if hi - lo == size:
        return [(lo, hi, ((size, c // size, 1),))]
    inner = _cover(lo, hi, finer, now)
    alternative = _with_coarse(lo, hi, size, c, finer, now)
    return inner if _size(inner) <= len(alternative[2]) else [alternative]


def _cover(lo: int, hi: int, levels: tuple[int, ...], now: int) -> list[RawSegment]:
    """Exact signed cover of the whole seconds ``[lo, hi)``, oldest first."""
    if lo >= hi:
        return []
    size = levels[0]
    if len(levels) == 1:
        return [(k * size, (k + 1) * size, ((size, k, 1),)) for k in range(lo // size, hi // size)]
    a = -(-lo // size) * size  # first boundary at or after lo
    b = hi // size * size  # last boundary at or before hi
    if a > b:  # inside one bucket
        return _part(lo, hi, levels, now)
    middle = [(k * size, (k + 1) * size, ((size, k, 1),)) for k in range(a // size, b // size)]
    return _part(lo, a, levels, now) + middle + _part(b, hi, levels, now)


@lru_cache(maxsize=128)
def _hierarchical_plan(rates: tuple[Rate, ...], now: int, per_window: int) -> Plan:
    longest = max((r.seconds for r in rates if r.seconds <= HIERARCHICAL_MAX), default=0)
    reads: dict[str, int] = {}
    rate_plans: list[RatePlan] = []
    uniform = tuple(r for r in rates if r.seconds > HIERARCHICAL_MAX)
    for rate in rates:
        if rate.seconds > HIERARCHICAL_MAX:
            continue
        segments = []
        for start, end, terms in _cover(now - rate.seconds, now + 1, LEVELS, now + 1):
            del start
            indexed = tuple(
                (reads.setdefault(f":h{lv}:{k}", len(reads)), sign) for lv, k, sign in terms
            )
            segments.append(Segment(end + rate.seconds, indexed))
        rate_plans.append(RatePlan(rate, segments=tuple(segments)))
    writes: list[tuple[str, int]] = []
    if longest:
        # A fine bucket is read (subtracted) up to one coarser bucket past the window.
        coarser = {3600: 0, 60: 3600, 1: 60}
        writes = [(f":h{lv}:{now // lv}", longest + lv + coarser[lv] + TTL_FUDGE) for lv in LEVELS]
    read_list = tuple(reads)
    if uniform:
        extra = plan(uniform, now, per_window)
        offset = len(read_list)
        read_list += extra.reads
        writes += extra.writes
        for rp in extra.rates:
            rate_plans.append(
                RatePlan(rp.rate, rp.start + offset, rp.stop + offset, rp.first_end, rp.width)
            )
    order = {r: i for i, r in enumerate(rates)}
    rate_plans.sort(key=lambda rp: order[rp.rate])
    return Plan(tuple(writes), read_list, tuple(rate_plans))


def stored_suffixes(rates: tuple[Rate, ...], t: float, per_window: int = 60) -> set[str]:
    """Every bucket, in either layout, that can hold a hit from before ``t`` and still be read.

    Forgetting a subject (a reset) deletes these; for a one-day hierarchical window that is
    about 88,000 second buckets, which is fine for an operation a person starts.
    """
    now = math.floor(t)
    found = set(plan(rates, t, per_window).reads)
    longest = max((r.seconds for r in rates if r.seconds <= HIERARCHICAL_MAX), default=0)
    if longest:
        found.update(plan(rates, t, per_window, hierarchical=True).reads)
        for lv, span in ((1, longest + 61), (60, longest + 3661), (3600, longest + 3601)):
            found.update(f":h{lv}:{k}" for k in range((now - span) // lv, now // lv + 1))
    return found


# -- evaluation -----------------------------------------------------------------------------


def _parts(rp: RatePlan, values: list[int]) -> list[tuple[float, int]]:
    """(time the events leave the window, how many), oldest first."""
    if rp.segments:
        # A segment's true count is never negative; a reset or an evicted coarse bucket can
        # make coarse - fine negative, and counting that would be lenient.
        return [
            (seg.end, max(0, sum(values[i] * sign for i, sign in seg.terms)))
            for seg in rp.segments
        ]
    return [
        (rp.first_end + n * rp.width, values[i]) for n, i in enumerate(range(rp.start, rp.stop))
    ]


def count(rp: RatePlan, values: list[int]) -> int:
    """Events in the rate's window."""
    if rp.segments:
        return sum(c for _, c in _parts(rp, values))
    return sum(values[rp.start : rp.stop])


def _newest_end(rp: RatePlan, values: list[int]) -> float:
    """When the newest counted events leave the window (0 if there are none)."""
    if rp.segments:
        for seg in reversed(rp.segments):
            if sum(values[i] * sign for i, sign in seg.terms) > 0:
                return seg.end
        return 0.0
    for n in range(rp.stop - rp.start - 1, -1, -1):
        if values[rp.start + n] > 0:
            return rp.first_end + n * rp.width
    return 0.0


def evaluate(p: Plan, values: list[int], t: float, counted: bool = False) -> list[Usage]:
    """Usage of every rate of ``p`` from ``values`` (aligned with ``p.reads``) at time ``t``.

    ``counted``: ``values`` include this hit, which is refused when a count is over its limit
    and then taken back, so the times to wait are computed without it. Otherwise (a look that
    counts nothing) a rate is limited when it has no room left for one more hit.
    """
    ns = [count(rp, values) for rp in p.rates]
    refused = counted and any(n > rp.rate.count for n, rp in zip(ns, p.rates, strict=True))
    slack = 0 if counted else 1
    result = []
    for rp, n in zip(p.rates, ns, strict=True):
        limit = rp.rate.count
        retry_after = reset = 0.0
        left = n - 1 if refused else n
        if 0 < left < limit:
            # The common case, kept cheap: nothing to wait for, and the window is empty
            # once its newest events have left it.
            reset = max(0.0, _newest_end(rp, values) - t)
        elif left > 0 or (n and limit == 0):
            for leaves_at, c in _parts(rp, values):
                if c <= 0:
                    continue
                if left >= limit and left - c < limit:
                    retry_after = max(0.0, leaves_at - t)
                left -= c
                if left <= 0:
                    reset = max(0.0, leaves_at - t)
                    break
            if limit == 0:
                retry_after = reset
        elif limit == 0:  # never admits: wait a whole window, and then again
            retry_after = float(rp.rate.seconds)
        limited = n + slack > limit
        result.append(Usage(rp.rate, n, max(0, limit - n), limited, retry_after, reset))
    return result
