"""Cost-weighted hits (docs/operators.rst, "Cost"): a request that counts several hits, at
every door (settings rules, ``@ratelimit``, ``get_usage`` / ``is_ratelimited``, DRF), and
``ratelimit_app.charge`` after the view; on local memory, real memcached and real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path

import ratelimit_app
from ratelimit_app import checks, core
from ratelimit_app.algorithms import gcra, windows
from ratelimit_app.algorithms.rates import Rate
from ratelimit_app.config import limits, rules
from ratelimit_app.decorators import ratelimit, registry
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE, RoundTrips

T0 = 1_800_000_000.0
LEAKY = gcra.LEAKY_BUCKET


def by_items(group: str, request: HttpRequest) -> int:
    """A cost from the request: ``?items=n`` (0: not limited)."""
    return int(request.GET.get("items", "1"))


@ratelimit(group="cost-fixed", key="ip", rate="10/m", cost=3)
def fixed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(group="cost-callable", key="ip", rate="10/m", cost=by_items)
def by_request(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(group="cost-charged", key="ip", rate="10/m")
def charged(request: HttpRequest) -> HttpResponse:
    used = int(request.GET.get("used", "0"))
    return HttpResponse(str(ratelimit_app.charge(request, used)))


@ratelimit(group="cost-leaky", key="ip", rate="10/m", algorithm=LEAKY, cost=4)
def leaky(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def plain(request: HttpRequest) -> HttpResponse:
    used = int(request.GET.get("used", "0"))
    return HttpResponse(str(ratelimit_app.charge(request, used)) if used else "ok")


urlpatterns = [
    path("fixed/", fixed),
    path("by-request/", by_request),
    path("charged/", charged),
    path("leaky/", leaky),
    path("export/", plain),
    path("login/", plain),
]

pytestmark = pytest.mark.urls(__name__)
#: A test of a door: on local memory, real memcached and real Redis.
on_every_backend = pytest.mark.usefixtures("backend_kind")


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    forget_refusals()
    yield
    forget_refusals()


def statuses(client: Client, url: str, n: int, **extra: Any) -> list[int]:
    return [client.get(url, **extra).status_code for _ in range(n)]


# -- the arithmetic --------------------------------------------------------------------------


def test_a_costly_hit_fits_only_where_it_has_room() -> None:
    """Pure: ``windows.evaluate`` of a window of 10 holding 7 events, one bucket."""
    p = windows.plan((Rate(10, 60),), T0, 1)  # one bucket a window: the current one written
    values = [0] * len(p.reads)
    fine = p.reads.index(p.writes[0][0])
    values[fine] = 7
    look3, look4 = (windows.evaluate(p, values, T0, cost=c)[0] for c in (3, 4))
    assert (look3.limited, look4.limited) == (False, True)
    values[fine] = 11  # 7 + a counted hit of cost 4: over, taken back
    refused = windows.evaluate(p, values, T0, counted=True, cost=4)[0]
    assert refused.limited and refused.count == 11
    assert 0 < refused.retry_after <= 120  # until the 7 leave (a bucket later): 4 fit


def test_a_cost_over_the_whole_limit_waits_a_window_and_never_fits() -> None:
    p = windows.plan((Rate(3, 60),), T0, 60)
    usage = windows.evaluate(p, [0] * len(p.reads), T0, cost=5)[0]
    assert usage.limited and usage.retry_after == 60.0
    m = gcra.meter((Rate(3, 60),))
    state = gcra.evaluate(m, None, gcra.micros(T0), True, cost=5)
    assert state.limited and not state.admitted and state.retry_after == 60.0


def test_a_leaky_bucket_takes_cost_as_emissions() -> None:
    m = gcra.meter((Rate(10, 60),))  # one emission every 6 s, capacity 10
    now = gcra.micros(T0)
    tat = None
    admitted = []
    for _ in range(3):
        state = gcra.evaluate(m, tat, now, True, cost=4)
        admitted.append(state.admitted)
        tat = state.tat
    assert admitted == [True, True, False]  # 4 + 4 fit in 10; 12 do not
    assert state.retry_after == pytest.approx(12.0)  # two more emissions must leak


# -- every door ------------------------------------------------------------------------------


@on_every_backend
def test_a_decorator_counts_its_cost(client: Client) -> None:
    with frozen_clock(T0):
        assert statuses(client, "/fixed/", 5) == [200, 200, 200, 429, 429]
        usage = core.get_usage(RequestFactory().get("/"), "cost-fixed", key="ip", rate="10/m")
    assert usage is not None and usage["count"] == 9  # refused hits counted nowhere


@on_every_backend
def test_a_callable_cost_weighs_each_request(client: Client) -> None:
    with frozen_clock(T0):
        assert client.get("/by-request/?items=6").status_code == 200
        assert client.get("/by-request/?items=5").status_code == 429  # 11 > 10
        assert client.get("/by-request/?items=4").status_code == 200  # 10: fits
        assert client.get("/by-request/?items=0").status_code == 200  # free: not limited
        assert client.get("/by-request/?items=1").status_code == 429


def test_a_callable_cost_that_answers_nonsense_names_the_limit(client: Client) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"cost-callable.*-2"):
        client.get("/by-request/?items=-2")


@on_every_backend
def test_get_usage_and_is_ratelimited_take_a_cost(rf: RequestFactory) -> None:
    request = rf.get("/")
    with frozen_clock(T0):
        first = core.get_usage(request, "g-cost", key="ip", rate="5/m", increment=True, cost=2)
        assert first is not None and (first["count"], first["remaining"]) == (2, 3)
        args = {"key": "ip", "rate": "5/m", "cost": 4}
        assert core.is_ratelimited(request, "g-cost", **args)  # a look: 2 + 4 > 5
        assert not core.is_ratelimited(request, "g-cost", **{**args, "cost": 3})


@on_every_backend
def test_a_settings_rule_counts_its_cost(client: Client) -> None:
    rule = {"name": "export", "path": "/export/", "key": "ip", "rate": "10/m", "cost": 5}
    with override_settings(MIDDLEWARE=MIDDLEWARE, RATELIMIT_RULES=[rule]), frozen_clock(T0):
        answers = [client.get("/export/") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert int(answers[-1]["Retry-After"]) >= 1


@on_every_backend
def test_a_leaky_bucket_decorator_takes_cost_as_emissions(client: Client) -> None:
    with frozen_clock(T0) as clock:
        assert statuses(client, "/leaky/", 3) == [200, 200, 429]
        clock.advance(12)  # two emissions leaked: room for 4
        assert statuses(client, "/leaky/", 2) == [200, 429]


# -- charge ----------------------------------------------------------------------------------


@on_every_backend
def test_a_charge_refuses_the_next_requests_not_this_one(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    with frozen_clock(T0):
        assert client.get("/charged/").status_code == 200
        trips = RoundTrips(monkeypatch)
        answer = client.get("/charged/?used=12")  # far over: it is not failed for that
        assert (answer.status_code, answer.content) == (200, b"1")
        assert trips.count == 2  # the check, then the charge: one round trip more
        assert statuses(client, "/charged/", 2) == [429, 429]
        usage = core.get_usage(RequestFactory().get("/"), "cost-charged", key="ip", rate="10/m")
    assert usage is not None and usage["count"] == 14


@on_every_backend
def test_a_charge_adds_to_every_layer_once_and_passes_failure_only_rules(client: Client) -> None:
    export = {"name": "export", "path": "/charged/", "key": "ip", "rate": "100/m"}
    failures = {**export, "name": "failures", "count": "failures"}
    settings = override_settings(MIDDLEWARE=MIDDLEWARE, RATELIMIT_RULES=[export, failures])
    with settings, frozen_clock(T0):
        answer = client.get("/charged/?used=4")
        assert answer.content == b"2"  # the rule and the decorator; not the failures
        lookup = {name: core.lookup(name, "127.0.0.1") for name in ("export", "failures")}
    assert lookup["export"] is not None and lookup["export"]["count"] == 5
    assert lookup["failures"] is None or lookup["failures"]["count"] == 0


@on_every_backend
def test_a_charge_fills_a_leaky_bucket_past_its_capacity(rf: RequestFactory) -> None:
    request = rf.get("/")
    with frozen_clock(T0):
        args: dict[str, Any] = {"key": "ip", "rate": "10/m", "algorithm": LEAKY}
        core.get_usage(request, "g-leaky-charge", increment=True, **args)
        assert ratelimit_app.charge(request, 30) == 1
        usage = core.get_usage(rf.get("/"), "g-leaky-charge", **args)
    assert usage is not None and usage["should_limit"] and usage["level"] == pytest.approx(31)


@on_every_backend
def test_charge_without_a_limit_or_of_nothing_does_nothing(
    rf: RequestFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = RoundTrips(monkeypatch)
    assert ratelimit_app.charge(rf.get("/"), 5) == 0
    request = rf.get("/")
    core.get_usage(request, "g-nothing", key="ip", rate="5/m", increment=True)
    assert ratelimit_app.charge(request, 0) == 0
    assert trips.count == 1  # the check alone


@pytest.mark.parametrize("hits", [-1, 1.5, "3", True, None, 10**9 + 1])
def test_charge_refuses_what_is_no_number_of_hits(rf: RequestFactory, hits: Any) -> None:
    with pytest.raises(ValueError, match="integer from 0 to"):
        ratelimit_app.charge(rf.get("/"), hits)


@on_every_backend
def test_a_charge_the_backend_cannot_take_is_reported_not_raised(
    rf: RequestFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ratelimit_app.backends import get_backend
    from ratelimit_app.exceptions import BackendError

    request = rf.get("/")
    core.get_usage(request, "g-down", key="ip", rate="5/m", increment=True)

    def down(ops: Any, now_us: int) -> Any:
        raise BackendError("rl: down")

    monkeypatch.setattr(get_backend(), "execute", down)
    assert ratelimit_app.charge(request, 3) == 1
    assert "down" in caplog.text


# -- configuration mistakes ------------------------------------------------------------------


@pytest.mark.parametrize("cost", [0, -1, True, 2.5, "five", 10**10])
def test_a_rule_with_a_bad_cost_names_the_field(cost: Any) -> None:
    raw = {"name": "r", "path": "/", "key": "ip", "rate": "5/m", "cost": cost}
    with pytest.raises(rules.RuleError, match="field 'cost'"):
        rules.parse_rule(raw, trusted=isinstance(cost, str) is False)


def test_a_database_rule_takes_no_cost_from_code() -> None:
    raw = {"name": "r", "path": "/", "key": "ip", "rate": "5/m", "cost": "app.cost"}
    with pytest.raises(rules.RuleError, match="integer cost"):
        rules.parse_rule(raw, trusted=False)


def test_a_literal_cost_over_the_limit_is_flagged_where_it_is_written() -> None:
    over = {"name": "over", "path": "/", "key": "ip", "rate": "5/m;100/d", "cost": 6}
    fine = {"name": "fine", "path": "/a/", "key": "ip", "rate": "5/m", "cost": 5}
    code = {"name": "code", "path": "/b/", "key": "ip", "rate": "5/m", "cost": by_items}
    with override_settings(RATELIMIT_RULES=[over, fine, code]):
        found = [m for m in checks.check_rules() if m.id == "ratelimit_app.W011"]
    assert [m.msg.split(" refused. ", 1)[1] for m in found] == [
        "rule:over: cost 6 is over rate 5/m (5): every request is refused."
    ]

    @ratelimit(key="ip", rate="2/m", cost=3)
    def too_dear(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    try:
        messages = [m for m in checks.check_decorators() if m.id == "ratelimit_app.W011"]
        assert any("too_dear" in m.msg and "cost 3" in m.msg for m in messages)
    finally:
        registry.pop(core.group_name(too_dear), None)


def test_a_leaky_bucket_cost_is_weighed_against_its_capacity() -> None:
    assert limits.build("g", "ip", "10/m", algorithm=LEAKY, burst=3, cost=4).cost_problem()
    assert limits.build("g", "ip", "10/m", algorithm=LEAKY, burst=4, cost=4).cost_problem() is None


@on_every_backend
def test_the_largest_charge_fills_a_leaky_bucket_for_at_most_366_days(
    rf: RequestFactory,
) -> None:
    """Past the bucket's capacity a charge is kept, never lost (a memcached TTL or a Redis
    number it could not hold would forget it: lenient)."""
    request = rf.get("/")
    args: dict[str, Any] = {"key": "ip", "rate": "1/d", "algorithm": LEAKY}
    with frozen_clock(T0) as clock:
        core.get_usage(request, "g-leaky-most", increment=True, **args)
        assert ratelimit_app.charge(request, 10**9) == 1
        usage = core.get_usage(rf.get("/"), "g-leaky-most", **args)
        assert usage is not None and usage["should_limit"]
        assert 365 * 86400 < usage["retry_after"] <= 366 * 86400
        clock.advance(30 * 86400)
        later = core.get_usage(rf.get("/"), "g-leaky-most", **args)
    assert later is not None and later["should_limit"]
