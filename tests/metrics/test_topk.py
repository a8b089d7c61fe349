"""The space-saving sketch (:mod:`metrics_app.topk`): bounded, and it keeps the heavy hitters."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from metrics_app.topk import Sketches, SpaceSaving


def test_a_flood_of_distinct_keys_stays_within_capacity() -> None:
    sketch = SpaceSaving(capacity=50)
    for i in range(100_000):
        sketch.add(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}", float(i))
    assert len(sketch.entries) == 50
    assert len(sketch._heap) <= 50  # one heap entry per key held


def test_heavy_hitters_are_found_among_a_flood() -> None:
    rng = random.Random(7)
    sketch = SpaceSaving(capacity=50)  # guaranteed: any key over 26,000 / 50 = 520 events
    heavy = {"a": 3000, "b": 2000, "c": 1000}
    stream = [k for k, n in heavy.items() for _ in range(n)]
    stream += [f"noise-{i}" for i in range(20_000)]  # each seen once
    rng.shuffle(stream)
    for t, key in enumerate(stream):
        sketch.add(key, float(t))
    top = [key for key, _ in sketch.top(3)]
    assert top == ["a", "b", "c"]
    for key, n in heavy.items():
        entry = sketch.entries[key]
        assert n <= entry.count <= n + entry.error


def test_first_last_label_and_ref_are_kept() -> None:
    sketch = SpaceSaving(capacity=2)
    sketch.add("k", 5.0, "203.0.113.0/24", "")
    sketch.add("k", 9.0, "ignored", "ignored")
    sketch.add("k", 7.0)  # late: last stays 9
    entry = sketch.entries["k"]
    assert (entry.count, entry.first, entry.last, entry.label, entry.ref) == (
        3,
        5.0,
        9.0,
        "203.0.113.0/24",
        "",
    )


def test_a_new_key_takes_the_least_counted_place_and_its_count() -> None:
    sketch = SpaceSaving(capacity=2)
    for key in ["a", "a", "a", "b", "b", "c"]:
        sketch.add(key, 0.0)
    assert set(sketch.entries) == {"a", "c"}
    assert (sketch.entries["c"].count, sketch.entries["c"].error) == (3, 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=400), st.integers(1, 12))
def test_counts_bound_the_true_counts(stream: list[int], capacity: int) -> None:
    """Every held count is at least the key's true count and at most ``error`` above it;
    the counts add up to the events; any key seen more than n/k times is held."""
    sketch = SpaceSaving(capacity=capacity)
    for t, key in enumerate(stream):
        sketch.add(str(key), float(t))
    true = Counter(str(k) for k in stream)
    assert len(sketch.entries) <= capacity
    assert sum(e.count for e in sketch.entries.values()) == len(stream)
    for name, entry in sketch.entries.items():
        assert true[name] <= entry.count <= true[name] + entry.error
    for held, n in true.items():
        if n > len(stream) / capacity:
            assert held in sketch.entries


def test_sketches_are_bounded_in_number_and_taken_whole() -> None:
    sketches = Sketches(capacity=3, max_sketches=2)
    for name in ["x", "y", "z"]:
        for i in range(10):
            sketches.add(name, f"k{i}", 1.0, keep=60)
    assert sketches.size() == 6  # two sketches of three keys: "z" dropped
    assert sketches.dropped == 10
    taken = sketches.take()
    assert sorted(taken) == ["x", "y"]
    assert taken["x"][0] == 60
    assert sketches.size() == 0 and sketches.take() == {}
