"""The RateLimit headers made from decided limits say what the usage dicts say.

The middleware formats an admitted request's headers straight from the results
(:func:`ratelimit_app.engine.responses.decision_headers`); a refusal's 429, ``@ratelimit``'s
exception and projects' handlers format them from usage dicts
(:func:`ratelimit_app.engine.responses.ratelimit_headers`). The two must never disagree.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_app.algorithms import gcra, windows
from ratelimit_app.algorithms.rates import normalize
from ratelimit_app.config import limits
from ratelimit_app.config.policy import policy
from ratelimit_app.engine import Result, meter_result, usage_dict
from ratelimit_app.engine.enforce import Decision
from ratelimit_app.engine.responses import decision_headers, ratelimit_headers

RATES = ["5/m", "10/m;100/h", "3/s;50/m;1000/d", "1/h"]


def usage(rate: object, count: int, retry: float, reset: float, limit: int) -> windows.Usage:
    return windows.Usage(rate, count, max(0, limit - count), count > limit, retry, reset)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    spec=st.sampled_from(RATES),
    label=st.sampled_from(["login-ip", None, 'odd "name"']),
    counts=st.lists(st.integers(0, 2000), min_size=3, max_size=3),
    waits=st.lists(st.floats(0, 90000, allow_nan=False), min_size=6, max_size=6),
)
def test_the_windows_headers_match_the_usage_dicts(
    spec: str, label: str | None, counts: list[int], waits: list[float]
) -> None:
    limit = limits.build("g", "ip", spec)
    rates = limit.static_rates
    assert rates is not None
    usages = [
        usage(r, counts[i], waits[2 * i], waits[2 * i + 1], r.count) for i, r in enumerate(rates)
    ]
    result = Result(usages, "{ns}")
    check = limits.Check("scope", ("ip", "192.0.2.1"), rates, True)
    d = Decision(policy(limit, name=label, fail_open=True), check)
    d.result = result
    assert decision_headers([d]) == ratelimit_headers([(label, usage_dict(result))])


@pytest.mark.parametrize("level_us", [0, 1, 10**6, 4 * 10**6])
def test_a_leaky_buckets_headers_match_its_usage_dict(level_us: int) -> None:
    limit = limits.build("g", "ip", "2/s", algorithm=gcra.LEAKY_BUCKET, burst=7)
    rates = normalize("2/s")
    meter = gcra.meter(rates, 7)
    now = 10**12
    state = gcra.outcome(
        meter, None if not level_us else gcra.advance(meter, None, now), None, now + 1, False
    )
    result = meter_result(state, "{ns}")
    check = limits.Check("scope", ("ip", "192.0.2.1"), rates, True, gcra.LEAKY_BUCKET, 7)
    d = Decision(policy(limit, name="bucket", fail_open=True), check)
    d.result = result
    assert decision_headers([d]) == ratelimit_headers([("bucket", usage_dict(result))])
