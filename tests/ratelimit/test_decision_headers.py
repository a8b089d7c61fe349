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


@pytest.mark.parametrize(
    "value",
    [
        '"login-ip:5/m";r=0;t=17',
        "12",
        "",
        'é "café:5/m";q=5;w=60',
        "名前",
        "bad\r\nInjected: 1",
        "a\nb",
    ],
)
@pytest.mark.parametrize("keep", [False, True])
def test_our_headers_are_kept_as_djangos_own_setting_keeps_them(value: str, keep: bool) -> None:
    """put_headers writes ASCII values without line breaks into the headers' own dict, and
    sets any other through Django: the response's headers are what Django's own
    ``response[name] = value`` makes, or the same error (a line break), whatever the value."""
    from django.http import BadHeaderError, HttpResponse

    from ratelimit_app.engine.responses import put_headers

    def made(how: str) -> object:
        response = HttpResponse("x", status=429)
        response["RateLimit"] = "the view's own"
        try:
            if how == "ours":
                put_headers(response, {"RateLimit": value, "Retry-After": value}, keep=keep)
            else:
                for name in ("RateLimit", "Retry-After"):
                    if not keep or name not in response:
                        response[name] = value
        except BadHeaderError as exc:
            return type(exc)
        return sorted(response.headers._store.items())  # type: ignore[attr-defined]

    assert made("ours") == made("django's")


def test_headers_kept_otherwise_are_set_through_django() -> None:
    """A response whose headers are no dict of Django's (a project's own class) gets ours
    through its own ``__setitem__``."""
    from django.http import HttpResponse

    from ratelimit_app.engine.responses import put_headers

    class Headers(dict[str, str]):
        _store = None

    class Response(HttpResponse):
        def __init__(self) -> None:
            super().__init__("x")
            self.set: list[tuple[str, str]] = []

        def __setitem__(self, name: str, value: str) -> None:
            self.set.append((name, value))

    response = Response()
    response.headers = Headers()  # type: ignore[assignment]
    put_headers(response, {"RateLimit": "x;r=1;t=2"})
    assert response.set == [("RateLimit", "x;r=1;t=2")]
