"""A limit's ``fallback``: while its counter server is down, it counts in the process's memory
(docs/reliability, *Counting in memory during an outage*).

Every server here is the test's own (:mod:`tests.reliability.procs`), killed and started
again on the same port; the shared session servers are never hurt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings

import ratelimit_app
from ratelimit_app.backends import base, reset_backends
from ratelimit_app.conf import conf
from ratelimit_app.config.rules import RuleError, parse_rule
from ratelimit_app.core import get_usage
from ratelimit_app.decorators import ratelimit
from ratelimit_app.engine import failure_dict
from ratelimit_app.engine import fallback as engine_fallback
from ratelimit_app.engine.fallback import fallback
from ratelimit_app.exceptions import Ratelimited
from ratelimit_app.signals import fallback_changed
from tests.conftest import start_or_skip
from tests.ratelimit.conftest import MIDDLEWARE, rules
from tests.reliability import procs

MEMCACHED = "django.core.cache.backends.memcached.PyMemcacheCache"
REDIS = "django_redis.cache.RedisCache"
LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
#: How long a failed server is skipped here (``base.DEAD_RETRY`` is 5 s).
DEAD_RETRY = 0.3


@pytest.fixture(params=["memcached", "redis"])
def server(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A counter server of the test's own, configured as the limiter's, which the test may
    kill and restart."""
    kind: str = request.param
    own: procs.Restartable = start_or_skip(getattr(procs, kind))  # type: ignore[arg-type]
    config = (
        {"BACKEND": MEMCACHED, "LOCATION": own.address}
        if kind == "memcached"
        else {"BACKEND": REDIS, "LOCATION": own.url}
    )
    monkeypatch.setattr(base, "DEAD_RETRY", DEAD_RETRY)
    try:
        with override_settings(CACHES={"default": LOCMEM, "rl": config}, RATELIMIT_USE_CACHE="rl"):
            reset_backends()
            yield own
    finally:
        reset_backends()
        own.stop()


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.ratelimit.urls", MIDDLEWARE=MIDDLEWARE):
        yield


@pytest.fixture
def changes() -> Iterator[list[dict[str, Any]]]:
    """The ``fallback_changed`` signals sent meanwhile."""
    sent: list[dict[str, Any]] = []

    def receive(**kwargs: Any) -> None:
        sent.append(kwargs)

    fallback_changed.connect(receive, weak=False)
    yield sent
    fallback_changed.disconnect(receive)


def usage(
    rf: RequestFactory, client: str = "203.0.113.7", **options: Any
) -> dict[str, Any] | None:
    """One counted check of 5/m on ``client``."""
    request = rf.get("/", REMOTE_ADDR=client)
    options.setdefault("fail_open", False)
    return get_usage(request, "fb", key="ip", rate="5/m", increment=True, **options)


def back_on(server: procs.Restartable) -> None:
    """Start the killed server again and let its dead-server retry pass."""
    server.restart()
    time.sleep(DEAD_RETRY + 0.05)


def test_a_limit_counts_in_memory_while_its_server_is_down_and_on_it_again_after(
    server: procs.Restartable,
    rf: RequestFactory,
    changes: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    for n in (1, 2, 3):
        found = usage(rf, fallback="memory")
        assert found is not None and found["count"] == n and not found["should_limit"]
    server.kill()
    caplog.set_level(logging.WARNING, logger="ratelimit_app")
    # Counted in memory from 0 (the server's counts are out of reach): five, then refused.
    seen = [usage(rf, fallback="memory") for _ in range(7)]
    assert [u["count"] for u in seen if u] == [1, 2, 3, 4, 5, 6, 6]
    assert [u["should_limit"] for u in seen if u] == [False] * 5 + [True] * 2
    assert failure_dict() not in seen
    switched = [r for r in caplog.records if "count in each process's memory" in r.message]
    assert len(switched) == 1, "one line when the process switches, not one per request"
    assert [c["in_memory"] for c in changes] == [True]
    assert changes[0]["alias"] == "rl" and changes[0]["error"] is not None
    other = [usage(rf, "203.0.113.8", fallback="memory") for _ in range(3)]
    assert [u["count"] for u in other if u] == [1, 2, 3]
    back_on(server)
    # The server lost its counts (killed); the next check counts there, not in memory
    # (where this client has 3). (The refused client's refusal is remembered until its
    # wait ends: never lenient.)
    found = usage(rf, "203.0.113.8", fallback="memory")
    assert found is not None and found["count"] == 1 and not found["should_limit"]
    assert [c["in_memory"] for c in changes] == [True, False]
    assert any("answers again" in r.message for r in caplog.records)


def test_without_a_fallback_an_outage_fails_as_before(
    server: procs.Restartable, rf: RequestFactory, changes: list[dict[str, Any]]
) -> None:
    server.kill()
    found = usage(rf)
    assert found == failure_dict()
    assert usage(rf, fail_open=True) is None
    with override_settings(RATELIMIT_FALLBACK="memory"):
        counted = usage(rf)
        assert counted is not None and counted["count"] == 1
        never = usage(rf, fallback=False)  # a limit may refuse the setting's fallback
        assert never == failure_dict()
    assert [c["in_memory"] for c in changes] == [True]


def test_a_rule_falls_back_and_a_rule_without_fails_closed(
    server: procs.Restartable, client: Client
) -> None:
    with rules(
        {"name": "fb", "path": "/rules/named/", "key": "ip", "rate": "3/m", "fail_open": False,
         "fallback": "memory"},
        {"name": "closed", "path": "/rules/unnamed/", "key": "ip", "rate": "3/m",
         "fail_open": False},
    ):  # fmt: skip
        assert client.get("/rules/named/").status_code == 200
        server.kill()
        statuses = [client.get("/rules/named/").status_code for _ in range(5)]
        assert statuses == [200, 200, 200, 429, 429]
        refused = client.get("/rules/named/")
        assert refused["RateLimit"].startswith('"fb:3/m";r=0;')
        assert client.get("/rules/unnamed/").status_code == 503


def test_in_flight_places_are_given_back_in_memory(
    server: procs.Restartable, client: Client
) -> None:
    with rules(
        {"name": "one-at-a-time", "path": "/rules/named/", "key": "ip", "concurrent": 1,
         "fail_open": False, "fallback": "memory"},
    ):  # fmt: skip
        server.kill()
        # Each request takes the one place in memory and gives it back there when done: a
        # place given back to the dead server would stay taken, and the next one refused.
        assert [client.get("/rules/named/").status_code for _ in range(4)] == [200] * 4
        assert fallback().memory.subjects() == 1


def test_failure_only_hits_are_taken_back_in_memory(
    server: procs.Restartable, client: Client
) -> None:
    with rules(
        {"name": "guesses", "path": "/rules/status/", "key": "ip", "rate": "2/m",
         "count": "failures", "fail_open": False, "fallback": "memory"},
    ):  # fmt: skip
        server.kill()
        # Successes are taken back in memory: they never use the two failures up.
        assert [client.get("/rules/status/200/").status_code for _ in range(4)] == [200] * 4
        failures = [client.get("/rules/status/401/").status_code for _ in range(3)]
        assert failures == [401, 401, 429]


def test_the_decorator_falls_back(server: procs.Restartable, rf: RequestFactory) -> None:
    @ratelimit(key="ip", rate="2/m", fallback="memory")
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    server.kill()
    request = rf.get("/", REMOTE_ADDR="198.51.100.9")
    assert view(request).status_code == 200
    assert view(rf.get("/", REMOTE_ADDR="198.51.100.9")).status_code == 200
    with pytest.raises(Ratelimited):
        view(rf.get("/", REMOTE_ADDR="198.51.100.9"))


def test_a_charge_counts_in_memory_too(server: procs.Restartable, rf: RequestFactory) -> None:
    server.kill()
    request = rf.get("/", REMOTE_ADDR="203.0.113.7")
    found = get_usage(request, "fb", key="ip", rate="5/m", increment=True, fallback="memory")
    assert found is not None and found["count"] == 1
    assert ratelimit_app.charge(request, 3) == 1
    after = usage(rf, fallback="memory")
    assert after is not None and after["count"] == 5


def test_the_drf_throttle_falls_back(server: procs.Restartable) -> None:
    from rest_framework.decorators import api_view, throttle_classes
    from rest_framework.response import Response
    from rest_framework.test import APIRequestFactory

    from ratelimit_app.throttling import AnonRateThrottle

    class Throttle(AnonRateThrottle):
        scope = "fallback-anon"
        rate = "2/m"
        fallback = "memory"
        fail_open = False

    @api_view(["GET"])
    @throttle_classes([Throttle])
    def view(request: Any) -> Response:
        return Response({"ok": True})

    server.kill()
    factory = APIRequestFactory()
    statuses = [view(factory.get("/", REMOTE_ADDR="192.0.2.4")).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]


def test_the_memory_holds_at_most_its_bound(
    server: procs.Restartable, rf: RequestFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_fallback, "MAX_SUBJECTS", 3)
    server.kill()
    with override_settings(RATELIMIT_FALLBACK="memory"):
        for n in range(10):
            request = rf.get("/", REMOTE_ADDR=f"192.0.2.{n}")
            found = get_usage(request, "fb", key="ip", rate="5/m", increment=True)
            assert found is not None and found["count"] == 1
        assert fallback().memory.subjects() == 3


@pytest.mark.parametrize("value", ["disk", "Memory", True, 1, ["memory"]])
def test_a_bad_fallback_is_refused_at_every_door(value: Any, rf: RequestFactory) -> None:
    raw = {"name": "r", "path": "/", "key": "ip", "rate": "5/m", "fallback": value}
    with pytest.raises(RuleError) as found:
        parse_rule(raw)
    assert found.value.field == "fallback" and "'memory'" in str(found.value)
    with pytest.raises(ImproperlyConfigured, match="fallback"):
        get_usage(rf.get("/"), "g", key="ip", rate="5/m", fallback=value)
    with (
        override_settings(RATELIMIT_FALLBACK=value),
        pytest.raises(ImproperlyConfigured, match="RATELIMIT_FALLBACK"),
    ):
        conf.FALLBACK  # noqa: B018


@pytest.mark.parametrize("value", ["disk", True, 1])
def test_the_system_checks_name_a_bad_fallback_setting(value: Any) -> None:
    from django.core.checks import run_checks

    with override_settings(RATELIMIT_FALLBACK=value):
        found = [m for m in run_checks() if m.id == "ratelimit_app.E022"]
    assert len(found) == 1 and "RATELIMIT_FALLBACK" in found[0].msg
    assert repr(value) in found[0].msg


def test_the_exporters_label_what_memory_decided_and_show_the_gauge(
    server: procs.Restartable, rf: RequestFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry

    from ratelimit_app.engine import checking
    from ratelimit_app.operators import telemetry

    registry = CollectorRegistry()
    reader = InMemoryMetricReader()
    otel = telemetry.OpenTelemetry(MeterProvider(metric_readers=[reader]).get_meter("t"))
    exporters = telemetry.Telemetry([telemetry.Prometheus(registry), otel])
    monkeypatch.setattr(checking.HOOKS, "observers", [exporters.observe])
    fallback_changed.connect(exporters.fallback_changed, weak=False, dispatch_uid="test-fb")
    kind = server.name  # (the backend label: memcached, redis)

    def gauge() -> list[float | None]:
        points = [
            p.value
            for m in reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics
            if m.name == telemetry.FALLBACK
            for p in m.data.data_points
            if p.attributes == {"backend": kind}
        ]
        return [registry.get_sample_value(telemetry.FALLBACK, {"backend": kind}), *points]

    def decided(decision: str) -> float | None:
        return registry.get_sample_value(telemetry.REQUESTS, {"limit": "fb", "decision": decision})

    try:
        exporters.welcome_configured()
        assert gauge() == [0.0, 0]
        assert usage(rf, fallback="memory") is not None
        assert decided("admitted") == 1.0
        server.kill()
        for _ in range(6):
            usage(rf, "198.51.100.1", fallback="memory")
        assert (decided("fallback_admitted"), decided("fallback_refused")) == (5.0, 1.0)
        assert decided("failed_closed") is None and decided("admitted") == 1.0
        assert gauge() == [1.0, 1]
        back_on(server)
        usage(rf, "198.51.100.2", fallback="memory")
        assert decided("admitted") == 2.0 and gauge() == [0.0, 0]
    finally:
        fallback_changed.disconnect(dispatch_uid="test-fb")


@pytest.mark.django_db
def test_a_database_rule_falls_back_as_its_admin_form_says(admin_client: Client) -> None:
    from ratelimit_app.models import Rule
    from tests import settings as site

    with override_settings(MIDDLEWARE=site.MIDDLEWARE):  # (the admin's messages)
        saved_rule(admin_client)
    rule = Rule.objects.get(name="db-login")
    assert rule.fallback == "memory"
    assert parse_rule(rule.as_dict(), trusted=False).policy.fallback is True
    never = Rule(name="n", path="/", key="ip", rate="5/m", fallback="never")
    assert never.as_dict()["fallback"] is False
    assert parse_rule(never.as_dict(), trusted=False).policy.fallback is False
    assert "fallback" not in Rule(name="d", path="/", key="ip", rate="5/m").as_dict()


def saved_rule(admin_client: Client) -> None:
    """A rule saved through the admin's form, its fallback chosen there."""
    page = admin_client.get("/admin/ratelimit_app/rule/add/")
    assert page.status_code == 200 and b'name="fallback"' in page.content
    saved = admin_client.post(
        "/admin/ratelimit_app/rule/add/",
        {
            "name": "db-login",
            "enabled": "on",
            "path": "/login/",
            "key": "ip",
            "rate": "5/m",
            "count": "all",
            "block": "on",
            "algorithm": "sliding_window",
            "cost": "1",
            "fallback": "memory",
        },
    )
    assert saved.status_code == 302, saved.content[:2000]


@pytest.mark.django_db
def test_strikes_count_in_memory_and_the_ban_is_made_as_always(
    server: procs.Restartable, client: Client
) -> None:
    from ratelimit_app import store
    from ratelimit_app.models import Ban
    from ratelimit_app.signals import subject_banned
    from ratelimit_app.testing import forget_refusals

    banned: list[dict[str, Any]] = []

    def receive(sender: Any, **kwargs: Any) -> None:
        banned.append(kwargs)

    subject_banned.connect(receive)
    store.forget()
    forget_refusals()
    try:
        with rules(
            {"name": "scan", "path": "/rules/named/", "key": "ip", "rate": "2/m",
             "ban": {"after": 3, "within": "1h", "for": "10m"}, "fail_open": False,
             "fallback": "memory"},
        ):  # fmt: skip
            server.kill()
            statuses = [client.get("/rules/named/").status_code for _ in range(5)]
            assert statuses == [200, 200, 429, 429, 429]
            assert len(banned) == 1 and banned[0]["limit"] == "scan"  # the third refusal
            assert Ban.objects.count() == 1
    finally:
        subject_banned.disconnect(receive)
        store.forget()
        forget_refusals()


def test_several_memcached_nodes_fall_back_when_none_is_left(
    rf: RequestFactory, changes: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = [start_or_skip(procs.memcached) for _ in range(2)]  # type: ignore[arg-type]
    config = {"BACKEND": MEMCACHED, "LOCATION": [n.address for n in nodes]}
    monkeypatch.setattr(base, "DEAD_RETRY", 60.0)
    clients = [f"192.0.2.{i}" for i in range(1, 21)]
    try:
        with override_settings(CACHES={"default": LOCMEM, "rl": config}, RATELIMIT_USE_CACHE="rl"):
            reset_backends()
            for ip in clients:
                assert (usage(rf, ip, fallback="memory") or {}).get("count") == 1
            nodes[0].kill()  # its subjects move to the other node: no fallback
            moved = [usage(rf, ip, fallback="memory") for ip in clients]
            assert all(u is not None and u["count"] in (1, 2) for u in moved)
            assert changes == []
            nodes[1].kill()  # none left: every subject counts in memory
            down = [usage(rf, ip, fallback="memory") for ip in clients]
            assert all(u is not None and u["count"] == 1 for u in down)
            assert [c["in_memory"] for c in changes] == [True]
    finally:
        reset_backends()
        for node in nodes:
            node.stop()


def test_on_local_memory_the_fallback_never_engages(
    rf: RequestFactory, changes: list[dict[str, Any]]
) -> None:
    """The counters are the process's own: never unreachable, so a fallback changes nothing."""
    local = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "fb-local"}
    with override_settings(CACHES={"default": LOCMEM, "rl": local}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        try:
            seen = [usage(rf, "192.0.2.99", fallback="memory") for _ in range(6)]
        finally:
            reset_backends()
    assert [u["count"] for u in seen if u] == [1, 2, 3, 4, 5, 6]
    assert [u["should_limit"] for u in seen if u] == [False] * 5 + [True]
    assert changes == [] and fallback().memory.subjects() == 0


@pytest.mark.django_db
def test_overrides_and_dry_runs_apply_in_memory_as_usual(
    server: procs.Restartable, client: Client
) -> None:
    from ratelimit_app import store
    from ratelimit_app.models import Override
    from ratelimit_app.overrides import applied
    from ratelimit_app.testing import forget_refusals

    store.forget()
    applied.forget()
    forget_refusals()
    row = Override(limit="fb", subject="192.0.2.50", rate="4/m")
    row.full_clean()
    row.save()
    try:
        with rules(
            {"name": "fb", "path": "/rules/named/", "key": "ip", "rate": "2/m",
             "fail_open": False, "fallback": "memory"},
            {"name": "dry", "path": "/rules/unnamed/", "key": "ip", "rate": "1/m",
             "fail_open": False, "fallback": "memory", "shadow": True},
        ):  # fmt: skip
            server.kill()
            partner = [client.get("/rules/named/", REMOTE_ADDR="192.0.2.50") for _ in range(5)]
            other = [client.get("/rules/named/", REMOTE_ADDR="192.0.2.51") for _ in range(3)]
            dry = [client.get("/rules/unnamed/", REMOTE_ADDR="192.0.2.52") for _ in range(3)]
    finally:
        store.forget()
        applied.forget()
        forget_refusals()
    assert [r.status_code for r in partner] == [200] * 4 + [429]  # its override's 4/m
    assert [r.status_code for r in other] == [200, 200, 429]  # the rule's 2/m
    assert [r.status_code for r in dry] == [200] * 3  # a dry run refuses nothing


def test_a_corrupt_counter_counts_in_memory_without_announcing_an_outage(
    rf: RequestFactory, changes: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """One subject's bucket holds no count (written around the limiter): the server is not
    down, so nothing switches (no line, no signal per such request); the request is counted
    in memory, and another subject still counts on the server."""
    from pymemcache.client.base import Client as Memcache

    from ratelimit_app.algorithms.rates import normalize
    from ratelimit_app.backends import get_backend
    from ratelimit_app.config.limits import scope
    from ratelimit_app.engine.sliding_window import plan
    from ratelimit_app.identity.namespaces import namespace
    from ratelimit_app.testing import frozen_clock

    own: procs.Restartable = start_or_skip(procs.memcached)  # type: ignore[arg-type]
    config = {"BACKEND": MEMCACHED, "LOCATION": own.address}
    try:
        with (
            override_settings(CACHES={"default": LOCMEM, "rl": config}, RATELIMIT_USE_CACHE="rl"),
            frozen_clock(1_800_000_030.0) as clock,
        ):
            reset_backends()
            ns = namespace(scope("fb", "", normalize("5/m")), "ip", "203.0.113.7")
            host, port = own.address.rsplit(":", 1)
            raw = Memcache((host, int(port)))
            prefix = get_backend().key_prefix + ns
            for suffix in plan(normalize("5/m"), clock(), 60).reads:
                raw.set(prefix + suffix, b"x")
            raw.close()
            caplog.set_level(logging.WARNING, logger="ratelimit_app")
            seen = [usage(rf, fallback="memory") for _ in range(3)]
            other = usage(rf, "203.0.113.8", fallback="memory")
            reset_backends()
    finally:
        own.stop()
    assert [u["count"] for u in seen if u] == [1, 2, 3]  # in memory, never a failure
    assert other is not None and other["count"] == 1
    assert changes == []
    assert not [r for r in caplog.records if "each process's memory" in r.getMessage()]
