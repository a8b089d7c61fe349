"""The in-process counter store (:mod:`ratelimit_app.backends.memory`) against the model.

Sliding windows are held to the model twice: the whole limiter runs on it as on every
other backend (:class:`~tests.ratelimit.test_model.LimiterMachine`, with
``RATELIMIT_BACKEND`` naming it), and :class:`WindowMachine` drives its ``run_many``
directly on a fake clock that both the plans and the backend's expiry read, so that buckets
expire during an example (on a server they outlive it). Leaky buckets are held to the
functions of :mod:`ratelimit_app.algorithms.gcra`. Then what is its own: the bound on
subjects (least recently used forgotten), expired buckets dropped, exact counts under
threads, and odd inputs.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ratelimit_app.algorithms import gcra, windows
from ratelimit_app.algorithms.rates import Rate, parse
from ratelimit_app.backends import get_backend, reset_backends
from ratelimit_app.backends.base import MeterOp, MeterReply, Op
from ratelimit_app.backends.memory import MemoryBackend
from ratelimit_app.exceptions import BackendError
from tests.ratelimit.test_model import LAYOUTS, LOCMEM, SETTINGS, LimiterMachine, Model

T0 = 1_800_000_000.0
SUBJECTS = ("memory:a", "memory:b", "memory:c")


class Clock:
    """A clock the test moves (seconds)."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# -- 1. sliding windows against the model ------------------------------------------------------


@pytest.mark.django_db  # the limiter reads its database rules (none): run alone, it may
def test_the_limiter_on_the_memory_backend_agrees_with_the_model() -> None:
    """Every request of :class:`LimiterMachine` (costs, take-backs, looks, resets, bans,
    leaky buckets, in-flight limits, clock moves) on this backend, as on the servers."""
    config = {
        "CACHES": {"default": LOCMEM, "rl": {**LOCMEM, "LOCATION": "memory-model"}},
        "RATELIMIT_USE_CACHE": "rl",
        "RATELIMIT_BACKEND": "ratelimit_app.backends.memory.MemoryBackend",
    }
    with override_settings(**config):
        reset_backends()
        try:
            assert type(get_backend()) is MemoryBackend
            run_state_machine_as_test(LimiterMachine, settings=SETTINGS)
        finally:
            reset_backends()


WINDOW_SECONDS = (10, 30, 60, 600, 3600)
rate_lists = st.lists(
    st.builds(Rate, st.integers(0, 12), st.sampled_from(WINDOW_SECONDS)),
    min_size=1,
    max_size=3,
    unique_by=lambda r: r.seconds,
).map(lambda rs: tuple(sorted(rs, key=lambda r: r.seconds)))
costs = st.sampled_from((1, 1, 1, 1, 2, 3, 5, 13))
MOVES = (
    "inside",
    "fine edge",
    "coarse edge",
    "part of a window",
    "window",
    "an expiry",
    "past every TTL",
)


class WindowMachine(RuleBasedStateMachine):
    """Counts, take-backs, looks and resets of three subjects on a :class:`MemoryBackend`
    and on the model's dict (:class:`~tests.ratelimit.test_model.Model`), one fake clock for
    the plans and the backend's expiry. The model drops an entry a second before its TTL
    (the earliest a server could): plans never read a bucket that late, so the values read
    must be equal although the backend keeps it a second longer."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.backend = MemoryBackend(clock=self.clock, max_subjects=len(SUBJECTS))
        self.model = Model(60, False)
        self.rates: tuple[Rate, ...] = ()
        #: Hits still counted, that a take-back may take back: (subject, plan, cost).
        self.counted: list[tuple[str, windows.Plan, int]] = []

    @initialize(rates=rate_lists, layout=st.sampled_from(LAYOUTS), start=st.floats(0, 86_400))
    def start(self, rates: tuple[Rate, ...], layout: tuple[bool, int], start: float) -> None:
        hierarchical, per_window = layout
        self.rates = rates
        self.model = Model(per_window, hierarchical)
        self.clock.t = T0 + start

    def plan(self, fine_only: bool = False) -> windows.Plan:
        model = self.model
        if fine_only and not model.hierarchical:
            return windows.plan(self.rates, self.clock.t, model.per_window, fine_only=True)
        return windows.plan(self.rates, self.clock.t, model.per_window, model.hierarchical)

    def compare(self, ns: str, p: windows.Plan, got: list[int], counted: bool, cost: int) -> None:
        t = self.clock.t
        expected = [self.model.value(ns, s, t) for s in p.reads]
        assert got == expected, (ns, t)
        usages = windows.evaluate(p, got, t, counted=counted, cost=cost)
        assert usages == windows.evaluate(p, expected, t, counted=counted, cost=cost)

    @rule(ns=st.sampled_from(SUBJECTS), increment=st.booleans(), cost=costs)
    def check(self, ns: str, increment: bool, cost: int) -> None:
        p = self.plan()
        got = self.backend.run_many([Op(ns, p, increment, None, cost)])[0]
        self.model.tally(ns, p, self.clock.t, increment, cost)
        if increment:
            self.counted.append((ns, p, cost))
        self.compare(ns, p, got, increment, cost)

    @precondition(lambda self: self.counted)
    @rule(index=st.integers(0, 20), again=st.booleans(), fine=st.booleans())
    def take_back(self, index: int, again: bool, fine: bool) -> None:
        """A refused hit taken back (and, ``again``, counted again in the same op, at the
        same cost: an op has one amount), reading the plan of now."""
        ns, undone, cost = self.counted.pop(index % len(self.counted))
        p = self.plan(fine_only=fine and not again)
        got = self.backend.run_many([Op(ns, p, again, undone, cost)])[0]
        t = self.clock.t
        self.model.uncount(ns, undone, cost, t)
        self.model.tally(ns, p, t, again, cost)
        if again:
            self.counted.append((ns, p, cost))
        self.compare(ns, p, got, again, cost)

    @rule(ns=st.sampled_from(SUBJECTS))
    def reset(self, ns: str) -> None:
        t = self.clock.t
        self.backend.delete(ns, [*windows.stored_suffixes(self.rates, t, self.model.per_window)])
        self.model.forget(ns)
        self.counted = [c for c in self.counted if c[0] != ns]
        p = self.plan()
        assert self.backend.run_many([Op(ns, p)])[0] == [0] * len(p.reads)

    @rule(
        move=st.sampled_from(MOVES),
        index=st.integers(0, 2),
        fraction=st.floats(0, 1, exclude_max=True),
        nudge=st.sampled_from([0.0, -0.001, 0.001]),
    )
    def move_clock(self, move: str, index: int, fraction: float, nudge: float) -> None:
        t = self.clock.t
        r = self.rates[index % len(self.rates)]
        width = r.seconds / self.model.per_window
        if move == "inside":
            target = t + fraction * width
        elif move in ("fine edge", "coarse edge"):
            size = width * (1 if move == "fine edge" else self.coarse)
            target = (t // size + 1) * size + nudge
        elif move == "part of a window":
            target = t + fraction * r.seconds
        elif move == "window":
            target = t + r.seconds + nudge
        elif move == "an expiry":  # the model drops a bucket here (the backend a second later)
            ahead = sorted(e.expires for e in self.model.entries.values() if e.expires > t)
            target = ahead[index % len(ahead)] + nudge if ahead else t
        else:
            target = t + 2 * max(WINDOW_SECONDS) + 3600 + fraction * 86_400
        self.clock.t = max(t, target)

    @property
    def coarse(self) -> int:
        return windows.coarse_factor(self.model.per_window)

    @invariant()
    def bounded(self) -> None:
        assert self.backend.subjects() <= len(SUBJECTS)


def test_run_many_agrees_with_the_model_on_a_fake_clock() -> None:
    run_state_machine_as_test(WindowMachine, settings=SETTINGS)


def test_one_call_runs_several_subjects_in_order() -> None:
    backend = MemoryBackend(clock=Clock())
    p = windows.plan(parse("5/m"), T0)
    got = backend.run_many([Op("x", p, True), Op("y", p, True, None, 3), Op("x", p, True)])
    assert [windows.evaluate(p, v, T0, counted=True)[0].count for v in got] == [1, 3, 2]


# -- 2. leaky buckets against gcra ----------------------------------------------------------------


class ReferenceTat:
    """One subject's TAT as the functions of :mod:`gcra` and ``Backend.meter_many``'s
    contract make it, kept for :func:`gcra.ttl_seconds` from each write."""

    def __init__(self) -> None:
        self.tat: int | None = None
        self.expires = 0.0

    def read(self, now: float) -> int | None:
        return self.tat if self.tat is not None and now < self.expires else None

    def meter(self, op: MeterOp, now_us: int) -> MeterReply:
        now = now_us / gcra.MICROS
        read, m = self.read(now), op.meter
        written = None
        if op.take_back is not None:
            if read is not None and read == op.take_back.written:
                self.store(gcra.take_back(m, read, op.cost), m, now_us)
        elif op.increment and op.force:
            written = gcra.charged(m, read, now_us, op.cost)
        elif op.increment and gcra.fits(m, read, now_us, op.cost):
            written = gcra.advance(m, read, now_us, op.cost)
        if written is not None:
            self.store(written, m, now_us)
        return MeterReply(read, written)

    def store(self, tat: int, m: gcra.Meter, now_us: int) -> None:
        self.tat = tat
        self.expires = now_us / gcra.MICROS + gcra.ttl_seconds(m, tat, now_us)


meter_steps = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "admit", "look", "force", "take back", "stale"]),
        costs,
        st.integers(0, 3_000_000),  # microseconds the clock moves first
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    spec=st.sampled_from(["1/s", "3/s", "5/10s", "2/m", "0/m"]),
    burst=st.none() | st.integers(1, 6),
    steps=meter_steps,
)
def test_the_leaky_bucket_agrees_with_gcra(
    spec: str, burst: int | None, steps: list[tuple[str, int, int]]
) -> None:
    m = gcra.meter(parse(spec), burst)
    now_us = gcra.micros(T0)
    clock = Clock()
    backend, reference = MemoryBackend(clock=clock), ReferenceTat()
    admitted: list[MeterReply] = []
    for kind, cost, move in steps:
        now_us += move
        clock.t = now_us / gcra.MICROS
        op = MeterOp("bucket", m, kind != "look", None, cost, kind == "force")
        if kind in ("take back", "stale") and admitted:
            reply = admitted.pop()
            if kind == "stale":  # a reply whose TAT is not the one stored
                reply = reply._replace(written=(reply.written or 0) + 1)
            op = MeterOp("bucket", m, False, reply, cost)
        try:
            expected = reference.meter(op, now_us)
        except ZeroDivisionError:  # a rate of 0 charged: no TTL, a failure, not a crash
            with pytest.raises(BackendError):
                backend.meter_many([op], now_us)
            return
        got = backend.meter_many([op], now_us)[0]
        assert got == expected, (kind, cost, now_us)
        if got.written is not None:
            admitted.append(got)


def test_a_meter_admits_the_burst_then_refuses() -> None:
    m = gcra.meter(parse("2/s"), burst=3)
    now_us = gcra.micros(T0)
    backend = MemoryBackend(clock=Clock())
    replies = backend.meter_many([MeterOp("b", m, True)] * 4, now_us)
    assert [r.written is not None for r in replies] == [True, True, True, False]
    assert replies[0].read is None and replies[1].read == replies[0].written
    look = backend.meter_many([MeterOp("b", m)], now_us)[0]
    assert look == MeterReply(replies[2].written, None)
    assert gcra.outcome(m, look.read, None, now_us, False).limited


def test_a_take_back_restores_only_the_tat_it_wrote() -> None:
    m = gcra.meter(parse("1/s"), burst=2)
    now_us = gcra.micros(T0)
    backend = MemoryBackend(clock=Clock())
    first, second = backend.meter_many([MeterOp("b", m, True)] * 2, now_us)
    # The first's TAT is no longer stored: taking it back changes nothing.
    backend.meter_many([MeterOp("b", m, take_back=first)], now_us)
    assert backend.meter_many([MeterOp("b", m)], now_us)[0].read == second.written
    backend.meter_many([MeterOp("b", m, take_back=second)], now_us)
    assert backend.meter_many([MeterOp("b", m)], now_us)[0].read == first.written


def test_a_forced_charge_fills_past_the_capacity() -> None:
    m = gcra.meter(parse("1/s"), burst=1)
    now_us = gcra.micros(T0)
    backend = MemoryBackend(clock=Clock())
    reply = backend.meter_many([MeterOp("b", m, True, cost=5, force=True)], now_us)[0]
    assert reply.written == gcra.charged(m, None, now_us, 5)
    assert gcra.state(m, reply.written, now_us, True, False).level == 5
    refused = backend.meter_many([MeterOp("b", m, True)], now_us + 3 * gcra.MICROS)[0]
    assert refused == MeterReply(reply.written, None)


def test_a_tat_expires_after_its_ttl() -> None:
    m = gcra.meter(parse("1/s"), burst=1)
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    now_us = gcra.micros(T0)
    written = backend.meter_many([MeterOp("b", m, True)], now_us)[0].written
    assert written is not None
    ttl = gcra.ttl_seconds(m, written, now_us)
    clock.t = T0 + ttl - 0.001
    assert backend.meter_many([MeterOp("b", m)], now_us)[0].read == written
    clock.t = T0 + ttl
    assert backend.meter_many([MeterOp("b", m)], now_us)[0].read is None
    assert backend.subjects() == 0


def test_delete_of_the_gcra_suffix_forgets_the_tat_only() -> None:
    m = gcra.meter(parse("1/s"))
    p = windows.plan(parse("5/m"), T0)
    backend = MemoryBackend(clock=Clock())
    backend.run_many([Op("s", p, True)])
    backend.meter_many([MeterOp("s", m, True)], gcra.micros(T0))
    backend.delete("s", [gcra.SUFFIX])
    assert backend.meter_many([MeterOp("s", m)], gcra.micros(T0))[0].read is None
    assert windows.evaluate(p, backend.run_many([Op("s", p)])[0], T0)[0].count == 1
    backend.delete("s", [suffix for suffix, _ in p.writes])
    assert backend.subjects() == 0


# -- 3. the bound ---------------------------------------------------------------------------------


def test_at_most_max_subjects_are_held_least_recently_used_forgotten() -> None:
    backend = MemoryBackend(clock=Clock(), max_subjects=100)
    p = windows.plan(parse("5/m"), T0)
    m = gcra.meter(parse("1/s"))
    backend.run_many([Op("kept", p, True)])
    for i in range(1000):
        if i % 2:
            backend.run_many([Op(f"s{i}", p, True)])
        else:
            backend.meter_many([MeterOp(f"s{i}", m, True)], gcra.micros(T0))
        if i % 10 == 0:  # "kept" is used often: never the least recently used
            backend.run_many([Op("kept", p)])
        assert backend.subjects() <= 100
    assert backend.subjects() == 100

    def count(ns: str) -> int:
        return windows.evaluate(p, backend.run_many([Op(ns, p)])[0], T0)[0].count

    assert count("kept") == 1
    assert count("s999") == 1  # the most recently used
    assert [count(f"s{i}") for i in range(1, 800, 2)] == [0] * 400  # forgotten
    assert backend.meter_many([MeterOp("s0", m)], gcra.micros(T0))[0].read is None
    assert backend.meter_many([MeterOp("s998", m)], gcra.micros(T0))[0].read is not None


def test_a_look_holds_nothing() -> None:
    backend = MemoryBackend(clock=Clock(), max_subjects=2)
    p = windows.plan(parse("5/m"), T0)
    m = gcra.meter(parse("1/s"))
    backend.run_many([Op("a", p, True)])
    for i in range(10):  # looks of unknown subjects forget nobody
        backend.run_many([Op(f"look{i}", p)])
        backend.meter_many([MeterOp(f"look{i}", m)], gcra.micros(T0))
    assert backend.subjects() == 1
    assert windows.evaluate(p, backend.run_many([Op("a", p)])[0], T0)[0].count == 1


def test_expired_buckets_are_dropped_when_their_subject_is_used() -> None:
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    rates = parse("5/m")
    p = windows.plan(rates, T0)
    backend.run_many([Op("s", p, True)])
    held = backend._subjects["s"].buckets  # (private: what it holds, not what it reads)
    assert set(held) == {suffix for suffix, _ in p.writes}
    short, long = sorted(p.writes, key=lambda w: w[1])
    assert short[1] < long[1]
    clock.t = T0 + short[1]  # one bucket's TTL is over, the other's is not
    later = windows.plan(rates, clock.t)
    backend.run_many([Op("s", later, True)])
    held = backend._subjects["s"].buckets
    assert short[0] not in held and long[0] in held
    assert len(held) == 3  # the one still alive, and the two this hit wrote
    clock.t += 3600
    assert backend.run_many([Op("s", later)])[0] == [0] * len(later.reads)
    assert backend.subjects() == 0


def test_clear_forgets_every_subject() -> None:
    backend = MemoryBackend(clock=Clock())
    p = windows.plan(parse("5/m"), T0)
    backend.run_many([Op(f"s{i}", p, True) for i in range(5)])
    assert backend.subjects() == 5
    backend.clear()
    assert backend.subjects() == 0
    assert backend.run_many([Op("s0", p)])[0] == [0] * len(p.reads)


def test_the_bound_must_hold_one_subject() -> None:
    with pytest.raises(ValueError, match="max_subjects"):
        MemoryBackend(max_subjects=0)


# -- 4. threads -----------------------------------------------------------------------------------


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Threads switch as often as the interpreter lets them."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def in_threads(n: int, work: Callable[[], Any]) -> list[Any]:
    """``work()`` in ``n`` threads started together; their results."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        results[i] = work()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.usefixtures("busy_switching")
def test_concurrent_increments_are_exact() -> None:
    backend = MemoryBackend(clock=Clock())
    p = windows.plan(parse("100/m"), T0)

    def hits() -> list[windows.Usage]:
        found = []
        for _ in range(500):
            values = backend.run_many([Op("one", p, True)])[0]
            found.append(windows.evaluate(p, values, T0, counted=True)[0])
        return found

    usages = [u for found in in_threads(8, hits) for u in found]
    # Each hit's increment and read were one step: it saw its own count, 1 to 4,000.
    assert sorted(u.count for u in usages) == list(range(1, 4001))
    assert sum(not u.limited for u in usages) == 100
    assert windows.evaluate(p, backend.run_many([Op("one", p)])[0], T0)[0].count == 4000


@pytest.mark.usefixtures("busy_switching")
def test_concurrent_meters_admit_the_burst_exactly() -> None:
    backend = MemoryBackend(clock=Clock())
    m = gcra.meter(parse("1/h"), burst=37)
    now_us = gcra.micros(T0)

    def admits() -> int:
        replies = [backend.meter_many([MeterOp("one", m, True)], now_us)[0] for _ in range(50)]
        return sum(r.written is not None for r in replies)

    assert sum(in_threads(8, admits)) == 37


# -- 5. odd inputs --------------------------------------------------------------------------------


def test_a_cost_of_zero_creates_buckets_at_zero() -> None:
    backend = MemoryBackend(clock=Clock())
    p = windows.plan(parse("5/m"), T0)
    assert backend.run_many([Op("s", p, True, None, 0)])[0] == [0] * len(p.reads)
    assert backend.subjects() == 1


def test_a_large_amount_is_counted_whole() -> None:
    backend = MemoryBackend(clock=Clock())
    p = windows.plan(parse("5/m"), T0)
    big = 10**30
    values = backend.run_many([Op("s", p, True, None, big)])[0]
    assert windows.evaluate(p, values, T0, counted=True, cost=big)[0].count == big
    backend.run_many([Op("s", p, False, p, big - 1)])
    assert windows.evaluate(p, backend.run_many([Op("s", p)])[0], T0)[0].count == 1


def test_a_take_back_stops_at_zero_and_never_creates() -> None:
    backend = MemoryBackend(clock=Clock())
    p = windows.plan(parse("5/m"), T0)
    assert backend.run_many([Op("nobody", p, False, p, 5)])[0] == [0] * len(p.reads)
    assert backend.subjects() == 0
    backend.run_many([Op("s", p, True, None, 2)])
    backend.run_many([Op("s", p, False, p, 5)])
    assert backend.run_many([Op("s", p)])[0] == [0] * len(p.reads)
    # Taken back then counted in one op: the take-back first.
    values = backend.run_many([Op("s", p, True, p, 3)])[0]
    assert windows.evaluate(p, values, T0, counted=True, cost=3)[0].count == 3


def test_delete_of_what_it_does_not_hold_is_no_error() -> None:
    backend = MemoryBackend(clock=Clock())
    p = windows.plan(parse("5/m"), T0)
    backend.delete("nobody", [":10/60:1", gcra.SUFFIX])
    backend.run_many([Op("s", p, True)])
    backend.delete("s", [":unknown"])
    assert windows.evaluate(p, backend.run_many([Op("s", p)])[0], T0)[0].count == 1
    assert backend.subjects() == 1


def test_it_is_built_like_every_backend_and_has_no_servers() -> None:
    backend = MemoryBackend("rl", object())
    assert backend.alias == "rl" and backend.cache_prefix == ""
    assert backend.servers == () and backend.inline_ok
    p = windows.plan(parse("5/m"), T0)
    assert backend.run("s", p, True) == backend.run("s", p, False)
