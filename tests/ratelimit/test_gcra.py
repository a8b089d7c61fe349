"""The leaky bucket's pure logic (:mod:`ratelimit_app.algorithms.gcra`) against a reference meter.

The reference (:class:`tests.ratelimit.conftest.ReferenceMeter`) is written independently of
the module: a level and the time it was last set, draining continuously at the leak rate, in
exact rational arithmetic; a request is admitted when the level plus one does not exceed the
capacity, and only an admitted request fills the bucket. GCRA keeps a single number (the
theoretical arrival time) instead; the two must agree on every decision and every figure.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_app.algorithms import gcra
from ratelimit_app.algorithms.rates import MAX_SECONDS, Rate, parse
from tests.ratelimit.conftest import ReferenceMeter

T0_US = 1_700_000_000 * gcra.MICROS


def seconds(us: int) -> Fraction:
    return Fraction(us, gcra.MICROS)


def run_trace(m: gcra.Meter, trace: list[tuple[int, bool]]) -> None:
    """Feed ``trace`` ((time in microseconds, counted?) pairs) to both; compare every step."""
    ref = ReferenceMeter(m.rate.count, m.rate.seconds, m.capacity)
    tat: int | None = None
    for step, (now_us, count) in enumerate(trace):
        state = gcra.evaluate(m, tat, now_us, count)
        t = seconds(now_us)
        expected = ref.request(t, count)
        assert (not state.limited) == expected, (step, now_us, count)
        assert state.admitted == (expected and count)
        if state.admitted:
            tat = state.tat
        if m.rate.count == 0:
            continue
        level, remaining, wait, empty = ref.figures(t)
        assert state.level == float(level), step
        assert state.remaining == remaining, step
        assert state.retry_after == float(wait), step
        assert state.empty_in == float(empty), step
        assert state.count == math.ceil(level)


def test_a_burst_then_one_per_interval() -> None:
    m = gcra.meter(parse("10/s"), burst=5)
    tat = None
    decisions = []
    for _ in range(7):  # seven at once: the five of the burst fit
        state = gcra.evaluate(m, tat, T0_US, True)
        tat = state.tat
        decisions.append(state.admitted)
    assert decisions == [True] * 5 + [False] * 2
    assert (state.level, state.remaining, state.retry_after, state.empty_in) == (5, 0, 0.1, 0.5)
    early = gcra.evaluate(m, tat, T0_US + 99_999, True)
    assert early.limited
    assert early.tat == tat  # refused: the bucket is not filled
    assert early.retry_after == pytest.approx(1e-6)
    on_time = gcra.evaluate(m, tat, T0_US + 100_000, True)
    assert on_time.admitted
    assert on_time.level == 5


def test_a_client_at_exactly_the_leak_rate_is_never_refused() -> None:
    # 3 per second: the interval is 333,333.33... microseconds, not a whole number. After a
    # full burst, a client sending exactly every interval (rounded up to the microsecond, as
    # its clock reads) always finds room: exact arithmetic, no drift.
    m = gcra.meter(parse("3/s"), burst=3)
    tat = None
    for _ in range(3):
        tat = gcra.evaluate(m, tat, T0_US, True).tat
    for k in range(1, 3001):
        now = T0_US + math.ceil(k * gcra.MICROS / 3)
        state = gcra.evaluate(m, tat, now, True)
        assert state.admitted, k
        tat = state.tat
        assert gcra.evaluate(m, tat, now, True).limited  # and nothing more


def test_refused_requests_do_not_fill_the_bucket() -> None:
    m = gcra.meter(parse("1/s"), burst=2)
    tat = gcra.evaluate(m, None, T0_US, True).tat
    tat = gcra.evaluate(m, tat, T0_US, True).tat
    for k in range(100):  # a client hammering a full bucket
        refused = gcra.evaluate(m, tat, T0_US + k * 1000, True)
        assert refused.limited
        assert refused.tat == tat
    assert gcra.evaluate(m, tat, T0_US + 1_000_000, True).admitted  # one leaked out


def test_a_look_counts_nothing_and_is_limited_without_room() -> None:
    m = gcra.meter(parse("2/m"))
    look = gcra.evaluate(m, None, T0_US, False)
    assert (look.limited, look.admitted, look.tat, look.remaining) == (False, False, None, 2)
    tat = gcra.advance(m, gcra.advance(m, None, T0_US), T0_US)
    full = gcra.evaluate(m, tat, T0_US, False)
    assert full.limited
    assert full.tat == tat
    assert full.retry_after == 30


def test_a_count_of_zero_never_admits() -> None:
    m = gcra.meter(parse("0/m"))
    assert m.capacity == 0
    for now in (T0_US, T0_US + 10**9):
        state = gcra.evaluate(m, None, now, True)
        assert state.limited
        assert state.tat is None
        assert state.retry_after == 60
    assert gcra.meter(parse("0/m"), burst=5).capacity == 5
    assert gcra.evaluate(gcra.meter(parse("0/m"), burst=5), None, T0_US, True).limited


def test_a_clock_that_goes_back_is_never_more_lenient() -> None:
    m = gcra.meter(parse("1/s"), burst=3)
    tat = None
    for _ in range(3):
        tat = gcra.evaluate(m, tat, T0_US, True).tat
    # Another server's clock, two seconds behind, sees a bucket fuller than full.
    behind = gcra.evaluate(m, tat, T0_US - 2_000_000, True)
    assert behind.limited
    assert behind.level == 5
    assert behind.remaining == 0
    assert behind.retry_after == 3  # until the level is down to capacity - 1


def test_a_huge_rate_is_exact() -> None:
    m = gcra.meter(parse("1000000000/s"))  # a thousand requests a microsecond
    assert m.interval == gcra.MICROS
    tat = None
    for _ in range(1000):
        tat = gcra.evaluate(m, tat, T0_US, True).tat
    state = gcra.evaluate(m, tat, T0_US, False)
    assert state.level == 1000
    assert state.empty_in == pytest.approx(1e-6)
    raw = gcra.encode(m, tat)  # type: ignore[arg-type]
    assert raw == b"%d:0" % (T0_US + 1)
    assert gcra.decode(m, raw) == tat


@pytest.mark.parametrize(
    ("burst", "rates", "message"),
    [
        (0, "5/m", "integer from 1"),
        (-1, "5/m", "integer from 1"),
        (True, "5/m", "integer from 1"),
        (2.5, "5/m", "integer from 1"),
        ("5", "5/m", "integer from 1"),
        (10**9 + 1, "5/m", "integer from 1"),
        (10**6, "1/d", "longer than 366 days"),
        (None, "5/m;100/d", "one leak rate"),
    ],
)
def test_invalid_meters(burst: object, rates: str, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        gcra.meter(parse(rates), burst)  # type: ignore[arg-type]


def test_the_longest_drain_is_allowed() -> None:
    assert gcra.meter(parse("1/d"), burst=MAX_SECONDS // 86400).capacity == 366


def test_stored_form() -> None:
    m = gcra.meter(parse("3/s"))
    tat = gcra.advance(m, None, T0_US)  # T0 + 333,333 1/3 microseconds
    assert gcra.encode(m, tat) == b"%d:1" % (T0_US + 333_333)
    assert gcra.decode(m, gcra.encode(m, tat)) == tat
    assert gcra.decode(m, gcra.encode(m, tat).decode()) == tat
    assert gcra.decode(m, None) is None
    for corrupt in (b"12", b"12:3", b"-1:0", b"1.5:0", b"x:0", b"12:", b":1"):
        with pytest.raises(ValueError, match="not a leaky-bucket TAT"):
            gcra.decode(m, corrupt)


def test_ttl_covers_the_time_until_empty() -> None:
    m = gcra.meter(parse("10/m"), burst=10)
    tat = None
    for _ in range(10):
        tat = gcra.advance(m, tat, T0_US)
    assert gcra.ttl_seconds(m, tat, T0_US) == 60 + gcra.TTL_MARGIN  # type: ignore[arg-type]
    assert gcra.ttl_seconds(m, T0_US * 10, T0_US + 1) == gcra.TTL_MARGIN


def test_take_back_undoes_one_admission() -> None:
    m = gcra.meter(parse("5/s"))
    once = gcra.advance(m, None, T0_US)
    twice = gcra.advance(m, once, T0_US)
    assert gcra.take_back(m, twice) == once
    assert gcra.take_back(m, once) == m.ticks(T0_US)  # an empty bucket


@st.composite
def traces(draw: st.DrawFn) -> tuple[gcra.Meter, list[tuple[int, bool]]]:
    """A meter and a trace: random gaps around its interval, bursts at one instant, gaps of
    exactly whole intervals (the boundaries), and now and then a clock that goes back."""
    count = draw(st.integers(0, 50))
    period = draw(st.sampled_from([1, 3, 7, 60, 3600]))
    burst = draw(st.none() | st.integers(1, 20))
    m = gcra.meter((Rate(count, period),), burst)
    interval_us = Fraction(period * gcra.MICROS, max(count, 1))
    now = T0_US
    trace = []
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["same", "exact", "random", "back"]))
        if kind == "exact":
            now += math.ceil(draw(st.integers(1, 3)) * interval_us)
        elif kind == "random":
            now += draw(st.integers(0, int(3 * interval_us)))
        elif kind == "back":
            now -= draw(st.integers(1, int(interval_us)))
        trace.append((now, draw(st.booleans())))
    return m, trace


@settings(max_examples=400, deadline=None)
@given(traces())
def test_gcra_equals_the_reference_meter(case: tuple[gcra.Meter, list[tuple[int, bool]]]) -> None:
    run_trace(*case)


@settings(max_examples=200, deadline=None)
@given(traces())
def test_any_interval_admits_at_most_the_burst_plus_what_leaks_out(
    case: tuple[gcra.Meter, list[tuple[int, bool]]],
) -> None:
    """In any L seconds at most ``B + floor(L / T)`` admitted, clocks going back included."""
    m, trace = case
    tat, admitted = None, []
    for now_us, _ in trace:
        state = gcra.evaluate(m, tat, now_us, True)
        if state.admitted:
            tat = state.tat
            admitted.append(now_us)
    interval = Fraction(m.rate.seconds * gcra.MICROS, max(m.rate.count, 1))
    ordered = sorted(admitted)
    for i, first in enumerate(ordered):
        for j in range(i, len(ordered)):
            assert j - i + 1 <= m.capacity + math.floor((ordered[j] - first) / interval)


def test_a_full_burst_then_the_leak_is_2n_minus_1_in_a_window() -> None:
    """With the default burst (N), a window ``(t - W, t]`` can hold 2N - 1 admitted
    requests (the comparison in the docs), never 2N."""
    m = gcra.meter(parse("5/m"))
    tat, admitted = None, []
    for now in [T0_US] * 5 + [T0_US + k * 12 * gcra.MICROS for k in range(1, 6)]:
        state = gcra.evaluate(m, tat, now, True)
        assert state.admitted  # 5 at once, then one every 12 s
        tat = state.tat
        admitted.append(now)
    window = 60 * gcra.MICROS
    most = max(sum(t - window < a <= t for a in admitted) for t in admitted)
    assert most == 2 * 5 - 1
