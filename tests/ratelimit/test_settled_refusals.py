"""Settled refusals (ratelimit_app/engine/refusals/memory.py): a refusal that admitted hits
keep in force is answered from memory past the cap while the version counters vouch that no
count was lowered and no rule changed.

The cap bounds what memory cannot see: a reset made elsewhere, a rule changed. The version
counters see both (a reset bumps :data:`~ratelimit_app.config.versions.COUNTS`; a flush
loses them), so while each process looks at them about once a second, a refusal need not
be confirmed every cap. What they cannot see is another client's refused hit still to be
taken back: :func:`~ratelimit_app.algorithms.windows.settled_wait` counts only events old
enough to be admitted ones.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.test import Client
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_app.algorithms import windows
from ratelimit_app.algorithms.calendar import Quota
from ratelimit_app.backends import get_backend
from ratelimit_app.config import versions
from ratelimit_app.engine.refusals import memory as refusals
from ratelimit_app.engine.refusals import remembered as memory
from ratelimit_app.identity import keys
from ratelimit_app.operators import operations
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.testing import frozen_clock
from tests.ratelimit.conftest import RoundTrips, rules

T0 = 1_800_000_000.0
CAP = 2.0
HOUR = windows.Rate(2, 3600)


def rule(**fields: Any) -> dict[str, Any]:
    return {"name": "settled", "path": "/rules/named/", "key": "ip", "rate": "2/h", **fields}


def look_now() -> None:
    """Make this process look at the version counters on its next request (as it does
    about once a second: the tests' clock is frozen, the store's is not)."""
    snap = RUNTIME.snapshot
    assert snap is not None
    snap.deadline = -math.inf


# -- the pure part: windows.settled_wait ----------------------------------------------------


def fine(rates: tuple[windows.Rate, ...], t: float) -> windows.Plan:
    return windows.uniform_plan(rates, windows.indexes(rates, t, 60), 60, fine_only=True)


def test_old_events_are_settled_for_their_whole_wait() -> None:
    t = T0 + 600
    p = fine((HOUR,), t)
    values = [0] * len(p.reads)
    values[0] = 2  # both hits in the oldest fine bucket of the window
    exact = windows.evaluate(p, values, t)[0]
    assert exact.limited
    assert windows.settled_wait(p, values, t, 10.0) == exact.retry_after > 0


def test_recent_events_settle_nothing() -> None:
    """A flood's hits of the last seconds may be refusals still to be taken back."""
    t = T0 + 600
    p = fine((HOUR,), t)
    values = [0] * len(p.reads)
    values[-1] = 5  # the current fine bucket: made within the last minute
    assert windows.evaluate(p, values, t)[0].limited
    assert windows.settled_wait(p, values, t, 10.0) == 0.0
    values[0] = 1  # one old hit: room for one more once the recent ones are left out
    assert windows.settled_wait(p, values, t, 10.0) == 0.0
    values[0] = 2
    assert windows.settled_wait(p, values, t, 10.0) > 0.0


def test_a_quota_is_never_settled() -> None:
    t = T0 + 600
    q = Quota(1, 86400, unit="day", zone="UTC")
    p = windows.uniform_plan((q,), windows.indexes((q,), t, 60), 60, fine_only=True)
    assert windows.settled_wait(p, [9] * len(p.reads), t, 10.0) == 0.0


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(st.integers(0, 4), min_size=61, max_size=61),
    offset=st.floats(0, 3600),
    settled=st.floats(0, 600),
    cost=st.integers(1, 3),
)
def test_the_settled_wait_never_exceeds_the_exact_one(
    counts: list[int], offset: float, settled: float, cost: int
) -> None:
    """A lower bound: leaving events out can only shorten the wait."""
    t = T0 + offset
    rates = (windows.Rate(5, 3600), windows.Rate(3, 60))
    p = fine(rates, t)
    values = [counts[i % len(counts)] for i in range(len(p.reads))]
    exact = windows.evaluate(p, values, t, cost=cost)
    waits = [u.retry_after for u in exact if u.limited]
    sure = windows.settled_wait(p, values, t, settled, cost)
    assert sure <= (max(waits) if waits else 0.0)


# -- the memory ----------------------------------------------------------------------------


def test_a_settled_refusal_is_held_past_its_cap_while_vouched_for() -> None:
    m: refusals.Memory[str] = refusals.Memory()
    m.remember("k", 0, 2, "K", ends=100, settled=80)
    assert m.recall("k", 1) == (1, "K")
    assert m.recall("k", 3) is None and m.due("k", 3) == (3, 97, "K")  # not vouched for
    m.vouch(2.5)
    assert m.recall("k", 3) == (3, "K") and m.due("k", 3) is None
    assert m.recall("k", 4.4) == (4.4, "K")
    assert m.recall("k", 4.6) is None  # a cap's length after the last look
    m.vouch(79)
    assert m.recall("k", 79.9) == (79.9, "K")
    assert m.recall("k", 80) is None and m.due("k", 80) == (80, 20, "K")  # no longer settled


def test_forgetting_everything_vouches_for_nothing() -> None:
    m: refusals.Memory[str] = refusals.Memory()
    m.vouch(1)
    m.remember("k", 1, 3, "K", ends=100, settled=80)
    m.clear()
    m.remember("k", 1, 3, "K", ends=100, settled=80)
    assert m.recall("k", 3.5) is None


def test_remembered_again_a_refusal_keeps_the_later_settled_time() -> None:
    m: refusals.Memory[str] = refusals.Memory()
    m.remember("k", 0, 2, "K", ends=100, settled=80)
    m.remember("k", 5, 7, "K2", ends=100)  # (a look confirmed it: nothing new known)
    m.vouch(10)
    assert m.recall("k", 11) == (6, "K2")


def test_an_unsettled_refusal_keeps_its_cap() -> None:
    m: refusals.Memory[str] = refusals.Memory()
    m.remember("k", 0, 2, "K", ends=100, settled=80)
    m.unsettle(["k", "other"])
    m.vouch(2.5)
    assert m.recall("k", 3) is None and m.due("k", 3) == (3, 97, "K")


# -- through the site ----------------------------------------------------------------------


@pytest.fixture
def capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "REFUSAL_MEMORY", CAP)


def refused_long_after_admitted(client: Client, clock: Any) -> int:
    """Two admitted hits, then, two minutes later (settled), the refusal; its wait."""
    assert [client.get("/rules/named/").status_code for _ in range(2)] == [200, 200]
    clock.advance(120)
    look_now()
    first = client.get("/rules/named/")
    assert first.status_code == 429
    return int(first["Retry-After"])


@pytest.mark.usefixtures("rules_site", "capped")
def test_a_settled_refusal_costs_no_round_trip_past_its_cap(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    with rules(rule()), frozen_clock(T0) as clock:
        wait = refused_long_after_admitted(client, clock)
        trips = RoundTrips(monkeypatch)
        answers = []
        for _ in range(10):  # five caps' worth, the version counters read before each
            clock.advance(1)
            look_now()
            answers.append(client.get("/rules/named/"))
        assert [r.status_code for r in answers] == [429] * 10
        assert [int(r["Retry-After"]) for r in answers] == [wait - k for k in range(1, 11)]
        assert trips.count == 0  # no check, no look: only the version counters were read


@pytest.mark.usefixtures("rules_site", "capped")
def test_without_a_look_at_the_versions_the_cap_holds(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that stops looking (no request through the middleware) confirms its
    refusals every cap again: one look, no write."""
    with rules(rule()), frozen_clock(T0) as clock:
        refused_long_after_admitted(client, clock)
        trips = RoundTrips(monkeypatch)
        clock.advance(CAP + 1)  # (the snapshot is fresh in real time: no look)
        assert client.get("/rules/named/").status_code == 429
        assert trips.count == 1 and trips.writing == 0


@pytest.mark.usefixtures("rules_site", "capped")
def test_a_reset_elsewhere_reaches_this_process_at_its_next_look(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counters deleted behind the limiter's back are not seen (the refusal is held), until
    the version counters say so: a reset elsewhere bumps COUNTS."""
    with rules(rule()), frozen_clock(T0) as clock:
        refused_long_after_admitted(client, clock)
        target = operations.target("settled", "127.0.0.1")
        assert target is not None
        ns = keys.namespace(target.scope, "ip", "127.0.0.1")
        get_backend().delete(ns, sorted(windows.stored_suffixes(target.rates, clock(), 60)))
        trips = RoundTrips(monkeypatch)
        clock.advance(CAP + 1)
        look_now()
        assert client.get("/rules/named/").status_code == 429  # held: nothing announced
        assert trips.count == 0
        versions.version_op(increment=True, which=versions.COUNTS)  # (another process's reset)
        clock.advance(1)
        look_now()
        assert client.get("/rules/named/").status_code == 200


@pytest.mark.usefixtures("rules_site", "capped")
def test_a_reset_through_the_api_bumps_the_counts_version(
    backend_kind: str, client: Client
) -> None:
    with rules(rule()), frozen_clock(T0) as clock:
        refused_long_after_admitted(client, clock)
        before = versions.read_version()
        assert before is not None and before[versions.COUNTS] > 0
        assert operations.reset("settled", "127.0.0.1")
        after = versions.read_version()
        assert after is not None and after[versions.COUNTS] == before[versions.COUNTS] + 1


@pytest.mark.usefixtures("rules_site", "capped")
def test_counters_flushed_are_a_change_too(backend_kind: str, client: Client) -> None:
    """A flush (a restart, ``cache.clear()``) loses the counts and the versions alike: the
    next look finds COUNTS at 0 and forgets the refusals."""
    with rules(rule()), frozen_clock(T0) as clock:
        refused_long_after_admitted(client, clock)
        from django.core.cache import caches

        caches["rl"].clear()
        get_backend().delete(
            keys.namespace("ratelimit-config", versions.VERSION_KEY, ""),
            [":h0:0", ":h1:0", ":h2:0", ":h3:0", ":h4:0"],
        )  # (a backend of its own connections: gone with the server's data)
        clock.advance(CAP + 1)
        look_now()
        assert client.get("/rules/named/").status_code == 200


@pytest.mark.usefixtures("rules_site", "capped")
def test_a_changed_rule_forgets_the_refusals(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule saved in another process: the next look forgets every refusal, and the next
    request is checked at the counters (refused there again: its counts stand)."""
    with rules(rule()), frozen_clock(T0) as clock:
        refused_long_after_admitted(client, clock)
        versions.version_op(increment=True, which=versions.CONFIG)
        trips = RoundTrips(monkeypatch)
        clock.advance(0.5)  # (within the cap: held, but for the look)
        look_now()
        assert client.get("/rules/named/").status_code == 429
        assert trips.writing == 2  # counted, then taken back: checked at the counters


@pytest.mark.usefixtures("rules_site", "capped")
def test_a_flood_of_recent_hits_is_not_settled(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused just after its hits were admitted: those may be others' refusals still to be
    taken back, as far as this process knows, so the cap holds."""
    with rules(rule()), frozen_clock(T0) as clock:
        assert [client.get("/rules/named/").status_code for _ in range(3)] == [200, 200, 429]
        trips = RoundTrips(monkeypatch)
        clock.advance(CAP + 1)
        look_now()
        assert client.get("/rules/named/").status_code == 429
        assert trips.count == 1 and trips.writing == 0  # the cap's look


@pytest.mark.usefixtures("rules_site", "capped")
def test_a_failure_only_refusal_is_not_settled(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its hits are taken back after the view when a request does not fail: its counts go
    down before its waits end, in any process."""
    failing = rule(path="/rules/status/401/", count="failures")
    with rules(failing), frozen_clock(T0) as clock:
        statuses = [client.get("/rules/status/401/").status_code for _ in range(2)]
        assert statuses == [401, 401]
        clock.advance(120)
        look_now()
        assert client.get("/rules/status/401/").status_code == 429
        trips = RoundTrips(monkeypatch)
        clock.advance(CAP + 1)
        look_now()
        assert client.get("/rules/status/401/").status_code == 429
        assert trips.count == 1 and trips.writing == 0  # the cap's look


@pytest.mark.usefixtures("rules_site", "capped")
def test_a_refusal_settles_at_a_later_look(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused while its hits were recent, then due long after: the look reads the fine
    buckets too (reads only), finds it settled, and the memory holds it from then on."""
    with rules(rule()), frozen_clock(T0) as clock:
        assert [client.get("/rules/named/").status_code for _ in range(3)] == [200, 200, 429]
        trips = RoundTrips(monkeypatch)
        clock.advance(100)
        look_now()
        assert client.get("/rules/named/").status_code == 429
        assert trips.count == 2 and trips.writing == 0  # the look, and its fine buckets
        for _ in range(3):
            clock.advance(CAP + 1)
            look_now()
            assert client.get("/rules/named/").status_code == 429
        assert trips.count == 2  # held since


def _settled_reference(p: windows.Plan, values: list[int], t: float, settled: float) -> float:
    """settled_wait as stated: each rate's wait from its segments whose every event is
    ``settled`` seconds old (the others counted as empty), the longest of the limited."""
    sure = 0.0
    for rp in p.rates:
        w = rp.rate.seconds
        counts = [values[seg.terms[0][0]] for seg in rp.segments]
        old = [c if end - w <= t - settled else 0 for c, end in zip(counts, rp.ends, strict=True)]
        u = windows.evaluate(
            windows.Plan((), p.reads, (rp,)),
            [
                v
                if i in {s.terms[0][0] for s, o in zip(rp.segments, old, strict=True) if o}
                else 0
                for i, v in enumerate(values)
            ],
            t,
        )[0]
        if u.limited:
            sure = max(sure, u.retry_after)
    return sure


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(st.integers(0, 3), min_size=61, max_size=61),
    offset=st.floats(0, 3600),
    settled=st.floats(0, 900),
)
def test_the_settled_wait_is_its_statement(
    counts: list[int], offset: float, settled: float
) -> None:
    t = T0 + offset
    rates = (windows.Rate(5, 3600), windows.Rate(3, 60))
    p = fine(rates, t)
    values = [counts[i % len(counts)] for i in range(len(p.reads))]
    expected = _settled_reference(p, values, t, settled)
    assert windows.settled_wait(p, values, t, settled) == expected
    exact = windows.evaluate(p, values, t)  # (what a refusal's refine has made already)
    assert windows.settled_wait(p, values, t, settled, exact=exact) == expected
