"""The bucket plans, checked against brute force on simulated traffic (no server needed)."""

from __future__ import annotations

import bisect
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_app.algorithms import windows
from ratelimit_app.algorithms.rates import Rate, parse

T0 = 1_700_000_000


class Simulated:
    """A perfect counter store: what a healthy backend does, in a dict."""

    def __init__(self, rates: tuple[Rate, ...], g: int = 60, hierarchical: bool = False):
        self.rates, self.g, self.hierarchical = rates, g, hierarchical
        self.store: Counter[str] = Counter()

    def hit(self, t: float) -> list[windows.Usage]:
        plan = windows.plan(self.rates, t, self.g, self.hierarchical)
        for suffix, _ttl in plan.writes:
            self.store[suffix] += 1
        usages = windows.evaluate(plan, [self.store[s] for s in plan.reads], t, counted=True)
        if any(u.limited for u in usages):  # as engine.check: a refused hit is taken back
            for suffix, _ttl in plan.writes:
                self.store[suffix] -= 1
            if not self.hierarchical:  # ... and the waits are timed from the fine buckets
                detail = windows.plan(self.rates, t, self.g, fine_only=True)
                values = [self.store[s] for s in detail.reads]
                usages = windows.refine(usages, detail, values, t)
        return usages


def max_in_any_window(times: list[float], w: float) -> int:
    """Most events in any half-open window [s, s + w)."""
    best = 0
    for i, t in enumerate(times):
        best = max(best, bisect.bisect_left(times, t + w) - i)
    return best


def admitted(sim: Simulated, times: list[float]) -> list[float]:
    return [t for t in times if not any(u.limited for u in sim.hit(t))]


def test_uniform_plan_reads_few_buckets_and_writes_a_fine_and_a_coarse_one() -> None:
    assert windows.coarse_factor(60) == 10
    # (found from the top: the definition's largest divisor d with d * d <= 2 * G)
    for g in range(1, 2001):
        expected = max(d for d in range(1, g + 1) if g % d == 0 and d * d <= 2 * g)
        assert windows.coarse_factor(g) == expected, g
    assert windows.coarse_factor(7) == 1  # a prime: one level, G + 1 reads and one ahead
    worst = max(len(windows.plan(parse("5/m"), T0 + s * 0.37, 60).reads) for s in range(3000))
    assert worst <= 13
    p = windows.plan(parse("5/m"), T0 + 0.5, 60)
    fine, coarse = p.writes
    assert fine[0] == ":60/60:1700000000"
    assert coarse[0] == ":60/60x10:170000000"
    # Each bucket lives until the last check that may read it: W + one coarse bucket.
    assert fine[1] >= 60 + 10 + 1
    assert coarse[1] >= 60 + 10
    assert len(windows.plan(parse("5/m"), T0, 7).reads) == 9


def test_rates_with_the_same_window_share_buckets() -> None:
    one = windows.plan(parse("5/m;100/d"), T0, 60)
    two = windows.plan(parse("5/m;10/m;100/d"), T0, 60)
    assert two.reads == one.reads
    assert len(two.writes) == 4


def test_hierarchical_reads_a_day_in_at_most_150_keys() -> None:
    day = (Rate(100, 86400),)
    worst = max(
        len(windows.plan(day, T0 + s, hierarchical=True).reads) for s in range(0, 86400, 13)
    )
    assert worst <= 84  # a naive second/minute/hour sum reads 142 (docs/concepts)
    assert len(windows.plan(day, T0, hierarchical=True).writes) == 3


@pytest.mark.parametrize("g", [60, 7])
@pytest.mark.parametrize("hierarchical", [False, True])
def test_count_matches_brute_force(hierarchical: bool, g: int) -> None:
    rng = random.Random(4)
    rate = Rate(10**6, 3600)
    sim = Simulated((rate,), g=g, hierarchical=hierarchical)
    events: list[float] = []
    t = float(T0)
    for _ in range(3000):
        t += rng.expovariate(1 / 4)
        events.append(t)
        usage = sim.hit(t)[0]
        exact = sum(1 for e in events if t - 3600 < e <= t)
        if hierarchical:
            # Whole seconds [T - W, T]: exact to one second.
            covered = sum(1 for e in events if int(t) - 3600 <= int(e) <= int(t))
            assert usage.count == covered
        else:
            width = 3600 / g
            assert exact <= usage.count
            assert usage.count <= sum(1 for e in events if t - 3600 - width < e <= t)


@pytest.mark.parametrize("hierarchical", [False, True])
@pytest.mark.parametrize("spec", ["5/m", "100/h", "1000/d", "10/10s"])
def test_never_lenient_on_bursts_at_edges(spec: str, hierarchical: bool) -> None:
    (rate,) = parse(spec)
    sim = Simulated((rate,), hierarchical=hierarchical)
    times = []
    for k in range(1, 4):
        edge = T0 + k * rate.seconds
        times += [edge - 0.001 * i for i in range(rate.count * 2, 0, -1)]  # just before
        times += [edge + 0.001 * i for i in range(rate.count * 2)]  # just after
    ok = admitted(sim, sorted(times))
    assert max_in_any_window(ok, rate.seconds) <= rate.count
    assert len(ok) >= rate.count  # it does admit


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 600, allow_nan=False), min_size=1, max_size=300),
    st.integers(1, 20),
    st.sampled_from([10, 60, 120]),
    st.booleans(),
    st.integers(1, 60),
)
def test_never_lenient_property(
    offsets: list[float], limit: int, seconds: int, hierarchical: bool, g: int
) -> None:
    rate = Rate(limit, seconds)
    sim = Simulated((rate,), g=g, hierarchical=hierarchical)
    ok = admitted(sim, sorted(T0 + o for o in offsets))
    assert max_in_any_window(ok, seconds) <= limit


def test_blocks_early_by_at_most_one_bucket() -> None:
    """Steady traffic: ours admits at least what a window one bucket longer would."""
    rate = Rate(60, 60)
    sim = Simulated((rate,))
    times = [T0 + i * 0.25 for i in range(2400)]  # 4/s for 10 minutes
    ok = admitted(sim, times)
    # An exact limiter over W + W/G admits at least this many in 10 minutes:
    stretched = 600 / (60 + 1) * 60
    assert len(ok) >= int(stretched) - 60
    assert max_in_any_window(ok, 60) <= 60


def test_retry_after_is_when_one_more_fits() -> None:
    rate = Rate(3, 60)
    sim = Simulated((rate,))
    for dt in (0, 10, 20):
        sim.hit(T0 + dt)
    usage = sim.hit(T0 + 30)[0]
    assert usage.limited and usage.remaining == 0
    # The first hit (bucket [T0, T0+1)) leaves the window at T0 + 61 at the latest.
    assert 30 < usage.retry_after <= 31.01
    after = sim.hit(T0 + 30 + usage.retry_after)[0]
    assert not after.limited and after.count == 3  # 10, 20 and this one; 30 was refused
    assert usage.reset > usage.retry_after


def test_reset_and_zero_rate() -> None:
    sim = Simulated((Rate(0, 60),))
    usage = sim.hit(T0)[0]
    assert usage.limited
    assert usage.retry_after == 60  # it never admits: a whole window, then again


def test_windows_longer_than_a_day_fall_back_to_uniform_in_hierarchical_mode() -> None:
    p = windows.plan((Rate(5, 60), Rate(100, 7 * 86400)), T0, hierarchical=True)
    assert [rp.rate.seconds for rp in p.rates] == [60, 7 * 86400]
    assert any(s.startswith(":604800/60:") for s in p.reads)


@settings(max_examples=500, deadline=None)
@given(
    seconds=st.sampled_from([1, 7, 60, 3600, 86400, 2_592_000]),
    per_window=st.sampled_from([1, 6, 60, 100]),
    t=st.floats(0.0, 4e9, allow_nan=False),
)
def test_a_fine_bucket_is_the_times_of_its_index(seconds: int, per_window: int, t: float) -> None:
    """``fine_bucket`` gives exactly the times whose fine-bucket index is ``t``'s, to the
    float: the compiled path keeps a plan made at ``t`` for all of them."""
    index = windows.indexes((Rate(1, seconds),), t, per_window)[0]
    since, until = windows.fine_bucket(seconds, t, per_window)
    assert since <= t < until

    def at(x: float) -> int:
        return windows.indexes((Rate(1, seconds),), x, per_window)[0]

    assert at(since) == index == at(math.nextafter(until, -math.inf))
    assert at(math.nextafter(since, -math.inf)) < index < at(until)
