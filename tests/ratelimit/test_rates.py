from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given
from hypothesis import strategies as st

from ratelimit_app import rates
from ratelimit_app.rates import Rate


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
    ],
)
def test_parse(spec: str, expected: list[tuple[int, int]]) -> None:
    assert [(r.count, r.seconds) for r in rates.parse(spec)] == expected


@pytest.mark.parametrize(
    "spec",
    ["10/M", "3/1.5m", "10 / m", "-1/m", "", "5", "5/", "/m", "5/0m", "5/m;", "5/w", "1/400d"],
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
