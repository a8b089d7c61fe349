from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from hypothesis import given
from hypothesis import strategies as st

from ratelimit_app.algorithms import rates
from ratelimit_app.algorithms.rates import Rate
from ratelimit_app.config import limits
from ratelimit_app.core import get_usage
from ratelimit_app.decorators import ratelimit


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("2/s", [(2, 1)]),
        ("5/m", [(5, 60)]),
        ("10/h", [(10, 3600)]),
        ("100/d", [(100, 86400)]),
        ("10/5m", [(10, 300)]),
        ("100/10s", [(100, 10)]),
        ("100/10", [(100, 10)]),  # django-ratelimit: no unit means seconds
        ("5/m;10/d", [(5, 60), (10, 86400)]),
        ("10/d; 5/m", [(5, 60), (10, 86400)]),
        ("0/m", [(0, 60)]),
        # The unit words django-ratelimit users write (it reads their first letter).
        ("5/s", [(5, 1)]),
        ("5/sec", [(5, 1)]),
        ("5/second", [(5, 1)]),
        ("5/seconds", [(5, 1)]),
        ("60/min", [(60, 60)]),
        ("10/minute", [(10, 60)]),
        ("10/minutes", [(10, 60)]),
        ("100/hour", [(100, 3600)]),
        ("100/hours", [(100, 3600)]),
        ("1000/day", [(1000, 86400)]),
        ("1000/days", [(1000, 86400)]),
        ("10/5min", [(10, 300)]),
        ("10/30seconds", [(10, 30)]),
        ("10/2hours", [(10, 7200)]),
        ("5/minute;100/days", [(5, 60), (100, 86400)]),
    ],
)
def test_parse(spec: str, expected: list[tuple[int, int]]) -> None:
    assert [(r.count, r.seconds) for r in rates.parse(spec)] == expected


@pytest.mark.parametrize(
    "spec",
    [
        *("10/M", "3/1.5m", "10 / m", "-1/m", "", "5", "5/", "/m", "5/0m", "5/m;", "5/w"),
        "1/400d",
        # Words are lower case and spelled out; django-ratelimit reads the first letter, so
        # to it '10/ms' and '10/mo' are ten a minute and '10/Minute' is ten a second.
        *("10/Minute", "10/MIN", "10/mins", "10/ms", "10/mo", "10/hr", "10/week", "10/5 min"),
        *("10/minute s", "10/sminute", "10/dayss"),
    ],
)
def test_parse_rejects_and_names_the_string(spec: str) -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        rates.parse(spec)
    assert repr(spec) in str(info.value)


def test_tuple_and_callable_and_dotted_path(rf: object) -> None:
    assert rates.resolve((3, 10), "g", None) == (Rate(3, 10),)
    assert rates.resolve(lambda group, request: "4/m", "g", None) == (Rate(4, 60),)
    assert rates.resolve(lambda group, request: None, "g", None) is None
    assert rates.resolve("tests.ratelimit.test_rates.rate_for", "grp", None) == (Rate(7, 3600),)
    with pytest.raises(ImproperlyConfigured):
        rates.resolve((3, 0), "g", None)
    with pytest.raises(ImproperlyConfigured):
        rates.resolve((3.0, 10), "g", None)  # type: ignore[arg-type]


def rate_for(group: str, request: object) -> str:
    assert group == "grp"
    return "7/h"


@given(st.integers(0, 10**9), st.integers(1, 366 * 86400))
def test_str_round_trips(count: int, seconds: int) -> None:
    rate = Rate(count, seconds)
    assert rates.parse(str(rate)) == (rate,)


@given(st.text(max_size=30))
def test_parse_never_raises_anything_else(spec: str) -> None:
    try:
        parsed = rates.parse(spec)
    except ImproperlyConfigured:
        return
    assert parsed and all(r.seconds > 0 and r.count >= 0 for r in parsed)


def test_a_unit_word_is_the_same_limit_as_its_letter() -> None:
    # One limit however it is spelled: the text (in usage dicts and headers) is canonical,
    # and so is the scope, so '5/minute' and '5/m' share their counters, as in
    # django-ratelimit (whose keys hold the rate as count/seconds).
    assert rates.parse("5/minute") == rates.parse("5/m") == rates.parse("5/60s")
    assert [r.text for r in rates.parse("10/5min;1000/day")] == ["10/5m", "1000/d"]
    assert limits.scope("g", "", rates.parse("5/minute")) == limits.scope(
        "g", "", rates.parse("5/m")
    )


def test_a_callable_may_return_a_unit_word(rf: Any, group: str) -> None:
    # The system checks cannot call a callable rate, so a word it returns is only seen on a
    # request: every request to such a view raised ImproperlyConfigured.
    @ratelimit(key="ip", rate=lambda group, request: "2/minute", group=group, block=False)
    def view(request: HttpRequest) -> bool:
        return bool(request.limited)  # type: ignore[attr-defined]

    assert [view(rf.get("/")) for _ in range(3)] == [False, False, True]
    usage = get_usage(rf.get("/"), group, key="ip", rate="2/m")  # the same counters
    assert usage is not None and usage["count"] == 2 and usage["rate"] == "2/m"
