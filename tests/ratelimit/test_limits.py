"""One notion of a limit (:mod:`ratelimit_app.config.limits`), and what was broken without it.

* Database rules are data: only built-in keys and literal rates, nothing imported or called.
* An async view whose key needs the user is checked off the event loop (it answered 500).
* Failure-only rules count a provisional hit before the view, so concurrent attempts never
  pass the limit (they all did when the rule looked before the view and counted after).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client, RequestFactory, override_settings

from ratelimit_app import core, store
from ratelimit_app.algorithms import gcra
from ratelimit_app.backends import get_backend
from ratelimit_app.config import limits
from ratelimit_app.config.limits import LimitError
from ratelimit_app.config.rules import RuleError, parse_rule
from ratelimit_app.models import Rule as RuleRow
from ratelimit_app.testing import frozen_clock
from tests.ratelimit import canary, views

T0 = 1_800_000_000.0


pytestmark = pytest.mark.usefixtures("rules_site")


# -- the value ---------------------------------------------------------------------------


def test_a_limit_derives_its_scope_and_async_safety_once() -> None:
    ip = limits.build("g", "ip", "5/m;100/d", method=["post", "get"])
    assert ip.methods == frozenset({"GET", "POST"})
    assert ip.static_scope == core.scope("g", ["GET", "POST"], ip.static_rates or ())
    assert ip.async_safe
    assert limits.build("g", "ip", "5/m") is limits.build("g", "ip", "5/m")  # memoised
    for key in ("user", "user_or_ip", lambda g, r: "x", "tests.ratelimit.canary.key"):
        assert not limits.build("g", key, "5/m").async_safe, key
    assert not limits.build("g", "ip", lambda g, r: "5/m").async_safe  # user code per request


@pytest.mark.parametrize(
    ("kwargs", "field", "problem"),
    [
        ({"key": None}, "key", "key must be specified"),
        ({"key": "nope"}, "key", "Could not understand"),
        ({"key": 42}, "key", "expected a key string"),
        ({"rate": "10/M"}, "rate", "10/M"),
        ({"rate": None}, "rate", "rate must be specified"),
        ({"method": 5}, "method", "Method 5"),
        ({"algorithm": "leaky"}, "algorithm", "Unknown algorithm 'leaky'"),
        ({"burst": 3}, "burst", "capacity of a leaky bucket"),
        ({"algorithm": "leaky_bucket", "rate": "5/m;10/d"}, "rate", "one leak rate"),
        ({"rate": ["5/m"]}, "rate", "5/m"),  # unhashable: not memoised, still refused
    ],
)
def test_every_mistake_names_its_field(kwargs: dict[str, Any], field: str, problem: str) -> None:
    args = {"key": "ip", "rate": "5/m", **kwargs}
    with pytest.raises(LimitError) as caught:
        limits.build("g", **args)
    assert caught.value.field == field
    assert problem in str(caught.value)


# -- database rules are data -------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("key", "os.system"),
        ("key", "builtins.print"),
        ("key", "tests.ratelimit.canary.key"),
        ("rate", "os.getcwd"),
        ("rate", "tests.ratelimit.canary.key"),
    ],
)
def test_a_database_rule_never_names_code(field: str, value: str, db: Any) -> None:
    row = RuleRow(name="evil", path="/rules/named/", key="ip", rate="5/m")
    setattr(row, field, value)
    with pytest.raises(ValidationError) as caught:
        row.full_clean()
    assert "RATELIMIT_RULES" in str(caught.value.message_dict[field])
    # The same rule is fine in settings: code is the settings' to name.
    parse_rule({"name": "ok", "path": "/", "key": "ip", "rate": "5/m", field: value})
    with pytest.raises(RuleError):
        parse_rule({"name": "evil", "path": "/", "key": "ip", field: value}, trusted=False)


def test_a_saved_row_naming_code_is_neither_imported_nor_called(
    backend_kind: str, client: Client, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A row written around the admin's validation (a fixture, raw SQL, an old release)."""
    name = "tests.ratelimit.canary_unimported"
    RuleRow.objects.create(name="evil", path="/rules/named/", key=f"{name}.key", rate="1/m")
    RuleRow.objects.create(name="fine", path="/rules/named/", key="ip", rate="2/m")
    store.forget()
    with frozen_clock(T0):
        codes = [client.get("/rules/named/").status_code for _ in range(3)]
    assert codes == [200, 200, 429]  # the valid row applies, the other is left out
    assert name not in sys.modules
    assert "database" in caplog.text and "evil" in caplog.text
    assert not canary.CALLS


# -- async views -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/async-user-or-ip/", "/async-user/"])
async def test_an_async_view_keyed_on_the_user(
    backend_kind: str, async_client: Any, path: str, transactional_db: Any
) -> None:
    """A logged-in user's key reads the session: not on the event loop (it answered 500
    ``SynchronousOnlyOperation`` on memcached and Redis)."""
    from asgiref.sync import sync_to_async

    await sync_to_async(User.objects.create_user)("dora", password="pw")
    await async_client.alogin(username="dora", password="pw")
    with frozen_clock(T0):
        codes = [(await async_client.get(path)).status_code for _ in range(3)]
    assert codes == [200, 200, 429]


# -- failure-only rules ------------------------------------------------------------------


def failures_rule(**fields: Any) -> Any:
    rule = {"name": "guess", "path": "/rules/slow/", "key": "ip", "rate": "5/m"}
    return override_settings(RATELIMIT_RULES=[{**rule, "count": "failures", **fields}])


def concurrently(path: str, n: int) -> list[int]:
    """``n`` requests at once from one client address; their statuses."""
    barrier = threading.Barrier(n)
    codes: list[int] = []

    def send() -> None:
        barrier.wait()
        codes.append(Client().post(path).status_code)

    threads = [threading.Thread(target=send) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


@pytest.mark.parametrize("algorithm", ["sliding_window", "leaky_bucket"])
def test_concurrent_failures_never_pass_the_limit(backend_kind: str, algorithm: str) -> None:
    views.slow_status.reached = 0
    with failures_rule(algorithm=algorithm), frozen_clock(T0):
        codes = concurrently("/rules/slow/401/", 15)
    # Never more than 5 reach the password check. Where the round trip is not atomic
    # (memcached, a Django cache), a guess may be refused where it would have fit: its read
    # saw later guesses. Redis runs the check as one script: exactly 5.
    assert set(codes) <= {401, 429}
    assert codes.count(401) == views.slow_status.reached
    assert 1 <= views.slow_status.reached <= 5
    if backend_kind == "redis":
        assert views.slow_status.reached == 5


def test_only_requests_that_did_not_fail_pay_a_second_round_trip(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    views.slow_status.delay = 0
    calls: list[int] = []
    try:
        with failures_rule(), frozen_clock(T0):
            backend = get_backend()  # built for these settings
            execute = backend.execute

            def counting(ops: Any, now_us: int) -> Any:
                calls.append(len(ops))
                return execute(ops, now_us)

            monkeypatch.setattr(backend, "execute", counting)
            assert client.post("/rules/slow/401/").status_code == 401
            assert calls == [1]  # counted in the check: nothing after the view
            for _ in range(10):  # successes never use up the quota
                assert client.post("/rules/slow/200/").status_code == 200
            assert calls == [1] + [1, 1] * 10  # each: the check, then the take-back
            usage = core.lookup("guess", "127.0.0.1")
    finally:
        views.slow_status.delay = 0.2
    assert usage is not None and usage["count"] == 1


def test_a_leaky_bucket_failure_rule_takes_back_successes(
    backend_kind: str, client: Client
) -> None:
    views.slow_status.delay = 0
    try:
        with failures_rule(algorithm=gcra.LEAKY_BUCKET, burst=2), frozen_clock(T0):
            assert [client.post("/rules/slow/200/").status_code for _ in range(6)] == [200] * 6
            assert [client.post("/rules/slow/403/").status_code for _ in range(3)] == [
                403,
                403,
                429,
            ]
    finally:
        views.slow_status.delay = 0.2


# -- get_usage during an outage ----------------------------------------------------------


def test_a_look_never_enforces_during_an_outage(dead_cache: str) -> None:
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.1")
    look = core.get_usage(request, "g", key="ip", rate="1/m")
    assert look is None  # counts nothing, so it fails open
    counted = core.get_usage(request, "g", key="ip", rate="1/m", increment=True)
    assert counted is not None and counted["should_limit"]  # RATELIMIT_FAIL_OPEN is False
    closed = core.get_usage(request, "g", key="ip", rate="1/m", fail_open=False)
    assert closed is not None and closed["should_limit"]  # unless asked to fail closed


@pytest.fixture
def dead_cache() -> Iterator[str]:
    import socket

    from ratelimit_app.backends import reset_backends

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": f"127.0.0.1:{port}",
    }
    local = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    with override_settings(CACHES={"default": local, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        yield "rl"
    reset_backends()


def test_django_ratelimits_public_helpers_import_from_core() -> None:
    """A module written for django-ratelimit imports these from ``core``."""
    from ratelimit_app.core import get_header, user_or_ip

    request = RequestFactory().get("/", HTTP_X_API_KEY="k-1", REMOTE_ADDR="192.0.2.9")
    assert get_header(request, "X-Api-Key") == "k-1"
    assert user_or_ip(request) == "192.0.2.9"


# -- HEAD counts wherever GET does ---------------------------------------------------------


def test_head_is_counted_with_get_and_the_scope_is_unchanged() -> None:
    """Django answers HEAD with the GET view: a limit on GET that let HEAD through was a
    limit the client could walk around. The scope (the counters' keys) stays that of the
    methods named, so counters kept before are the same counters."""
    get = limits.build("g", "ip", "5/m", method="GET")
    assert get.methods == {"GET"} and get.counts == {"GET", "HEAD"}
    assert get.method_text == "GET"
    assert get.static_scope == core.scope("g", "GET", get.static_rates or ())
    rf = RequestFactory()
    assert get.applies_to(rf.head("/")) and get.applies_to(rf.get("/"))
    assert not get.applies_to(rf.post("/"))
    post = limits.build("g", "ip", "5/m", method=["POST"])
    assert post.counts == {"POST"} and not post.applies_to(rf.head("/"))
    head = limits.build("g", "ip", "5/m", method="HEAD")
    assert head.counts == {"HEAD"} and not head.applies_to(rf.get("/"))
    assert limits.build("g", "ip", "5/m").counts is None  # every method
    rule = parse_rule({"name": "r", "path": "/", "methods": ["get"], "key": "ip", "rate": "5/m"})
    assert rule.methods == {"GET"} and rule.matches == {"GET", "HEAD"}
    assert rule.limit.method_text == ""  # a rule counts every method it covers in one counter


def test_head_requests_are_counted_by_a_get_rule(backend_kind: str, client: Client) -> None:
    rule = {"name": "get-only", "path": "/rules/named/", "methods": ["GET"], "key": "ip"}
    with override_settings(RATELIMIT_RULES=[{**rule, "rate": "3/m"}]), frozen_clock(T0):
        codes = [client.head("/rules/named/").status_code for _ in range(3)]
        codes.append(client.get("/rules/named/").status_code)  # the same counter
        codes.append(client.head("/rules/named/").status_code)
        codes.append(client.post("/rules/named/").status_code)  # not a GET rule's
    assert codes == [200, 200, 200, 429, 429, 200]


def test_head_requests_are_counted_by_a_get_decorator(backend_kind: str) -> None:
    from django.http import HttpResponse

    from ratelimit_app.decorators import ratelimit
    from ratelimit_app.exceptions import Ratelimited

    @ratelimit(group="head-decorated", key="ip", rate="2/m", method="GET")
    def view(request: Any) -> HttpResponse:
        return HttpResponse("ok")

    rf = RequestFactory()
    with frozen_clock(T0):
        assert view(rf.head("/")).status_code == 200
        assert view(rf.get("/")).status_code == 200
        with pytest.raises(Ratelimited):
            view(rf.head("/"))
        assert view(rf.post("/")).status_code == 200  # POST is not counted


def test_is_ratelimited_counts_head_as_get(backend_kind: str) -> None:
    head = RequestFactory().head("/", REMOTE_ADDR="192.0.2.30")
    args = {"group": "head-core", "key": "ip", "rate": "1/m", "method": "GET"}
    with frozen_clock(T0):
        assert not core.is_ratelimited(head, increment=True, **args)
        assert core.is_ratelimited(head, increment=True, **args)
        get = RequestFactory().get("/", REMOTE_ADDR="192.0.2.30")
        assert core.is_ratelimited(get, **args)  # the same counter
        usage = core.get_usage(head, **args)
    assert usage is not None and usage["count"] == 1
