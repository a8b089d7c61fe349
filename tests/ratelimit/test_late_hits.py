"""A hit whose clock reading is older than another's, but whose write lands after it.

Each check reads the clock, then makes its round trip. Two concurrent hits X and Y can
read the clock as ``t_x < t_y`` while the server sees Y's write and read before X's. If X's
read covered only buckets up to ``t_x``, X would not see Y, Y (whose read came first) would
not see X, and both would be admitted: one more than the limit in the window that holds
them both. These tests force that order (Y's check, then X's with the earlier clock) at every
kind of bucket boundary, on every backend: the second one must be refused.

The guarantee has a bound, documented in docs/concepts.rst: a check also reads the buckets of
the next ``lookahead`` seconds (:func:`ratelimit_app.algorithms.windows.lookahead`), so a hit is
seen
by any hit whose clock is at most that much later.
"""

from __future__ import annotations

from typing import Any

import pytest

from ratelimit_app.algorithms import windows
from ratelimit_app.algorithms.rates import Rate, parse
from ratelimit_app.testing import frozen_clock
from tests.ratelimit.checking import check

#: A multiple of every bucket width below (up to four hours), so boundaries are easy to name.
B = 1_800_000_000 + 14400 * 10

# (rate, hierarchical, seconds before the boundary X reads its clock, Y's lead over X)
CASES = [
    # Uniform layout, 10/m: fine buckets of 1 s, coarse buckets of 10 s.
    ("10/m", False, 0.25, 0.5),  # across a coarse boundary (10 s)
    ("10/m", False, 5.25, 0.5),  # across a fine boundary inside a coarse bucket
    ("10/m", False, 0.25, 9.0),  # Y nearly a whole coarse bucket later
    ("3/s", False, 0.004, 0.01),  # 3/s: fine buckets of 1/60 s, coarse of 1/6 s
    ("100/d", False, 1.0, 1200.0),  # a day: coarse buckets of 4 h; Y 20 minutes later
    # Hierarchical layout: second, minute and hour counters.
    ("10/m", True, 0.25, 0.5),  # across a minute and an hour boundary
    ("10/h", True, 30.25, 0.5),  # across a second boundary inside a minute
    ("10/h", True, 0.25, 0.9),
]


@pytest.mark.parametrize(("rate", "hierarchical", "before", "lead"), CASES)
def test_a_late_write_with_an_earlier_clock_is_seen(
    backend: Any,
    group: str,
    rate: str,
    hierarchical: bool,
    before: float,
    lead: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rates = parse(rate)
    limit = rates[0].count
    t_x = B - before
    t_y = t_x + lead
    assert lead <= windows.lookahead(rates, 60, hierarchical)
    subject = ("ip", "192.0.2.1")
    monkeypatch.setattr(windows, "HIERARCHICAL", hierarchical)
    with frozen_clock(t_x) as clock:
        clock.set(t_x - rates[0].seconds / 2)  # limit - 1 hits, well inside both windows
        for _ in range(limit - 1):
            assert not check(group, subject, rates, True).limited
        clock.set(t_y)
        assert not check(group, subject, rates, True).limited  # the limit-th: admitted
        clock.set(t_x)  # X read its clock first, but its write lands now
        late = check(group, subject, rates, True)
    assert late.limited, f"{limit + 1} admitted within one {rates[0].seconds} s window"


def counted(rates: tuple[Rate, ...], t_x: float, t_y: float, hierarchical: bool) -> list[int]:
    """What a check at ``t_x`` counts, per rate, when the only hit stored is one at ``t_y``."""
    stored = {suffix for suffix, _ttl in windows.plan(rates, t_y, 60, hierarchical).writes}
    p = windows.plan(rates, t_x, 60, hierarchical)
    values = [int(suffix in stored) for suffix in p.reads]
    return [u.count for u in windows.evaluate(p, values, t_x)]


@pytest.mark.parametrize(
    ("rate", "hierarchical"),
    [("10/m", False), ("3/s;100/h", False), ("100/d", False), ("10/m;10/h", True), ("5/d", True)],
)
def test_a_hit_up_to_the_lookahead_later_is_counted_once(rate: str, hierarchical: bool) -> None:
    """The pure rule behind the test above, at every position in a window: a hit whose clock
    is up to ``lookahead`` later is counted exactly once (never twice: that would refuse
    early)."""
    rates = parse(rate)
    horizon = windows.lookahead(rates, 60, hierarchical)
    w = rates[0].seconds
    for step in range(200):
        t_x = B - w + step * w / 97 + 0.003
        for lead in (0.0, horizon / 3, horizon * 0.999):
            assert counted(rates, t_x, t_x + lead, hierarchical) == [1] * len(rates)


def test_the_lookahead_is_bounded() -> None:
    """A uniform check reads at most two coarse buckets past its own: a hit written later
    than that is not read, so the bound in the docs is the real one, and reads stay few."""
    rates = parse("10/m")
    coarse = windows.lookahead(rates)
    for step in range(100):
        t_x = B + step * 0.61
        assert counted(rates, t_x, t_x + 2 * coarse + 1, False) == [0]
