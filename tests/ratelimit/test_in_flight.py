"""In-flight limits (docs/operators.rst, "Requests in flight"): a rule's ``"concurrent"`` and
``@ratelimit(concurrent=...)``, on local memory, real memcached and real Redis. Requests run
side by side in threads, held inside the view until the test lets them go."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.test import Client, override_settings
from django.urls import path

import ratelimit_app
from ratelimit_app.algorithms.rates import Slots
from ratelimit_app.config import limits, rules
from ratelimit_app.decorators import ratelimit
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE, RoundTrips

T0 = 1_800_000_000.0


class Gate:
    """Holds requests inside a view until opened; counts those inside."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.inside = 0
        self.most = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            assert self.open.wait(10), "the test never opened the gate"
        finally:
            with self.lock:
                self.inside -= 1


GATE = Gate()


def held(request: HttpRequest) -> HttpResponse:
    GATE()
    return HttpResponse("ok")


def failing(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the view failed")


def streamed(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(iter([b"a", b"b"]))


@ratelimit(key="ip", concurrent=2)
def decorated(request: HttpRequest) -> HttpResponse:
    GATE()
    return HttpResponse("ok")


@ratelimit(key="ip", rate="100/m", concurrent=1, lease="5s")
def decorated_failing(request: HttpRequest) -> HttpResponse:
    if request.GET.get("fail"):
        raise RuntimeError("the view failed")
    if request.GET.get("stream"):
        return StreamingHttpResponse(iter([b"a", b"b"]))
    return HttpResponse("ok")


urlpatterns = [
    path("held/", held),
    path("failing/", failing),
    path("streamed/", streamed),
    path("decorated/", decorated),
    path("decorated-failing/", decorated_failing),
]

pytestmark = pytest.mark.urls(__name__)
on_every_backend = pytest.mark.usefixtures("backend_kind")


def rule(path: str = "/held/", **fields: Any) -> dict[str, Any]:
    return {"name": "inflight", "path": path, "key": "ip", "concurrent": 2, **fields}


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    global GATE
    GATE = Gate()
    forget_refusals()
    with override_settings(MIDDLEWARE=MIDDLEWARE):
        yield
    GATE.open.set()
    forget_refusals()


def crowd(url: str, n: int) -> list[Any]:
    """``n`` requests at once from one address; returns the answers once the gate opens.
    The gate opens when every request that got in is inside and the others are answered."""
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(Client().get, url) for _ in range(n)]
        deadline = time.monotonic() + 10
        # The refused ones come back while the others wait inside.
        while sum(f.done() for f in futures) + GATE.inside < n:
            assert time.monotonic() < deadline, "requests neither refused nor inside"
            time.sleep(0.005)
        GATE.open.set()
        return [f.result(timeout=10) for f in futures]


# -- the limit -------------------------------------------------------------------------------


def test_a_place_is_a_rate_of_its_own() -> None:
    both = limits.build("g", "ip", "5/m", concurrent=2, lease="30s")
    assert both.inflight is not None and both.inflight.static_rates == (Slots(2, 30),)
    assert both.inflight.static_scope != both.static_scope
    alone = rules.parse_rule({"name": "a", "path": "/", "key": "ip", "concurrent": 3})
    assert alone.limit.static_rates == (Slots(3, 60),) and alone.holds
    assert alone.describe()["concurrent"] == 3 and alone.describe()["lease"] == "60s"
    assert Slots(2, 30) != limits.build("g", "ip", "2/30s").static_rates[0]


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"concurrent": 0}, "concurrent", "integer from 1"),
        ({"concurrent": "5"}, "concurrent", "integer from 1"),
        ({"concurrent": 2, "lease": "2h"}, "lease", "from 1s to 1h"),
        ({"concurrent": 2, "lease": "soon"}, "lease", "such as '5s'"),
        ({"lease": "30s", "rate": "5/m"}, "lease", "set concurrent too"),
    ],
)
def test_a_bad_in_flight_limit_names_the_field(
    fields: dict[str, Any], field: str, words: str
) -> None:
    raw = {"name": "r", "path": "/", "key": "ip", **fields}
    with pytest.raises(rules.RuleError) as caught:
        rules.parse_rule(raw)
    assert any(e.field == field and words in e.problem for e in caught.value.errors)


# -- at most N inside, places given back -----------------------------------------------------


@on_every_backend
def test_a_rule_lets_n_requests_in_at_once(backend_kind: str) -> None:
    with override_settings(RATELIMIT_RULES=[rule()]):
        answers = crowd("/held/", 4)
        assert sorted(a.status_code for a in answers) == [200, 200, 429, 429]
        refused = next(a for a in answers if a.status_code == 429)
        assert refused["Retry-After"] == "1"
        assert GATE.most == 2
        forget_refusals()  # the refusal is remembered for its second; then
        again = crowd("/held/", 2)  # every place was given back
    assert [a.status_code for a in again] == [200, 200]


@on_every_backend
def test_a_decorator_lets_n_requests_in_at_once(backend_kind: str) -> None:
    answers = crowd("/decorated/", 3)
    assert sorted(a.status_code for a in answers) == [200, 200, 429]
    assert GATE.most == 2


@on_every_backend
def test_an_admitted_request_costs_one_round_trip_more(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    GATE.open.set()
    both = rule(rate="100/m")
    with override_settings(RATELIMIT_RULES=[both]):
        trips = RoundTrips(monkeypatch)
        assert Client().get("/held/").status_code == 200
    assert trips.count == 2  # the check (rate and place together), then the place back


@on_every_backend
def test_a_place_comes_back_after_an_exception(backend_kind: str) -> None:
    client = Client(raise_request_exception=False)
    with override_settings(RATELIMIT_RULES=[rule("/failing/", concurrent=1)]):
        assert [client.get("/failing/").status_code for _ in range(3)] == [500] * 3
    for _ in range(3):
        with pytest.raises(RuntimeError):
            Client().get("/decorated-failing/?fail=1")
    assert Client().get("/decorated-failing/").status_code == 200


@on_every_backend
@pytest.mark.django_db  # closing a response tells Django the request finished
def test_a_streaming_response_holds_its_place_until_it_is_closed(backend_kind: str) -> None:
    with override_settings(RATELIMIT_RULES=[rule("/streamed/", concurrent=1)]):
        first = Client().get("/streamed/")
        assert first.status_code == 200
        assert Client().get("/streamed/").status_code == 429  # still streaming
        forget_refusals()
        assert b"".join(first.streaming_content) == b"ab"  # the stream ends: place back
        first.close()
        assert Client().get("/streamed/").status_code == 200
    stream = Client().get("/decorated-failing/?stream=1")
    assert Client().get("/decorated-failing/").status_code == 429
    forget_refusals()
    stream.close()
    assert Client().get("/decorated-failing/").status_code == 200


@on_every_backend
@pytest.mark.django_db  # closing a response tells Django the request finished
def test_a_place_never_given_back_comes_back_after_the_lease(backend_kind: str) -> None:
    """A worker that died holding a place: its stream is never closed."""
    settings = override_settings(RATELIMIT_RULES=[rule("/streamed/", concurrent=1, lease="5s")])
    with settings, frozen_clock(T0) as clock:
        lost = Client().get("/streamed/")
        assert Client().get("/streamed/").status_code == 429
        clock.advance(3)
        forget_refusals()
        assert Client().get("/streamed/").status_code == 429
        clock.advance(3)  # past the lease (and its last fine bucket)
        forget_refusals()
        back = Client().get("/streamed/")
    assert back.status_code == 200
    lost.close()
    back.close()


@on_every_backend
def test_a_dry_run_lets_everyone_in_and_counts_as_enforcing(backend_kind: str) -> None:
    with override_settings(RATELIMIT_RULES=[rule(shadow=True)]):
        answers = crowd("/held/", 3)
    assert [a.status_code for a in answers] == [200] * 3 and GATE.most == 3


@on_every_backend
def test_an_admitted_response_does_not_show_the_places(backend_kind: str) -> None:
    GATE.open.set()
    with override_settings(RATELIMIT_RULES=[rule(rate="100/m")]):
        answer = Client().get("/held/")
    assert "in flight" not in answer.get("RateLimit-Policy", "")
    assert "100/m" in answer["RateLimit-Policy"]


@on_every_backend
def test_a_charge_passes_places_by(backend_kind: str) -> None:
    GATE.open.set()
    request = HttpRequest()
    request.META["REMOTE_ADDR"] = "192.0.2.9"
    request.method = "GET"
    from ratelimit_app.config.policy import policy
    from ratelimit_app.core import limit_verdict

    lim = limits.build("g-charge", "ip", "10/m", concurrent=2)
    verdict = limit_verdict(request, policy(lim), True)
    assert verdict is not None and len(verdict.decisions) == 2
    assert ratelimit_app.charge(request, 3) == 1  # the rate, not the place
