"""``ratelimit_app.throttling`` behind real DRF views, on local memory, memcached and Redis."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rest_framework import throttling as drf
from rest_framework.settings import api_settings

from ratelimit_app import clock, core, throttling
from ratelimit_app.backends import get_backend, reset_backends
from ratelimit_app.engine.refusals import remembered as memory
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.signals import backend_failed, ratelimited
from ratelimit_app.testing import frozen_clock
from tests.drf.conftest import api_view, get, statuses
from tests.ratelimit.conftest import several_memcached

T0 = 1_800_000_000.0


def throttle(base: type, scope: str, rate: str | None = None, **attrs: Any) -> type:
    """A subclass of ``base`` with its own scope (and rate, unless from the settings)."""
    if rate is not None:
        attrs["rate"] = rate
    return type(f"Throttle_{scope}", (base,), {"scope": scope, **attrs})


class User:
    """A signed-in user as DRF's throttles see one."""

    is_authenticated = True

    def __init__(self, pk: int) -> None:
        self.pk = pk


# -- switching -------------------------------------------------------------------------------


def test_switching_is_a_change_of_module_path(backend_kind: str) -> None:
    settings = {
        "DEFAULT_THROTTLE_CLASSES": ["ratelimit_app.throttling.AnonRateThrottle"],
        "DEFAULT_THROTTLE_RATES": {"anon": "3/m"},
    }
    with override_settings(REST_FRAMEWORK=settings), frozen_clock(T0):
        # What APIView does with the setting (its throttle_classes default).
        view = api_view(*api_settings.DEFAULT_THROTTLE_CLASSES)
        answers = [get(view, ip="198.51.100.1") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert answers[-1]["Retry-After"] == "61"  # exact: the oldest bucket leaves at 60 + 1 s
    assert answers[-1].data["detail"].endswith("Expected available in 61 seconds.")


def test_the_rates_follow_the_settings(rates: Any) -> None:
    """``THROTTLE_RATES`` is read when used (DRF's own class keeps what it read at import)."""
    rates(anon="3/m", user="5/h")
    assert throttling.AnonRateThrottle().rate == "3/m"
    rates(anon="10/s")
    assert (throttling.AnonRateThrottle().rate, throttling.UserRateThrottle.THROTTLE_RATES) == (
        "10/s",
        {"anon": "10/s"},
    )
    assert drf.AnonRateThrottle.THROTTLE_RATES == {"user": None, "anon": None}


def test_a_subclass_keeps_its_own_rates(rates: Any, scope: str) -> None:
    rates(anon="3/m")
    own = type(
        "Own", (throttling.SimpleRateThrottle,), {"scope": scope, "THROTTLE_RATES": {scope: "7/h"}}
    )
    assert own().rate == "7/h"


# -- what DRF lacks --------------------------------------------------------------------------


def test_several_rates_in_one_throttle(backend_kind: str, scope: str) -> None:
    view = api_view(throttle(throttling.UserRateThrottle, scope, "3/m;5/h"))
    with frozen_clock(T0) as now:
        assert statuses(view, 4) == [200, 200, 200, 429]
        now.advance(62)
        assert statuses(view, 2) == [200, 200]
        refused = get(view)
    assert refused.status_code == 429
    # The hour decides now: its oldest hits leave at T0 + 3600 + 60 (one fine bucket, W/60).
    assert int(refused["Retry-After"]) == 3600 + 60 - 62


def test_a_leaky_bucket(backend_kind: str, scope: str) -> None:
    leaky = throttle(throttling.AnonRateThrottle, scope, "1/s", algorithm="leaky_bucket", burst=3)
    view = api_view(leaky)
    with frozen_clock(T0) as now:
        assert statuses(view, 4) == [200, 200, 200, 429]
        assert get(view)["Retry-After"] == "1"
        now.advance(1)
        assert statuses(view, 2) == [200, 429]


@mock.patch.object(memory, "REFUSAL_MEMORY", 0)  # every request asks the backend
def test_refused_requests_are_not_counted(backend_kind: str, scope: str) -> None:
    limited = throttle(throttling.AnonRateThrottle, scope, "3/m")
    view = api_view(limited)
    with frozen_clock(T0):
        assert statuses(view, 10) == [200] * 3 + [429] * 7
        assert core.lookup(limited, "192.0.2.1")["count"] == 3


@mock.patch.object(memory, "REFUSAL_MEMORY", 0)
def test_a_request_one_throttle_refuses_counts_in_none(backend_kind: str, scope: str) -> None:
    """DRF counts it in the throttles that admitted it; here it counts nowhere."""
    tight = throttle(throttling.AnonRateThrottle, scope + "a", "2/m")
    loose = throttle(throttling.AnonRateThrottle, scope + "b", "10/m")
    view = api_view(tight, loose)
    with frozen_clock(T0):
        assert statuses(view, 5) == [200, 200, 429, 429, 429]
        assert core.lookup(loose, "192.0.2.1")["count"] == 2


def _exchanges(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Calls of the backend's one round trip (the real one runs), counted."""
    backend = get_backend()
    calls: list[int] = []
    real = backend.execute

    def execute(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(backend, "execute", execute)
    return calls


def test_one_round_trip_for_all_of_a_views_throttles(
    backend_kind: str, scope: str, rates: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rates(**{scope: "100/m"})
    view = api_view(
        throttle(throttling.AnonRateThrottle, scope + "a", "10/m"),
        throttle(throttling.UserRateThrottle, scope + "u", "5/m;100/d"),
        throttling.ScopedRateThrottle,
        # DRF's own (in the default cache) is asked as DRF asks it, apart from ours.
        throttle(drf.AnonRateThrottle, scope + "drf", "100/m"),
        throttle_scope=scope,
    )
    calls = _exchanges(monkeypatch)
    with frozen_clock(T0):
        answer = get(view)
        assert len(calls) == 1
        assert answer.status_code == 200
        policies = answer["RateLimit-Policy"]
        assert f'"drf:{scope}a:10/m"' in policies and f'"drf:{scope}:100/m"' in policies
        assert f'"drf:{scope}u:5/m";q=5;w=60, "drf:{scope}u:100/d";q=100;w=86400' in policies
        assert statuses(view, 4) == [200] * 4
        assert len(calls) == 5
        # The fifth for the user's 5/m: refused, and the others' hits taken back (one more
        # round trip, which also times the wait exactly).
        assert get(view).status_code == 429
        assert len(calls) == 7
        assert core.lookup(view.cls.throttle_classes[0], "192.0.2.1")["count"] == 5


def test_a_view_that_chooses_its_throttles(backend_kind: str, scope: str) -> None:
    """``get_throttles()`` overridden (per action, say): the one check follows it."""
    a = throttle(throttling.AnonRateThrottle, scope + "a", "1/m")
    b = throttle(throttling.AnonRateThrottle, scope + "b", "5/m")
    view = api_view(a, b, get_throttles=lambda self: [b()])
    with frozen_clock(T0):
        assert statuses(view, 6) == [200] * 5 + [429]
        assert core.lookup(a, "192.0.2.1")["count"] == 0


def test_the_ratelimit_headers(backend_kind: str, scope: str) -> None:
    view = api_view(throttle(throttling.AnonRateThrottle, scope, "2/m"))
    with frozen_clock(T0):
        first = get(view)
        assert first["RateLimit-Policy"] == f'"drf:{scope}:2/m";q=2;w=60'
        assert first["RateLimit"] == f'"drf:{scope}:2/m";r=1;t=61'
        assert "Retry-After" not in first
        get(view)
        refused = get(view)
    assert refused.status_code == 429
    assert refused["RateLimit"] == f'"drf:{scope}:2/m";r=0;t=61'
    assert refused["Retry-After"] == "61"


def test_the_wait(backend_kind: str, scope: str) -> None:
    limited = throttle(throttling.AnonRateThrottle, scope, "2/m")
    fresh = limited()
    assert fresh.wait() == 60 / 3  # DRF's hint before any request: the window spread evenly
    view = api_view(limited)
    request = api_view_request()
    with frozen_clock(T0):
        get(view)
        admitted = limited()
        assert admitted.allow_request(request, view.cls()) is True
        assert admitted.wait() == pytest.approx(61 / 1)  # no room left: the window's reset
        refused = limited()
        assert refused.allow_request(request, view.cls()) is False
        assert refused.wait() == 61.0


def api_view_request() -> Any:
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory

    return Request(APIRequestFactory().get("/api/", REMOTE_ADDR="192.0.2.1"))


def test_disabled_by_ratelimit_enable(scope: str) -> None:
    view = api_view(throttle(throttling.AnonRateThrottle, scope, "1/m"))
    with override_settings(RATELIMIT_ENABLE=False):
        assert statuses(view, 3) == [200] * 3


def test_scoped_views_count_apart(backend_kind: str, rates: Any, scope: str) -> None:
    rates(**{scope + "x": "2/m", scope + "y": "1/m"})
    x = api_view(throttling.ScopedRateThrottle, throttle_scope=scope + "x")
    y = api_view(throttling.ScopedRateThrottle, throttle_scope=scope + "y")
    unscoped = api_view(throttling.ScopedRateThrottle)
    with frozen_clock(T0):
        assert statuses(x, 3) == [200, 200, 429]
        assert statuses(y, 2) == [200, 429]
        assert statuses(unscoped, 5) == [200] * 5


def test_users_count_by_user_and_anonymous_by_address(backend_kind: str, scope: str) -> None:
    view = api_view(throttle(throttling.UserRateThrottle, scope, "1/m"))
    with frozen_clock(T0):
        assert [get(view, user=User(7)).status_code for _ in range(2)] == [200, 429]
        assert get(view, user=User(8)).status_code == 200
        assert statuses(view, 2, ip="192.0.2.7") == [200, 429]  # not user 7's counter
        assert core.lookup(view.cls.throttle_classes[0], "7")["count"] == 1


def test_a_key_of_the_projects_own(backend_kind: str, scope: str) -> None:
    """A ``get_cache_key`` of another shape: its value is the subject, normalised as every
    key's value is (padding is the same client)."""

    def by_api_key(self: Any, request: Any, view: Any) -> str | None:
        return request.META.get("HTTP_X_API_KEY")

    keyed = throttle(throttling.SimpleRateThrottle, scope, "2/m", get_cache_key=by_api_key)
    view = api_view(keyed)
    with frozen_clock(T0):
        assert get(view, HTTP_X_API_KEY="k1").status_code == 200
        assert get(view, HTTP_X_API_KEY="  k1\t").status_code == 200
        assert get(view, HTTP_X_API_KEY="k1\u200b").status_code == 429
        assert get(view, HTTP_X_API_KEY="k2").status_code == 200
        assert get(view).status_code == 200  # no key: not throttled (DRF's None)
        assert core.lookup(keyed, "k1")["count"] == 2


def test_a_key_the_request_names_shows_its_counter_only_when_it_refuses(
    backend_kind: str, scope: str
) -> None:
    """A log-in throttle of the project's own, keyed on the account a request names: a
    stranger naming the victim must not read the victim's counter in the headers; a refusal
    says what it says."""

    def by_account(self: Any, request: Any, view: Any) -> str | None:
        return request.META.get("HTTP_X_ACCOUNT")

    keyed = throttle(throttling.SimpleRateThrottle, scope, "3/m", get_cache_key=by_account)
    view = api_view(keyed, throttle(throttling.AnonRateThrottle, scope + "-anon", "100/m"))
    with frozen_clock(T0):
        get(view, ip="192.0.2.1", HTTP_X_ACCOUNT="victim")
        probe = get(view, ip="198.51.100.9", HTTP_X_ACCOUNT="victim")
        assert probe.status_code == 200
        assert probe["RateLimit-Policy"] == f'"drf:{scope}-anon:100/m";q=100;w=60'
        assert probe["RateLimit"].startswith(f'"drf:{scope}-anon:100/m";r=99;')
        get(view, ip="192.0.2.1", HTTP_X_ACCOUNT="victim")
        refused = get(view, ip="198.51.100.9", HTTP_X_ACCOUNT="victim")
    assert refused.status_code == 429
    assert f'"drf:{scope}:3/m";r=0;' in refused["RateLimit"]


def test_a_parse_rate_of_the_projects_own(backend_kind: str, scope: str) -> None:
    """DRF's idiom for rates it cannot read ("2 per 15 minutes"): its answer is the rate."""

    def parse_rate(self: Any, rate: Any) -> tuple[int, int]:
        return (2, 900) if rate else (None, None)

    custom = throttle(
        throttling.AnonRateThrottle, scope, "2 per 15 minutes", parse_rate=parse_rate
    )
    view = api_view(custom)
    with frozen_clock(T0):
        answers = [get(view) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[-1]["Retry-After"] == "915"  # 900 s, and one fine bucket


# -- failures --------------------------------------------------------------------------------


@pytest.fixture
def dead_counters(closed_port: int) -> Any:
    """The counters on a memcached that refuses connections."""
    with several_memcached(f"127.0.0.1:{closed_port}"):
        reset_backends()
        yield
    reset_backends()


def test_fail_closed_by_default(dead_counters: None, scope: str) -> None:
    failures: list[Any] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        failures.append(kwargs)

    backend_failed.connect(receiver)
    try:
        answer = get(api_view(throttle(throttling.AnonRateThrottle, scope, "5/m")))
    finally:
        backend_failed.disconnect(receiver)
    assert answer.status_code == 503
    assert answer["Retry-After"] == "5"  # backends.base.DEAD_RETRY
    assert "cannot be checked right now" in answer.data["detail"]
    assert len(failures) == 1


def test_fail_open(dead_counters: None, scope: str) -> None:
    open_ = throttle(throttling.AnonRateThrottle, scope, "5/m", fail_open=True)
    assert statuses(api_view(open_), 2) == [200, 200]
    with override_settings(RATELIMIT_FAIL_OPEN=True):
        closed_unless_told = throttle(throttling.AnonRateThrottle, scope + "x", "5/m")
        assert statuses(api_view(closed_unless_told), 2) == [200, 200]


# -- the refusal memory, the admin, metrics ---------------------------------------------------


def test_refusals_are_remembered(
    backend_kind: str, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    limited = throttle(throttling.AnonRateThrottle, scope, "1/m")
    view = api_view(limited)
    calls = _exchanges(monkeypatch)
    with frozen_clock(T0) as now:
        assert statuses(view, 2) == [200, 429]
        asked = len(calls)
        now.advance(3)  # within the refusal memory's cap (5 s)
        answer = get(view)
        assert answer.status_code == 429
        assert len(calls) == asked  # refused from memory: no round trip
        assert answer["Retry-After"] == "58"  # counted down
        # Past the cap, one look confirms it (no count, no take-back).
        now.advance(3)
        asked = len(calls)
        assert get(view)["Retry-After"] == "55"
        assert len(calls) == asked + 1
        # One memory for the middleware, @ratelimit and the throttles: a reset forgets it.
        assert len(RUNTIME.refusals) == 1
        assert core.reset(limited, "192.0.2.1") is True
        assert len(RUNTIME.refusals) == 0
        assert get(view).status_code == 200


def test_usage_in_the_admins_lookup(backend_kind: str, rates: Any, scope: str) -> None:
    rates(**{scope: "5/m"})
    view = api_view(throttling.ScopedRateThrottle, throttle_scope=scope)
    with frozen_clock(T0):
        statuses(view, 2, ip="192.0.2.44")
        get(view, user=User(44))
        limits = throttling.scope_limits()
        assert set(limits) >= {f"drf:{scope}"}
        found = core.lookup(limits[f"drf:{scope}"], "192.0.2.44")
        assert (found["count"], found["limit"], found["remaining"]) == (2, 5, 3)
        # By name, as the admin's usage lookup and the management commands ask.
        assert core.lookup(f"drf:{scope}", "192.0.2.44")["count"] == 2
        # Typed as a person types it: an IPv4-mapped address is the IPv4 address.
        assert core.lookup(f"drf:{scope}", "::ffff:192.0.2.44")["count"] == 2
        assert core.lookup(f"drf:{scope}", "44")["count"] == 1
        assert core.reset(f"drf:{scope}", "192.0.2.44")
        assert core.lookup(f"drf:{scope}", "192.0.2.44")["count"] == 0
    with pytest.raises(ValueError, match="No default throttle rate"):
        throttling.throttle_limit("no-such-scope")


def test_a_throttle_class_that_makes_no_limit_is_a_value_error(rates: Any, scope: str) -> None:
    """``core.lookup`` takes a class of ours that has a rate: a ``ScopedRateThrottle`` (its
    scope is the view's: ``"drf:<scope>"`` names it), a rate of None (DRF's way to throttle
    nothing) or DRF's own class name no limit."""
    rates(**{scope: None})
    with pytest.raises(ValueError, match='name it as "drf:<scope>"'):
        core.lookup(throttling.ScopedRateThrottle, "192.0.2.1")
    with pytest.raises(throttling.NoRate, match="throttles nothing"):
        core.reset(throttle(throttling.AnonRateThrottle, scope), "192.0.2.1")
    with pytest.raises(ValueError, match="no rule, group or throttle"):
        core.lookup(drf.AnonRateThrottle, "192.0.2.1")


def test_the_old_lookup_warns_and_still_answers(backend_kind: str, rates: Any, scope: str) -> None:
    rates(**{scope: "5/m"})
    view = api_view(throttling.ScopedRateThrottle, throttle_scope=scope)
    with frozen_clock(T0):
        statuses(view, 2, ip="192.0.2.44")
        with pytest.warns(DeprecationWarning, match=r"ratelimit_app\.core\.lookup"):
            found = throttling.lookup(scope, "192.0.2.44")
    assert found is not None and found["count"] == 2


def test_the_old_reset_warns_and_still_clears(backend_kind: str, scope: str) -> None:
    limited = throttle(throttling.AnonRateThrottle, scope, "1/m")
    view = api_view(limited)
    with frozen_clock(T0):
        assert statuses(view, 2) == [200, 429]
        with pytest.warns(DeprecationWarning, match=r"ratelimit_app\.core\.reset"):
            assert throttling.reset(limited, "192.0.2.1") is True
        assert get(view).status_code == 200


@pytest.mark.django_db
def test_refusals_are_counted_per_scope_in_metrics(scope: str) -> None:
    import metrics_app
    from metrics_app.models import Series

    metrics_app.flush()  # what earlier tests left in this process's buffer
    sent: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    ratelimited.connect(receiver)
    try:
        view = api_view(throttle(throttling.AnonRateThrottle, scope, "1/m"))
        with frozen_clock(T0):
            assert statuses(view, 4, ip="203.0.113.9") == [200, 429, 429, 429]
    finally:
        ratelimited.disconnect(receiver)
    metrics_app.flush()
    assert Series.objects.get(name=f"ratelimit:drf:{scope}").total == 3
    assert [s["rule"] for s in sent] == [f"drf:{scope}"] * 3
    assert "203.0.113.9" not in str(sent[0]["subject"])  # hashed, never the address


# -- DRF's hooks -------------------------------------------------------------------------------


def test_an_overridden_timer_moves_only_its_own_checks(backend_kind: str, scope: str) -> None:
    """DRF's tests set ``timer``: the windows are read at that time (passed to the check),
    and the limiter's clock is never touched, so other checks keep the real time."""
    original = clock.now
    fixed = throttle(throttling.AnonRateThrottle, scope, "2/m", timer=lambda self: self.at)
    fixed.at = T0
    view = api_view(fixed)
    assert statuses(view, 3) == [200, 200, 429]
    fixed.at = T0 + 61
    assert statuses(view, 1) == [200]  # the window of T0 + 61 no longer holds T0's hits
    with frozen_clock(T0):
        assert core.lookup(fixed, "192.0.2.1")["count"] == 2  # made at T0
    assert clock.now is original


def test_success_and_failure_hooks(backend_kind: str, scope: str) -> None:
    called: list[str] = []
    hooked = throttle(
        throttling.AnonRateThrottle,
        scope,
        "1/m",
        throttle_success=lambda self: called.append("success") or True,
        throttle_failure=lambda self: called.append("failure") or False,
    )
    with frozen_clock(T0):
        assert statuses(api_view(hooked), 2) == [200, 429]
    assert called == ["success", "failure"]


def test_no_client_address_is_a_configuration_error(scope: str) -> None:
    """As every ``ip`` key: not one shared bucket for every client without an address."""
    from django.http import HttpRequest
    from rest_framework.request import Request

    anon = throttle(throttling.AnonRateThrottle, scope, "5/m")
    request = Request(HttpRequest())
    assert anon().get_cache_key(request, None) == f"throttle_{scope}_None"  # as DRF's
    with pytest.raises(ImproperlyConfigured, match="no client IP address"):
        anon().allow_request(request, None)


@pytest.mark.parametrize(
    "rate",
    ["10/M", "3/1.5m", "10 / m", "10/mo", "ten/m", "10", 5, "10/m;", "0x10/m"],
)
def test_a_bad_rate_is_a_configuration_error_naming_it(rate: Any, scope: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=scope) as raised:
        throttle(throttling.AnonRateThrottle, scope, rate)()
    assert repr(rate) in str(raised.value) or str(rate) in str(raised.value)


@pytest.mark.parametrize("rate", ["3/sec", "3/second", "3/min", "3/minute", "3/hour", "3/day"])
def test_drf_unit_words_mean_what_they_say(rate: str, scope: str) -> None:
    limited = throttle(throttling.AnonRateThrottle, scope, rate)()
    assert limited.num_requests == 3
    assert limited.duration == {"s": 1, "m": 60, "h": 3600, "d": 86400}[rate[2]]


def test_a_bad_algorithm_or_burst_is_a_configuration_error(scope: str) -> None:
    view = api_view(throttle(throttling.AnonRateThrottle, scope, "5/m", algorithm="fifo"))
    with pytest.raises(ImproperlyConfigured, match="Unknown algorithm"):
        get(view)
    two_rates = throttle(throttling.AnonRateThrottle, scope, "5/m;10/h", algorithm="leaky_bucket")
    with pytest.raises(ImproperlyConfigured, match=scope):
        get(api_view(two_rates))
