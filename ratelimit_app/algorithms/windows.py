"""Which bucket counters a hit writes and a check reads: pure logic, no I/O.

A rate of N per W seconds is a sliding window over bucket counters, in one of two layouts.

* **Uniform** (the default): the window is cut into ``G`` fine buckets of ``W/G`` seconds
  (:data:`BUCKETS_PER_WINDOW`, 60), grouped ``C`` at a time into coarse buckets (``C``
  is the largest divisor of ``G`` with ``C * C <= 2G``: 10 for 60). A hit increments its fine
  and its coarse bucket; a check covers the fine buckets ``[k - G, k]`` exactly, with whole
  coarse buckets where it can, and at the old edge either the fine buckets inside the window
  or a coarse bucket minus the fine ones outside it, whichever is fewer: at most 13 reads
  for G = 60 instead of 61. The oldest fine bucket is counted in full although part of it
  is older than the window, so the limiter is **never lenient** (no window of length W ever
  admits more than N) and blocks early by at most one fine bucket, ``W/G``.
* **Hierarchical** (:data:`HIERARCHICAL`): counters per second, per minute and per
  hour, shared by every rate of a check: a hit increments one bucket of each level, and a
  check covers ``[T - W, T]`` (whole seconds) the same way. A one-day window is exact to one
  second in at most 84 reads (summing a day's seconds, minutes and hours naively reads 142:
  59 + 59 + 24).

Both also read a little past "now" (:func:`lookahead`): the rest of the current coarse
bucket and the next one (the next minute, hierarchical). A check reads the clock before its
round trip, so a hit with a later clock can reach the server first; reading ahead, of any two
hits less than the lookahead apart at least one sees the other, in whichever order the server
runs them. What lies after "now" has not happened by this clock, so counting it can only
refuse (a client whose clock runs ahead makes counts higher, the safe direction).

Bucket keys are suffixes; the backend prefixes them with the subject's namespace. Plans depend
only on the rates and the clock, so they are memoised and shared by every subject.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any, NamedTuple

from ratelimit_app.algorithms import calendar
from ratelimit_app.algorithms.calendar import Quota
from ratelimit_app.algorithms.rates import Rate

#: ``G``, the fine buckets a window is cut into in the uniform layout: more buckets, tighter
#: limits (a check blocks early by at most ``W/G``) but more reads per check and more counters
#: in the cache. Bucket keys name it, so changing it starts every count from zero.
BUCKETS_PER_WINDOW = 60
#: Whether windows of up to a day use the hierarchical layout instead (more counters per
#: hit, exact to one second). Bucket keys differ, so changing it starts every count from zero.
HIERARCHICAL = False
#: Levels of the hierarchical layout, coarsest first; each divides the previous one.
LEVELS = (3600, 60, 1)
#: Longest window the hierarchical layout serves; longer ones use the uniform layout.
HIERARCHICAL_MAX = 86400
#: Seconds a counter outlives the last check that reads it (memcached's clock ticks in
#: whole seconds).
TTL_FUDGE = 2
#: The most whole seconds past the current one that a hierarchical check also reads
#: (:func:`lookahead`).
HIERARCHICAL_LOOKAHEAD = 60


def _seconds_ahead(window: int) -> int:
    """Whole seconds past the current one that a hierarchical check of ``window`` reads:
    a sixth of the window as in the uniform layout, at least one second and at most a minute
    (reading ahead into the current minute is what costs reads; one more minute is one)."""
    return max(1, min(HIERARCHICAL_LOOKAHEAD, window // 6))


Term = tuple[int, int]  # (index into Plan.reads, +1 or -1)


@dataclass(frozen=True, slots=True)
class Segment:
    """Events in ``[start, end)`` whose count is the signed sum of ``terms``."""

    end: float
    terms: tuple[Term, ...]


@dataclass(frozen=True, slots=True)
class RatePlan:
    """How to count one rate from the values read: its segments, oldest first."""

    rate: Rate
    segments: tuple[Segment, ...]
    #: Derived once (plans are memoised), for :func:`evaluate`: each segment's first read,
    #: and the segments that are more than that one read, as (position, terms).
    first: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)
    #: Each segment's end.
    ends: tuple[float, ...] = dataclasses.field(init=False, repr=False, compare=False)
    multi: tuple[tuple[int, tuple[Term, ...]], ...] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    #: The values of :attr:`first` picked from a check's values in one call, in C.
    pick: Callable[[Sequence[int]], Sequence[int]] = dataclasses.field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        first = tuple(seg.terms[0][0] for seg in self.segments)
        object.__setattr__(self, "first", first)
        object.__setattr__(self, "pick", picker(first))
        object.__setattr__(self, "ends", tuple(seg.end for seg in self.segments))
        multi = tuple(
            (k, seg.terms)
            for k, seg in enumerate(self.segments)
            if seg.terms[0][1] != 1 or len(seg.terms) != 1
        )
        object.__setattr__(self, "multi", multi)


_tuple = tuple.__new__


def picker(indexes: Sequence[int]) -> Callable[[Sequence[int]], Sequence[int]]:
    """A function that picks the values at ``indexes`` out of a sequence, in C (no Python
    call per value): ``operator.itemgetter``, whose answer is a sequence for any number of
    indexes (for one index, itemgetter gives the value itself: a slice of one gives a list)."""
    if len(indexes) > 1:
        return operator.itemgetter(*indexes)
    i = indexes[0] if indexes else 0
    found: Any = operator.itemgetter(slice(i, i + len(indexes)))
    return found


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """Everything one check of one subject does, in one backend round trip.

    Plans are compiled once and shared (the engine keeps them in the runtime): one is
    compared and hashed by identity, so a backend keys what it derives from one (its
    encoding, a command) at the cost of a pointer."""

    writes: tuple[tuple[str, int], ...]  # (key suffix, TTL seconds)
    reads: tuple[str, ...]  # distinct key suffixes
    rates: tuple[RatePlan, ...]


class Usage(NamedTuple):
    """The state of one rate after a check (made on every check: a named tuple, made with
    ``tuple.__new__`` where it counts, cheaper than any class's ``__init__``)."""

    rate: Rate
    count: int  # type: ignore[assignment]  # events in the window (this hit, when counted)
    remaining: int  # how many more the window admits now
    limited: bool  # counted: count > limit; a look: count >= limit (no room for one more)
    retry_after: float  # seconds until one more event would be admitted (0 if now)
    reset: float  # seconds until every counted event has left the window


def plan(
    rates: tuple[Rate, ...],
    t: float,
    per_window: int = 60,
    hierarchical: bool = False,
    fine_only: bool = False,
) -> Plan:
    """The plan for checking ``rates`` at time ``t``.

    ``fine_only``: read every fine bucket of the uniform layout and write nothing. A check
    reads coarse buckets in the middle of a window, which tells how many hits it holds but
    not when each leaves it; when a hit is refused, this plan times the wait exactly.
    """
    if hierarchical:
        return hierarchical_plan(rates, math.floor(t), per_window)
    return uniform_plan(rates, indexes(rates, t, per_window), per_window, fine_only)


def indexes(rates: tuple[Rate, ...], t: float, per_window: int = 60) -> tuple[int, ...]:
    """The index of each rate's fine bucket at time ``t``: a uniform plan depends on ``t``
    through these alone."""
    if len(rates) == 1 and type(rates[0]) is not Quota:
        return (int(t * per_window // rates[0].seconds),)
    return tuple(
        [
            calendar.index(r, t) if type(r) is Quota else int(t * per_window // r.seconds)
            for r in rates
        ]
    )


def fine_bucket(seconds: int, t: float, per_window: int = 60) -> tuple[float, float]:
    """The times ``[since, until)`` whose fine bucket of a rate of ``seconds`` is the one of
    ``t`` (:func:`indexes`: ``int(t * per_window // seconds)``), as that computes it, to
    the float: a plan made at ``t`` is the plan of every time in it."""
    index = int(t * per_window // seconds)
    since = index * seconds / per_window
    while int(since * per_window // seconds) >= index:  # (rounding: the first time of it)
        since = math.nextafter(since, -math.inf)
    while int(since * per_window // seconds) < index:
        since = math.nextafter(since, math.inf)
    until = (index + 1) * seconds / per_window
    while int(until * per_window // seconds) > index:  # (the first time of the next)
        until = math.nextafter(until, -math.inf)
    while int(until * per_window // seconds) <= index:
        until = math.nextafter(until, math.inf)
    return since, until


def lookahead(rates: tuple[Rate, ...], per_window: int = 60, hierarchical: bool = False) -> float:
    """Seconds past its own clock reading that a check of ``rates`` also reads.

    A check reads the clock, then makes its round trip, so two concurrent hits can reach the
    server in the other order than their clocks: Y (later clock) writes and reads, then X
    (earlier clock) writes and reads. Y's read could not see X's write, so X's read must see
    Y's: every check also reads the buckets just after "now". Of two hits whose clocks are
    less than this apart, at least one sees the other, whatever order the server sees them
    in. (In the uniform layout that is one coarse bucket, ``W / 6`` for the default 60
    buckets per window; in the hierarchical layout, a minute.)
    """
    c = coarse_factor(per_window)
    return min(
        (
            float(_seconds_ahead(r.seconds))
            if hierarchical and r.seconds <= HIERARCHICAL_MAX
            else c * r.seconds / per_window
            for r in rates
            if type(r) is not Quota  # (a period's one counter is read whole: nothing ahead)
        ),
        default=0.0,
    )


def coarse_factor(per_window: int) -> int:
    """Fine buckets per coarse bucket in the uniform layout (1: a single level): the
    largest divisor ``d`` of ``per_window`` with ``d * d <= 2 * per_window``, found from
    the top (a refused check asks; for 60, the first tried)."""
    d = math.isqrt(2 * per_window)
    while per_window % d:
        d -= 1
    return d


class _Builder:
    """Collects a plan's distinct reads and writes while its rates are planned."""

    def __init__(self) -> None:
        self.reads: dict[str, int] = {}
        self.writes: dict[str, int] = {}
        self.rates: list[RatePlan] = []

    def segments(
        self,
        raw: list[RawSegment],
        token: Callable[[int, int], str],
        to_seconds: float,
        w: int,
        now: int,
    ) -> tuple[Segment, ...]:
        """``raw`` as segments whose reads are numbered in this plan.

        ``now`` is the end of the current bucket: the hits of a segment that spans it have
        happened by then, so they leave the window by ``now + w`` (a segment wholly after it,
        the lookahead's, keeps its own end).
        """
        return tuple(
            Segment(
                (end if start >= now else min(end, now)) * to_seconds + w,
                tuple(
                    (self.reads.setdefault(token(size, k), len(self.reads)), sign)
                    for size, k, sign in terms
                ),
            )
            for start, end, terms in raw
        )

    def quota(self, rate: Quota, k: int, fine_only: bool = False) -> None:
        """A calendar quota (:mod:`~ratelimit_app.algorithms.calendar`): one counter for its
        period ``k``, read whole; its hits all leave when the period ends."""
        start, end = calendar.bounds(rate, k)
        token = quota_suffix(rate, k)
        read = self.reads.setdefault(token, len(self.reads))
        self.rates.append(RatePlan(rate, (Segment(end, ((read, 1),)),)))
        if not fine_only:
            # Written at any instant of the period, it lives past the period's end.
            self.writes[token] = math.ceil(end - start) + TTL_FUDGE

    def uniform(self, rate: Rate, k: int, g: int, fine_only: bool = False) -> None:
        if type(rate) is Quota:
            self.quota(rate, k, fine_only)
            return
        w, c = rate.seconds, coarse_factor(g)
        width = w / g

        def token(size: int, index: int) -> str:
            return f":{w}/{g}:{index}" if size == 1 else f":{w}/{g}x{size}:{index}"

        if fine_only:  # times a refusal's wait: what has happened, fine bucket by fine bucket
            raw = _cover(k - g, k + 1, (1,), k + 1)
        else:  # the window, and the next ``c`` fine buckets (see :func:`lookahead`)
            raw = _cover(k - g, k + 1 + c, (c, 1) if c > 1 else (1,), k + 1 + c)
        self.rates.append(RatePlan(rate, self.segments(raw, token, width, w, k + 1)))
        # A fine bucket is read (subtracted) up to one coarse bucket past the window.
        self.writes[token(1, k)] = math.ceil(w + (c + 1) * width) + TTL_FUDGE
        if c > 1:
            self.writes[token(c, k // c)] = math.ceil(w + c * width) + TTL_FUDGE

    def build(self, order: tuple[Rate, ...]) -> Plan:
        rank = {r: i for i, r in enumerate(order)}
        rate_plans = sorted(self.rates, key=lambda rp: rank[rp.rate])
        return Plan(tuple(self.writes.items()), tuple(self.reads), tuple(rate_plans))


def quota_suffix(q: Quota, k: int) -> str:
    """The key suffix of the counter of period ``k`` of ``q`` (``":qmonth:24323"``)."""
    return f":q{q.unit}:{k}"


def uniform_plan(
    rates: tuple[Rate, ...], indexes: tuple[int, ...], g: int, fine_only: bool = False
) -> Plan:
    """The plan of the uniform layout for ``rates`` whose fine buckets are ``indexes``."""
    builder = _Builder()
    for rate, k in zip(rates, indexes, strict=True):
        builder.uniform(rate, k, g, fine_only)
    if fine_only:
        builder.writes.clear()
    return builder.build(rates)


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


def hierarchical_plan(rates: tuple[Rate, ...], now: int, per_window: int) -> Plan:
    """The plan of the hierarchical layout for ``rates`` at the whole second ``now``."""
    builder = _Builder()
    longest = 0

    def token(size: int, index: int) -> str:
        return f":h{size}:{index}"

    for rate in rates:
        if type(rate) is Quota:  # (a period's counter: the same in either layout)
            builder.quota(rate, calendar.index(rate, now))
            continue
        if rate.seconds > HIERARCHICAL_MAX:
            builder.uniform(rate, int(now * per_window // rate.seconds), per_window)
            continue
        longest = max(longest, rate.seconds)
        ahead = now + 1 + _seconds_ahead(rate.seconds)
        raw = _cover(now - rate.seconds, ahead, LEVELS, ahead)
        segments = builder.segments(raw, token, 1, rate.seconds, now + 1)
        builder.rates.append(RatePlan(rate, segments))
    if longest:
        # A fine bucket is read (subtracted) up to one coarser bucket past the window.
        coarser = {3600: 0, 60: 3600, 1: 60}
        for lv in LEVELS:
            builder.writes[token(lv, now // lv)] = longest + lv + coarser[lv] + TTL_FUDGE
    return builder.build(rates)


def stored_suffixes(rates: tuple[Rate, ...], t: float, per_window: int = 60) -> set[str]:
    """Every bucket, in either layout, that can hold a hit from before ``t`` and still be read.

    Forgetting a subject (a reset) deletes these; for a one-day hierarchical window that is
    about 88,000 second buckets, which is fine for an operation a person starts.
    """
    now = math.floor(t)
    found = set(plan(rates, t, per_window).reads)
    c = coarse_factor(per_window)
    quotas = [r for r in rates if type(r) is Quota]
    for q in quotas:  # the period now, and the one before (its counter may still live)
        k = calendar.index(q, t)
        before = calendar.index(q, calendar.bounds(q, k)[0] - 1.0)
        found.update((quota_suffix(q, k), quota_suffix(q, before)))
    rates = tuple(r for r in rates if type(r) is not Quota)
    for rate in rates:
        k = int(t * per_window // rate.seconds)
        found.update(f":{rate.seconds}/{per_window}:{i}" for i in range(k - per_window - c, k + 1))
        if c > 1:
            top = k // c
            found.update(
                f":{rate.seconds}/{per_window}x{c}:{i}"
                for i in range(top - per_window // c - 1, top + 1)
            )
    longest = max((r.seconds for r in rates if r.seconds <= HIERARCHICAL_MAX), default=0)
    if longest:
        found.update(plan(rates, t, per_window, hierarchical=True).reads)
        for lv, span in ((1, longest + 61), (60, longest + 3661), (3600, longest + 3601)):
            found.update(f":h{lv}:{k}" for k in range((now - span) // lv, now // lv + 1))
    return found


# -- evaluation -----------------------------------------------------------------------------


def evaluate(
    p: Plan, values: list[int], t: float, counted: bool = False, cost: int = 1
) -> list[Usage]:
    """Usage of every rate of ``p`` from ``values`` (aligned with ``p.reads``) at time ``t``.

    ``counted``: ``values`` include this hit (``cost`` events), which is refused when a count
    is over its limit and then taken back, so the times to wait are computed without it.
    Otherwise (a look that counts nothing) a rate is limited when it has no room left for
    ``cost`` more events.
    """
    rate_plans = p.rates
    if len(rate_plans) == 1:  # the common case: one rate
        rp = rate_plans[0]
        counts: Sequence[int]
        if rp.multi:
            counts = _segment_counts(rp, values)
        else:  # every segment is one bucket: no call per rate
            counts = rp.pick(values)
            if counts and min(counts) < 0:
                counts = _clamped(counts)
        n = sum(counts)
        limit = rp.rate.count
        if 0 < n < limit and (counted or n + cost <= limit):
            # The common case of :func:`_usage`, inline: nothing to wait for.
            k = len(counts) - 1
            while not counts[k]:  # the window is empty once its newest events have left
                k -= 1
            reset = rp.ends[k] - t
            reset = reset if reset > 0.0 else 0.0
            return [_tuple(Usage, (rp.rate, n, limit - n, False, 0.0, reset))]
        return [_usage(rp, counts, n, counted and n > limit, counted, t, cost)]
    per_segment = [_segment_counts(rp, values) for rp in rate_plans]
    ns = list(map(sum, per_segment))
    refused = counted and any(n > rp.rate.count for n, rp in zip(ns, rate_plans))
    return [
        _usage(rp, counts, n, refused, counted, t, cost)
        for rp, n, counts in zip(rate_plans, ns, per_segment)
    ]


def _segment_counts(rp: RatePlan, values: list[int]) -> list[int]:
    """Events in each segment of ``rp``, oldest first. A segment's true count is never
    negative; a reset or an evicted coarse bucket can make coarse - fine negative, and
    counting that would be lenient."""
    counts = list(rp.pick(values))  # in C: no Python call per value
    for k, terms in rp.multi:
        total = 0
        for i, sign in terms:
            total += values[i] * sign
        counts[k] = total
    if counts and min(counts) < 0:
        counts = _clamped(counts)
    return counts


def _clamped(counts: Sequence[int]) -> list[int]:
    """``counts`` with a negative one as 0: a segment's true count is never negative."""
    return [c if c > 0 else 0 for c in counts]


def _usage(
    rp: RatePlan,
    counts: Sequence[int],
    n: int,
    refused: bool,
    counted: bool,
    t: float,
    cost: int = 1,
) -> Usage:
    """One rate's usage: ``n`` events in its window, ``counts`` of them per segment;
    ``refused``: this hit (``cost`` events counted in them) is refused, so waits are timed
    without it: until the window has room for ``cost`` more."""
    limit = rp.rate.count
    room = limit - cost  # the most events the window may hold for this hit to fit
    retry_after = reset = 0.0
    left = n - cost if refused else n
    if 0 < left <= room:
        # The common case, kept cheap: nothing to wait for, and the window is empty once
        # its newest events have left it.
        k = len(counts) - 1
        while k >= 0 and not counts[k]:
            k -= 1
        if k >= 0:
            reset = max(0.0, rp.ends[k] - t)
    elif left > 0 or (n and room < 0):
        # The segments that hold events, oldest first (picked in C: a refused check's
        # fine plan has a segment per fine bucket, most of them empty; none is negative),
        # paired after they are picked (no pair made for an empty one).
        for leaves_at, c in zip(compress(rp.ends, counts), compress(counts, counts)):
            if left > room and left - c <= room:
                retry_after = max(0.0, leaves_at - t)
            left -= c
            if left <= 0:
                reset = max(0.0, leaves_at - t)
                break
        if room < 0:  # never fits (a count of 0, a cost over it): when the window empties
            retry_after = reset
    elif room < 0:  # never admits: wait a whole window, and then again
        retry_after = float(rp.rate.seconds)
    # Counted: limited when over the limit; a look: when there is no room for this hit.
    limited = n > limit if counted else n > room
    remaining = limit - n
    return _tuple(  # (tuple.__new__: a named tuple's own __new__ is a Python call)
        Usage, (rp.rate, n, remaining if remaining > 0 else 0, limited, retry_after, reset)
    )


def settled_wait(
    p: Plan,
    values: list[int],
    t: float,
    settled: float,
    cost: int = 1,
    exact: Sequence[Usage] | None = None,
) -> float:
    """Seconds the rates of ``p`` surely have no room for ``cost`` more events, from
    ``values`` (aligned with ``p.reads``, read after this hit was taken back) counting only
    the events made ``settled`` seconds or more before ``t``: 0.0 when those alone leave room.

    A lower bound of the wait that no event still to be taken back can lengthen: another
    client's refused hit is counted, then taken back within its round trips, so an event that
    old is an admitted one, and it leaves when its segment does. A segment is counted only when
    all its events are that old (its end, less the window, is ``settled`` before ``t`` or
    earlier). A calendar quota's one counter for its period is never settled. ``exact``:
    :func:`evaluate`'s usages of the same values (a look), when the caller has them: a rate
    whose every event is settled then takes its wait from there."""
    horizon = t - settled
    sure = 0.0
    for i, rp in enumerate(p.rates):
        rate = rp.rate
        if type(rate) is Quota:
            continue
        # The segments are oldest first, their ends in order: the settled ones are a prefix
        # (found by bisection, summed in C: a refusal at the counters pays this).
        old = _segment_counts(rp, values)[: bisect_right(rp.ends, horizon + rate.seconds)]
        n = sum(old)
        if n + cost <= rate.count:  # room, as far as settled events tell
            continue
        if exact is not None and exact[i].count == n:  # every event settled: the same wait
            wait = exact[i].retry_after
        else:
            u = _usage(rp, old, n, False, False, t, cost)
            wait = u.retry_after if u.limited else 0.0
        if wait > sure:
            sure = wait
    return sure


def refine(
    usages: list[Usage],
    detail: Plan,
    values: list[int],
    t: float,
    cost: int = 1,
    exact: list[Usage] | None = None,
) -> list[Usage]:
    """``usages`` of a refused check, with waits timed from a ``fine_only`` plan's values.

    Read after the refused hit (``cost`` events) was taken back, so a rate is limited there
    when it has no room left for it; the counts stay as the check saw them. ``exact``: the
    look at those values (:func:`evaluate`), when the caller made it already.
    """
    if exact is None:
        exact = evaluate(detail, values, t, cost=cost)
    return [
        u._replace(retry_after=e.retry_after, reset=e.reset) if e.limited else u
        for u, e in zip(usages, exact)
    ]
