"""Property tests: every query answer equals a brute-force count of the recorded events.

Hypothesis drives a random history of records (at random past times), flushes, clock jumps
and downsampling runs; the model is the plain list of events. After each step and at the end,
``query.series`` (any range, any step it accepts, or the default step), ``query.total`` and
the stored sums must match the model exactly, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.cache import cache
from django.test.utils import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metrics_app
from metrics_app import buffer, query, rollup
from metrics_app.conf import conf
from metrics_app.models import Bucket, FlushLedger, Series
from metrics_app.retention import align
from metrics_app.testing import frozen_clock

pytestmark = [pytest.mark.db_matrix, pytest.mark.django_db]

HOUR, DAY, WEEK = 3600, 86400, 604800
RETENTIONS = {
    # Small tiers so that a few simulated days exercise every fold and the expiry.
    "1m:1h,5m:3h,1h:1d,1d:4d": 6 * DAY,
    "1m:2h,1h:1w,1w:4w": 6 * WEEK,
    "1m:1d,5m:2d,1h:31d,1w:1y": 60 * DAY,
}
START = datetime(2024, 3, 6, 12, 0, tzinfo=UTC).timestamp()

NAMES = ("a", "b")


@dataclass
class Model:
    buffered: list[tuple[str, float, int]] = field(default_factory=list)
    stored: list[tuple[str, float, int]] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)

    def flush(self) -> None:
        for name, _t, count in self.buffered:
            self.totals[name] = self.totals.get(name, 0) + count
        self.stored += self.buffered
        self.buffered = []

    def expire(self, now: float) -> None:
        cutoff = conf.RETENTION.expiry_cutoff(now)
        self.stored = [e for e in self.stored if e[1] >= cutoff]

    def count(self, name: str, lo: float, hi: float) -> int:
        return sum(c for n, t, c in self.stored if n == name and lo <= t < hi)


def op_strategy(span: int) -> st.SearchStrategy[tuple]:
    return st.one_of(
        st.tuples(
            st.just("record"),
            st.sampled_from(NAMES),
            st.integers(0, span),
            st.integers(1, 5),
        ),
        st.tuples(st.just("flush")),
        st.tuples(st.just("advance"), st.integers(1, span // 3)),
        st.tuples(st.just("downsample")),
    )


def apply(op: tuple[Any, ...], model: Any, clock: Any, data: Any) -> None:
    """Run one operation on the real app and on the brute-force model alike."""
    if op[0] == "record":
        _, name, t, count = op
        metrics_app.record(name, count, at=t)
        model.buffered.append((name, t, count))
    elif op[0] == "flush":
        metrics_app.flush()
        model.flush()
    elif op[0] == "advance":
        clock.advance(op[1])
    else:
        rollup.downsample(batch_size=data.draw(st.sampled_from([3, 1000])))
        model.expire(clock.t)


def check_queries(
    model: Model, now: float, span: int, data: st.DataObject, near: tuple[int, int] | None = None
) -> None:
    """Query each series once over a drawn range (inside ``near``, if given) and step."""
    retention = conf.RETENTION
    ages = {tier.precision: tier.age for tier in retention.tiers}
    for name in NAMES:
        assert query.total(name) == model.totals.get(name, 0)
        stored = sum(Bucket.objects.filter(series__name=name).values_list("count", flat=True))
        assert stored == model.count(name, 0, float("inf"))
        if near is None:
            lo = data.draw(st.integers(int(now) - span - WEEK, int(now)), label="lo")
            hi = data.draw(st.integers(lo + 1, int(now) + HOUR), label="hi")
        else:
            lo = data.draw(st.integers(*near), label="lo")
            hi = data.draw(st.integers(lo + 1, max(lo + 1, near[1])), label="hi")
        step = data.draw(
            st.one_of(
                st.none(),
                st.sampled_from(retention.precisions),
                st.sampled_from(retention.precisions).map(lambda p: 2 * p),
            ),
            label="step",
        )
        start = datetime.fromtimestamp(lo, tz=UTC)
        end = datetime.fromtimestamp(hi, tz=UTC)
        try:
            points = query.series(name, start, end, step=step)
        except ValueError:
            assert step is not None  # the default step is always answerable
            # A tier's age is a minimum: inside it, the tier's step is always answerable.
            assert not (step in ages and lo >= now - ages[step]), (lo, now, step)
            # Buckets are whole: the answer would cover [align(lo), the end of the bucket
            # holding hi - 1), and some row there does not fit the step.
            widest = max(retention.precisions)
            out_lo, out_hi = align(lo, step), align(hi - 1, step) + step
            resolutions = Bucket.objects.filter(
                series__name=name, start__lt=out_hi, start__gt=out_lo - widest
            ).values_list("resolution", "start")
            assert any(step % r and s + r > out_lo for r, s in resolutions)
            continue
        size = int((points[1][0] - points[0][0]).total_seconds()) if len(points) > 1 else None
        if step is not None and size is not None:
            assert size == step
        assert points[0][0].timestamp() <= lo
        assert points[-1][0].timestamp() < hi
        width = size or step
        if width is None:  # a single bucket: its width is the default step
            continue
        first = points[0][0].timestamp()
        assert first == align(first, width)
        expected: dict[float, int] = {}
        for n, t, c in model.stored:
            if n == name and first <= t < first + width * len(points):
                key = float(align(t, width))
                expected[key] = expected.get(key, 0) + c
        got = {when.timestamp(): c for when, c in points if c}
        assert got == expected, width


@pytest.mark.parametrize("retention", list(RETENTIONS))
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), offset=st.integers(0, WEEK))
def test_queries_match_brute_force(retention: str, data: st.DataObject, offset: int) -> None:
    span = RETENTIONS[retention]
    Bucket.objects.all().delete()
    Series.objects.all().delete()
    FlushLedger.objects.all().delete()
    buffer.reset()
    cache.clear()
    model = Model()
    ops = data.draw(st.lists(op_strategy(span), min_size=1, max_size=15), label="ops")
    with override_settings(METRICS_RETENTION=retention), frozen_clock(START + offset) as clock:
        for op in [*ops, ("flush",), ("downsample",)]:
            if op[0] == "record":  # recorded "ago" seconds before the clock
                op = ("record", op[1], clock.t - op[2], op[3])
            apply(op, model, clock, data)
        check_queries(model, clock.t, span, data)


#: (retention, index of a tier but the last) pairs: every fold of every test retention.
SPLITS = [(text, index) for text in RETENTIONS for index in range(text.count(",")) if text]


@pytest.mark.parametrize(("retention", "index"), SPLITS)
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_split_periods_match_brute_force(retention: str, index: int, data: st.DataObject) -> None:
    """The clock is set so tier ``index``'s fold cutoff falls inside a coarse period.

    Events on both sides of the cutoff leave that period split between a coarse row (older
    part) and finer rows (younger part); every query near it, at every step, must still match
    the brute-force count, and later records, flushes, clock moves and runs too.
    """
    span = RETENTIONS[retention]
    Bucket.objects.all().delete()
    Series.objects.all().delete()
    FlushLedger.objects.all().delete()
    buffer.reset()
    cache.clear()
    with override_settings(METRICS_RETENTION=retention):
        tiers = conf.RETENTION.tiers
    fine, coarse, age = tiers[index].precision, tiers[index + 1].precision, tiers[index].age
    period = align(START - age, coarse)
    cut = period + fine * data.draw(st.integers(1, coarse // fine - 1), label="fine buckets")
    now = cut + age + data.draw(st.integers(0, fine - 1), label="seconds")
    model = Model()
    with override_settings(METRICS_RETENTION=retention), frozen_clock(now) as clock:
        assert conf.RETENTION.fold_cutoff(index, now) == cut
        forced = [("a", cut - 1, 2), ("a", cut, 3)]
        extra = data.draw(
            st.lists(
                st.tuples(
                    st.sampled_from(NAMES),
                    st.integers(period - coarse, period + 2 * coarse - 1),
                    st.integers(1, 5),
                ),
                max_size=10,
            ),
            label="events near the split",
        )
        for name, t, count in [*forced, *extra]:
            metrics_app.record(name, count, at=t)
            model.buffered.append((name, t, count))
        metrics_app.flush()
        model.flush()
        rollup.downsample(batch_size=data.draw(st.sampled_from([1, 3, 1000])))
        model.expire(clock.t)
        rows = list(Bucket.objects.filter(series__name="a").values_list("resolution", "start"))
        assert (coarse, period) in rows, rows
        assert any(r < coarse and period <= t < period + coarse for r, t in rows), rows
        near = (period - coarse, period + 2 * coarse)
        check_queries(model, clock.t, span, data, near)
        check_queries(model, clock.t, span, data)
        # Late writes on both sides of the split, and clock moves that fold it further.
        ops = data.draw(
            st.lists(
                st.one_of(
                    st.tuples(
                        st.just("record"),
                        st.sampled_from(NAMES),
                        st.integers(*near),
                        st.integers(1, 5),
                    ),
                    st.tuples(st.just("flush")),
                    st.tuples(st.just("advance"), st.integers(1, 3 * fine)),
                    st.tuples(st.just("downsample")),
                ),
                max_size=8,
            ),
            label="ops",
        )
        for op in [*ops, ("flush",), ("downsample",)]:
            apply(op, model, clock, data)
            check_queries(model, clock.t, span, data, near)
        check_queries(model, clock.t, span, data)
