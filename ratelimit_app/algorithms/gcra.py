"""The leaky bucket, as the generic cell rate algorithm (GCRA): pure logic, no I/O.

A leaky bucket of **capacity** ``B`` (the burst) drains continuously at the **leak rate**
``N`` requests per ``W`` seconds. A request is admitted when the bucket's level plus one
does not exceed the capacity, and then adds one to the level; a refused request adds
nothing. Sliding windows answer "at most N per window"; a leaky bucket answers "a steady
rate with a bounded burst".

GCRA keeps one number per subject instead of a level and a time: the **theoretical arrival
time** ``TAT``, the moment the bucket will be empty. With the emission interval
``T = W / N`` (the time one request takes to leak out):

* the level at time ``t`` is ``L(t) = max(0, TAT - t) / T`` requests;
* a request at ``t`` fits when ``L(t) + 1 <= B``, that is when
  ``max(TAT, t) + T - t <= tau`` with the tolerance ``tau = B * T``;
* an admitted request sets ``TAT = max(TAT, t) + T`` (the level rises by one, from zero
  when the bucket had emptied); a refused one changes nothing;
* a request of **cost** ``c`` is ``c`` emissions: it fits when ``L(t) + c <= B`` and raises
  the level by ``c`` (``c * T`` where the lines above and below say ``T``); a cost over the
  capacity never fits, and its wait is a whole ``W``;
* whole requests that fit now: ``floor(B - L) = B - ceil(L)``, never below zero;
* the time until one more fits (``retry_after``): ``max(0, TAT + T - tau - t)``;
* the time until the bucket is empty: ``max(0, TAT - t)``.

**Exact arithmetic.** Every time is an integer number of *ticks* of ``1 / N`` microseconds,
so ``T`` is exactly ``W * 10**6`` ticks and ``tau`` exactly ``B * W * 10**6``: no rounding
anywhere, and a client sending at exactly the leak rate is never refused by a rounding
error. The clock is read to the microsecond (:func:`micros`). Stored, a TAT is the text
``"<microseconds>:<remainder in ticks>"`` (:func:`encode`), whose two integers stay below
2**53, so the Redis script (Lua numbers are doubles) computes the same decisions.

**Edge cases.** A count of 0 never admits (its ``retry_after`` is a whole ``W``, as for a
sliding window). A clock that goes backwards sees a fuller bucket, never an emptier one: a
TAT in the future only raises the level (never lenient); a TAT in the past is an empty
bucket. The capacity is an integer from 1 to ``rates.MAX_COUNT`` and a full bucket must
drain within ``rates.MAX_SECONDS`` (366 days: longer is a quota, not a rate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app.algorithms.rates import MAX_COUNT, MAX_SECONDS, Rate

#: The names of the built-in kinds of limit. Their registry, which validation, the admin and
#: the commands read, is :data:`ratelimit_app.config.kinds.KINDS`: a kind is asked, never
#: compared by name.
SLIDING_WINDOW = "sliding_window"
LEAKY_BUCKET = "leaky_bucket"
#: The checks of an in-flight limit (``concurrent``): sliding windows of
#: :class:`~ratelimit_app.algorithms.rates.Slots`, never named by a user.
IN_FLIGHT = "in_flight"
#: Microseconds per second: the meter's clock resolution.
MICROS = 1_000_000
#: The key suffix of a subject's TAT (bucket suffixes start with a digit or "h").
SUFFIX = ":gcra"
#: Seconds a stored TAT outlives the moment its bucket is empty.
TTL_MARGIN = 2


@dataclass(frozen=True, slots=True)
class Meter:
    """A leaky bucket's parameters: the leak ``rate`` and the ``capacity`` (burst)."""

    rate: Rate
    capacity: int

    @property
    def interval(self) -> int:
        """``T`` in ticks (``1 / N`` microseconds): ``W * 10**6``."""
        return self.rate.seconds * MICROS

    @property
    def tau(self) -> int:
        """The tolerance ``B * T`` in ticks: how far ahead of now the TAT may go."""
        return self.capacity * self.interval

    def ticks(self, now_us: int) -> int:
        """A time in microseconds as ticks."""
        return now_us * self.rate.count


def micros(t: float) -> int:
    """The clock's seconds as whole microseconds."""
    return round(t * MICROS)


def validate_burst(burst: object) -> int | None:
    """``burst`` if it can be a capacity (or None: the rate's count); ImproperlyConfigured
    otherwise."""
    if burst is None:
        return None
    if type(burst) is not int or not 1 <= burst <= MAX_COUNT:
        raise ImproperlyConfigured(
            f"Burst {burst!r}: the capacity of a leaky bucket is an integer from 1 to {MAX_COUNT}."
        )
    return burst


def meter(rates: tuple[Rate, ...], burst: int | None = None) -> Meter:
    """The bucket for ``rates`` (exactly one: the leak rate) and ``burst`` (default: the
    rate's count); ImproperlyConfigured when they do not make one. (The engine keeps the
    meters of its checks in the runtime.)"""
    if len(rates) != 1:
        text = ";".join(map(str, rates))
        raise ImproperlyConfigured(
            f"Rate {text!r}: a leaky bucket has one leak rate; for several limits use "
            "several rules or decorators (or the sliding window, which takes several rates)."
        )
    rate = rates[0]
    capacity = rate.count if burst is None else validate_burst(burst)
    assert capacity is not None  # validate_burst returns what it was given
    if rate.count and capacity * rate.seconds > MAX_SECONDS * rate.count:
        raise ImproperlyConfigured(
            f"Burst {capacity} at rate {rate}: a full bucket would take longer than "
            f"{MAX_SECONDS // 86400} days to drain; lower the burst or raise the rate."
        )
    return Meter(rate, capacity)


def fits(m: Meter, tat: int | None, now_us: int, cost: int = 1) -> bool:
    """True when one more request of ``cost`` (that many emissions) fits in the bucket at
    ``now_us``."""
    if m.rate.count == 0:
        return False
    t = m.ticks(now_us)
    return _base(tat, t) + cost * m.interval - t <= m.tau


def _base(tat: int | None, t: int) -> int:
    """``max(TAT, t)``: a TAT in the past (or none) is an empty bucket."""
    return t if tat is None or tat < t else tat


def advance(m: Meter, tat: int | None, now_us: int, cost: int = 1) -> int:
    """The TAT after admitting one request of ``cost`` at ``now_us``."""
    return _base(tat, m.ticks(now_us)) + cost * m.interval


def charged(m: Meter, tat: int | None, now_us: int, cost: int) -> int:
    """The TAT after a charge of ``cost`` at ``now_us``, whether it fits or not: the bucket
    fills past its capacity, at most to a drain of ``rates.MAX_SECONDS`` (366 days) from
    now, so that every backend can keep it (a TTL, Lua's exact integers)."""
    t = m.ticks(now_us)
    return min(advance(m, tat, now_us, cost), t + MAX_SECONDS * MICROS * m.rate.count)


@dataclass(frozen=True, slots=True)
class State:
    """A subject's bucket after one check (times in seconds)."""

    meter: Meter
    #: This request was counted and admitted (the TAT moved).
    admitted: bool
    #: Counted: refused. A look: no room for one more.
    limited: bool
    #: The TAT after the check, in ticks (None: nothing stored, an empty bucket).
    tat: int | None
    #: Requests in the bucket (fractional: it drains continuously).
    level: float
    #: Whole requests that fit now.
    remaining: int
    #: Seconds until one more request fits (0: now).
    retry_after: float
    #: Seconds until the bucket is empty.
    empty_in: float

    @property
    def count(self) -> int:
        """The level rounded up: ``count + remaining == capacity`` unless over full."""
        return math.ceil(self.level)


def evaluate(m: Meter, tat: int | None, now_us: int, increment: bool, cost: int = 1) -> State:
    """The model's decision: the bucket after a check at ``now_us`` of a subject whose stored
    TAT was ``tat``; ``increment``: the request is counted, and admitted when it fits;
    ``cost``: the emissions it takes."""
    fit = increment and fits(m, tat, now_us, cost)
    written = advance(m, tat, now_us, cost) if fit else None
    return outcome(m, tat, written, now_us, increment, cost)


def outcome(
    m: Meter, read: int | None, written: int | None, now_us: int, increment: bool, cost: int = 1
) -> State:
    """The bucket after a check that read the TAT ``read`` and stored ``written`` (None:
    stored nothing), as the backend reports it.

    The backend decides, atomically (the Redis script, a memcached compare-and-set); a
    counted request that stored nothing was refused, even when it would fit now (a
    memcached check that kept losing the compare-and-set race is refused: the safe side).
    """
    if not increment:
        limited = not fits(m, read, now_us, cost)
        return state(m, read, now_us, admitted=False, limited=limited, cost=cost)
    if written is None:
        return state(m, read, now_us, admitted=False, limited=True, cost=cost)
    return state(m, written, now_us, admitted=True, limited=False, cost=cost)


def state(
    m: Meter, tat: int | None, now_us: int, admitted: bool, limited: bool, cost: int = 1
) -> State:
    """The reported state of a bucket whose TAT is ``tat`` at ``now_us``; its wait is the
    time until a request of ``cost`` fits (a whole ``W`` when it never can: a cost over the
    capacity, as for a count of 0)."""
    rate = m.rate
    if rate.count == 0:
        return State(m, False, True, None, 0.0, 0, float(rate.seconds), 0.0)
    t = m.ticks(now_us)
    ahead = _base(tat, t) - t  # ticks until empty
    unit = rate.count * MICROS  # ticks per second
    if cost > m.capacity:
        wait = rate.seconds * unit
    else:
        wait = max(0, ahead + cost * m.interval - m.tau)
    return State(
        meter=m,
        admitted=admitted,
        limited=limited,
        tat=tat,
        level=ahead / m.interval,
        remaining=max(0, m.capacity - -(-ahead // m.interval)),
        retry_after=wait / unit,
        empty_in=ahead / unit,
    )


def take_back(m: Meter, tat: int, cost: int = 1) -> int:
    """The TAT with one admitted request of ``cost`` taken back (a request refused by
    another limit)."""
    return tat - cost * m.interval


def encode(m: Meter, tat: int) -> bytes:
    """The stored form of a TAT: ``b"<microseconds>:<ticks>"``."""
    us, rest = divmod(tat, m.rate.count)
    return b"%d:%d" % (us, rest)


def decode(m: Meter, raw: bytes | str | None) -> int | None:
    """A stored TAT in ticks (None when nothing is stored); ValueError when corrupt."""
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else raw
    us, sep, rest = text.partition(":")
    if not sep or not us.isdigit() or not rest.isdigit() or int(rest) >= m.rate.count:
        raise ValueError(f"not a leaky-bucket TAT: {text[:40]!r}")
    return int(us) * m.rate.count + int(rest)


def ttl_seconds(m: Meter, tat: int, now_us: int) -> int:
    """How long to keep a TAT: until its bucket is empty, plus a margin, in whole seconds."""
    ahead = max(0, tat - m.ticks(now_us))
    return -(-ahead // (m.rate.count * MICROS)) + TTL_MARGIN
