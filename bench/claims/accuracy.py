"""Window accuracy: the most requests admitted in any window of length W, simulated.

Every limiter sees the same arrival times (seeded, so runs are reproducible) and decides
admit or reject for each; we then slide a window of length W over the admitted timestamps and
report the largest count (a true sliding maximum over half-open windows ``(t - W, t]``).

Limiters:

* **sliding log** (the ideal): the exact timestamps of admitted requests; admit when fewer
  than N of them lie in ``(t - W, t]``.
* **fixed window** (django-ratelimit's algorithm): one counter per window aligned to period
  boundaries, incremented by every request, admit while the counter is at most N.
  django-ratelimit shifts each key's boundaries by ``crc32(key) % period``; that only moves
  the edges, so edges are simulated at multiples of W and bursts are placed on them.
* **ours** (uniform and hierarchical layouts): the real bucket logic of
  :mod:`ratelimit_app.algorithms.windows`, run over an in-memory dict of counters, as
  ``engine.check``
  runs it: increment, read, evaluate, and take the increment back when the hit is refused.
* **ours, refused hits counted**: the same without taking refused hits back (what
  django-ratelimit's counter does, and what ratelimit_app did before it took them back), with
  its exact reference, **sliding log, refused hits counted**.

Run: ``python -m bench.claims.accuracy``.
"""

from __future__ import annotations

import argparse
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ratelimit_app.algorithms import windows
from ratelimit_app.algorithms.rates import Rate

SEED = 20261122


# -- limiters -------------------------------------------------------------------------------


class Limiter:
    name = ""
    counts_rejected = True  # does a rejected request use up the budget?

    def __init__(self, limit: int, window: int) -> None:
        self.limit = limit
        self.window = window

    def allow(self, t: float) -> bool:
        raise NotImplementedError


class SlidingLog(Limiter):
    """Exact: timestamps of the requests that count, admit when < N in ``(t - W, t]``."""

    name = "sliding log (ideal)"
    counts_rejected = False

    def __init__(self, limit: int, window: int) -> None:
        super().__init__(limit, window)
        self.log: deque[float] = deque()

    def allow(self, t: float) -> bool:
        log = self.log
        while log and log[0] <= t - self.window:
            log.popleft()
        admitted = len(log) < self.limit
        if admitted or self.counts_rejected:
            log.append(t)
        return admitted


class SlidingLogAll(SlidingLog):
    name = "sliding log, refused hits counted"
    counts_rejected = True


class FixedWindow(Limiter):
    """django-ratelimit: a counter per aligned window, incremented by every request."""

    name = "fixed window (django-ratelimit)"

    def __init__(self, limit: int, window: int, offset: float = 0.0) -> None:
        super().__init__(limit, window)
        self.offset = offset
        self.index = -1
        self.count = 0

    def allow(self, t: float) -> bool:
        index = int((t - self.offset) // self.window)
        if index != self.index:
            self.index, self.count = index, 0
        self.count += 1
        return self.count <= self.limit


#: ratelimit_app takes back the increment of a refused hit (``engine.check_many``'s second
#: round trip, an ``Op`` with ``undo``): refused requests do not use up the quota.
UNDOES_REFUSED = True


class Buckets(Limiter):
    """ratelimit_app's bucket counters (windows.plan / windows.evaluate) over a dict.

    Like ``engine.check``: increment the plan's write buckets, read its buckets, evaluate, and
    take the increments back when the hit is refused (``undo``) if ``refund``.
    """

    def __init__(
        self,
        limit: int,
        window: int,
        hierarchical: bool = False,
        refund: bool = UNDOES_REFUSED,
        per_window: int = 60,
    ) -> None:
        super().__init__(limit, window)
        self.rates = (Rate(limit, window),)
        self.hierarchical = hierarchical
        self.refund = refund
        self.counts_rejected = not refund
        self.per_window = per_window
        self.counters: dict[str, int] = {}
        self.name = "ours, " + ("hierarchical" if hierarchical else "uniform")
        if refund != UNDOES_REFUSED:
            self.name += ", refused hits " + ("taken back" if refund else "counted")

    def allow(self, t: float) -> bool:
        counters = self.counters
        plan = windows.plan(self.rates, t, self.per_window, self.hierarchical)
        for suffix, _ttl in plan.writes:  # the backend increments, then reads
            counters[suffix] = counters.get(suffix, 0) + 1
        values = [counters.get(s, 0) for s in plan.reads]
        admitted = not any(u.limited for u in windows.evaluate(plan, values, t, counted=True))
        if not admitted and self.refund:
            for suffix, _ttl in plan.writes:
                counters[suffix] -= 1
        return admitted


def limiters(limit: int, window: int) -> list[Limiter]:
    return [
        SlidingLog(limit, window),
        FixedWindow(limit, window),
        Buckets(limit, window),
        Buckets(limit, window, hierarchical=True),
        # The other counting rule, for comparison, with its exact reference.
        Buckets(limit, window, refund=not UNDOES_REFUSED),
        SlidingLogAll(limit, window),
    ]


# -- traffic --------------------------------------------------------------------------------


def spread(start: float, end: float, n: int) -> list[float]:
    """``n`` evenly spaced arrivals in ``[start, end)``."""
    return [start + (end - start) * i / n for i in range(n)]


def poisson(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    """Poisson arrivals at ``rate`` per second in ``[start, end)``."""
    out, t = [], start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return out
        out.append(t)


def edge_bursts(limit: int, window: int, horizon: float, width: float) -> list[float]:
    """3N requests over ``width`` seconds centred on every third window edge.

    The windows before those edges are otherwise quiet, so a fixed window admits N just
    before the edge and N just after: 2N within ``width`` seconds.
    """
    out: list[float] = []
    edge = window
    while edge + width < horizon:
        out += spread(edge - width / 2, edge + width / 2, 3 * limit)
        edge += 3 * window
    return out


def random_bursts(
    rng: random.Random, limit: int, window: int, horizon: float, bursts: int
) -> list[float]:
    """``bursts`` bursts of 2N requests over 2 s each, at random times."""
    out: list[float] = []
    for _ in range(bursts):
        start = rng.uniform(0, horizon - 2)
        out += spread(start, start + 2, 2 * limit)
    return sorted(out)


def on_off(
    rng: random.Random, limit: int, window: int, horizon: float, on: float, off: float
) -> list[float]:
    """Poisson at 4N/W for ``on`` seconds, silence for ``off`` seconds, repeated."""
    out: list[float] = []
    t = 0.0
    while t < horizon:
        out += poisson(rng, 4 * limit / window, t, min(t + on, horizon))
        t += on + off
    return out


@dataclass(frozen=True)
class Scenario:
    name: str
    limit: int
    window: int
    arrivals: tuple[float, ...]


def scenarios(scale: float = 1.0, seed: int = SEED) -> list[Scenario]:
    """The traffic patterns; ``scale`` shortens the simulated time (tests use 0.1)."""
    rng = random.Random(seed)
    n, w = 100, 60
    hour = 3600 * scale
    day = 86400
    days = max(1, round(3 * scale))
    day_traffic = sorted(
        # A quiet day, a burst straddling its end, then two days of Poisson at twice the rate.
        edge_bursts(1000, day, 2 * day, 60)
        + poisson(rng, 2 * 1000 / day, day + 3600, days * day + 3600)
    )
    return [
        Scenario("burst on window edges", n, w, tuple(edge_bursts(n, w, hour, 2))),
        Scenario("random bursts", n, w, tuple(random_bursts(rng, n, w, hour, int(30 * scale)))),
        Scenario("Poisson at 0.9x the limit", n, w, tuple(poisson(rng, 0.9 * n / w, 0, hour))),
        Scenario("Poisson at 2x the limit", n, w, tuple(poisson(rng, 2 * n / w, 0, hour))),
        Scenario("on/off (20 s at 4x, 25 s off)", n, w, tuple(on_off(rng, n, w, hour, 20, 25))),
        Scenario(f"1000/d, {days} days: edge burst + Poisson 2x", 1000, day, tuple(day_traffic)),
    ]


# -- measurement ----------------------------------------------------------------------------


def max_in_window(times: Sequence[float], window: float) -> int:
    """The most timestamps (sorted) in any half-open window ``(t - window, t]``."""
    best = lo = 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


@dataclass
class Result:
    scenario: str
    limiter: str
    limit: int
    offered: int
    admitted: int
    max_window: int
    reference: int  # admitted by the exact log with the same counting rule
    ideal: int  # admitted by the ideal sliding log

    @property
    def within_limit(self) -> bool:
        return self.max_window <= self.limit


def simulate(
    scenario: Scenario, make: Callable[[int, int], list[Limiter]] = limiters
) -> list[Result]:
    results = []
    admitted: dict[str, int] = {}
    rows = []
    for limiter in make(scenario.limit, scenario.window):
        times = [t for t in scenario.arrivals if limiter.allow(t)]
        admitted[limiter.name] = len(times)
        rows.append((limiter, len(times), max_in_window(times, scenario.window)))
    ideal = admitted[SlidingLog.name]
    for limiter, count, worst in rows:
        reference = admitted[SlidingLogAll.name] if limiter.counts_rejected else ideal
        results.append(
            Result(
                scenario.name,
                limiter.name,
                scenario.limit,
                len(scenario.arrivals),
                count,
                worst,
                reference,
                ideal,
            )
        )
    return results


def run(scale: float = 1.0, seed: int = SEED) -> list[Result]:
    return [r for s in scenarios(scale, seed) for r in simulate(s)]


def render(results: list[Result]) -> str:
    from bench.common import table

    headers = [
        "traffic",
        "limiter",
        "offered",
        "admitted",
        "max in any W",
        "<= N",
        "/ ideal log",
        "/ same-rule log",
    ]
    rows = [
        [
            r.scenario if i == 0 or results[i - 1].scenario != r.scenario else "",
            r.limiter,
            r.offered,
            r.admitted,
            r.max_window,
            "yes" if r.within_limit else f"NO ({r.max_window / r.limit:.2f}N)",
            f"{r.admitted / r.ideal:.3f}" if r.ideal else "-",
            f"{r.admitted / r.reference:.3f}" if r.reference else "-",
        ]
        for i, r in enumerate(results)
    ]
    title = (
        "Most admitted in any window of length W (N = 100 per 60 s unless stated; simulated time)"
    )
    return table(title, headers, rows)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="simulated time factor")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    results = run(args.scale, args.seed)
    print(render(results))
    return results


if __name__ == "__main__":
    main()
