"""RatelimitMiddleware with RATELIMIT_RULES, on local memory, real memcached and real Redis."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import caches
from django.test import Client, override_settings

from ratelimit_app import core, store
from ratelimit_app.backends import get_backend, reset_backends
from ratelimit_app.signals import backend_failed, ratelimited
from ratelimit_app.testing import frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE, rules

T0 = 1_800_000_000.0


def rule(name: str, path: str = "/rules/named/", **fields: Any) -> dict[str, Any]:
    return {"name": name, "path": path, "key": "ip", "rate": "2/m", **fields}


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    with override_settings(ROOT_URLCONF="tests.ratelimit.urls", MIDDLEWARE=MIDDLEWARE):
        yield


def statuses(client: Client, path: str, n: int, **extra: Any) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(n)]


class Spy:
    """Counts the backend's round trips (``execute`` calls) and the ops in each."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[int] = []
        backend = get_backend()
        original = backend.execute

        def execute(ops: Any, now_us: int) -> Any:
            self.calls.append(len(ops))
            return original(ops, now_us)

        monkeypatch.setattr(backend, "execute", execute)


def test_a_limited_request_gets_429_with_the_headers(backend_kind: str, client: Client) -> None:
    with rules(rule("named")), frozen_clock(T0 + 30):
        first = client.get("/rules/named/")
        assert first.status_code == 200
        assert first["RateLimit-Policy"] == '"named:2/m";q=2;w=60'
        assert first["RateLimit"].startswith('"named:2/m";r=1;t=')
        assert client.get("/rules/named/").status_code == 200
        refused = client.get("/rules/named/")
    assert refused.status_code == 429
    retry_after = int(refused["Retry-After"])
    assert 1 <= retry_after <= 61
    assert refused["RateLimit"] == f'"named:2/m";r=0;t={retry_after}'
    assert refused["RateLimit-Policy"] == '"named:2/m";q=2;w=60'
    assert b"Please wait" in refused.content and refused["Content-Type"].startswith("text/html")


def test_every_matching_rule_in_one_round_trip(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The configuration's version counter is read at most once a second per process,
    # whatever the requests: loaded here, before counting the checks' round trips.
    monkeypatch.setattr(store, "CONFIG_REFRESH", 3600)
    with rules(
        rule("ip-m", rate="100/m"),
        rule("ip-d", rate="1000/d"),
        rule("header", key="header:x-api-key", rate="50/h"),
        rule("elsewhere", path="/other/"),
    ):
        store.current()
        spy = Spy(monkeypatch)
        response = client.get("/rules/named/", HTTP_X_API_KEY="k1")
        assert response.status_code == 200
        assert spy.calls == [3]  # three rules, one backend call
        # The headers show the client's own address's counters; a header's value may be
        # anyone's (docs/rules.rst, "Headers").
        assert response["RateLimit-Policy"].count(";q=") == 2
        assert "header:" not in response["RateLimit-Policy"]
        client.get("/rules/unnamed/")
        assert spy.calls == [3]  # no rule matches: no backend operation at all


def test_one_memcached_round_trip_for_three_rules(
    memcached_server: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": memcached_server,
    }
    monkeypatch.setattr(store, "CONFIG_REFRESH", 3600)  # the version counter: read once, here
    with (
        override_settings(CACHES={"default": config}, RATELIMIT_USE_CACHE="default"),
        rules(rule("a", rate="100/m"), rule("b", rate="100/h"), rule("c", rate="100/d")),
    ):
        reset_backends()
        store.current()
        backend: Any = get_backend()
        sent: list[bytes] = []
        original = backend._on

        def on(node: Any, exchange: Any, command: bytes, *args: Any) -> Any:
            sent.append(command)  # every round trip on a pooled connection comes here
            return original(node, exchange, command, *args)

        monkeypatch.setattr(backend, "_on", on)
        assert client.get("/rules/named/").status_code == 200
        assert len(sent) == 1  # one write, one reply: the three rules' increments and reads
        *lines, end = sent[0].split(b"\r\n")
        # Every increment first, then a quiet read of each other bucket of the three
        # subjects, marked by its place, then mn: one write, and one reply that ends at MN.
        writes, reads = lines[:6], lines[6:]
        assert all(w.startswith(b"ma ") for w in writes) and end == b"mn"
        assert [r.split(b" ")[::2] for r in reads] == [
            [b"mg", b"v", b"O%d" % i] for i in range(len(reads))
        ]
        assert len({r.split(b"}")[0] for r in reads}) == 3
    reset_backends()


def test_a_blocked_request_counts_nowhere(backend_kind: str, client: Client) -> None:
    with rules(rule("tight", rate="2/m"), rule("loose", rate="10/m")), frozen_clock(T0):
        assert statuses(client, "/rules/named/", 4) == [200, 200, 429, 429]
        loose = core.lookup("loose", "127.0.0.1")
        tight = core.lookup("tight", "127.0.0.1")
    assert loose is not None and loose["count"] == 2  # the refused requests were taken back
    assert tight is not None and tight["count"] == 2


def test_a_refused_client_gets_in_when_the_window_has_room(
    backend_kind: str, client: Client
) -> None:
    with rules(rule("named")), frozen_clock(T0) as clock:
        assert statuses(client, "/rules/named/", 2) == [200, 200]
        for _ in range(5):  # retrying too fast does not extend the wait
            clock.advance(5)
            assert client.get("/rules/named/").status_code == 429
        clock.advance(61 - 25)
        assert client.get("/rules/named/").status_code == 200


def test_json_problem_for_clients_that_prefer_json(client: Client) -> None:
    with rules(rule("named", rate="0/m")):
        response = client.get("/rules/named/", HTTP_ACCEPT="application/json")
    assert response.status_code == 429
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert body["type"] == "about:blank" and body["title"] == "Too Many Requests"
    assert body["status"] == 429 and body["rule"] == "named" and body["rate"] == "0/m"
    assert body["retry_after"] == int(response["Retry-After"]) >= 1
    assert "named" in body["detail"]
    html = client.get("/rules/named/", HTTP_ACCEPT="text/html,application/json;q=0.9")
    assert html["Content-Type"].startswith("text/html")


def test_the_template_can_be_overridden(client: Client, tmp_path: Path) -> None:
    (tmp_path / "ratelimit_app").mkdir()
    (tmp_path / "ratelimit_app" / "429.html").write_text("wait {{ retry_after }}s ({{ rule }})")
    templates = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "DIRS": [str(tmp_path)],
            "APP_DIRS": True,
        }
    ]
    with rules(rule("named", rate="0/m")), override_settings(TEMPLATES=templates):
        response = client.get("/rules/named/")
    assert response.status_code == 429
    assert response.content.decode() == f"wait {response['Retry-After']}s (named)"


def test_a_broken_template_still_answers_429(client: Client, tmp_path: Path) -> None:
    (tmp_path / "ratelimit_app").mkdir()
    (tmp_path / "ratelimit_app" / "429.html").write_text("{% no_such_tag %}")
    templates = [
        {"BACKEND": "django.template.backends.django.DjangoTemplates", "DIRS": [str(tmp_path)]}
    ]
    with rules(rule("named", rate="0/m")), override_settings(TEMPLATES=templates):
        response = client.get("/rules/named/")
    assert response.status_code == 429
    assert response["Content-Type"].startswith("text/plain")


def test_ratelimit_view_wins(client: Client) -> None:
    with rules(
        rule("named", rate="0/m"),
        RATELIMIT_VIEW="tests.ratelimit.views.custom_ratelimited_view",
    ):
        response = client.get("/rules/named/")
    assert response.status_code == 429 and response.content == b"slow down"
    assert int(response["Retry-After"]) >= 1  # added when the view does not set it


def test_a_decorated_views_ratelimited_becomes_the_same_429(client: Client) -> None:
    with rules():
        assert statuses(client, "/blocking/", 3) == [200, 200, 200]
        response = client.get("/blocking/", HTTP_ACCEPT="application/json")
    assert response.status_code == 429
    assert response["RateLimit"].startswith('"3/m";r=0;t=')
    assert json.loads(response.content)["rule"] is None


def test_block_false_annotates_the_request(backend_kind: str, client: Client) -> None:
    with rules(rule("watch", path="/rules/annotated/", block=False)), frozen_clock(T0):
        bodies = [client.get("/rules/annotated/").json() for _ in range(3)]
    assert [b["limited"] for b in bodies] == [False, False, True]
    assert [b["rules"]["watch"] for b in bodies] == [1, 2, 3]


class TestFailureOnly:
    RULE = rule("fail", path="/rules/status/", count="failures")

    def test_only_failures_count_and_the_limit_blocks_before_the_view(
        self, backend_kind: str, client: Client
    ) -> None:
        with rules(self.RULE), frozen_clock(T0):
            assert statuses(client, "/rules/status/200/", 5) == [200] * 5
            assert client.get("/rules/status/401/").status_code == 401
            assert client.get("/rules/status/404/").status_code == 404  # not a failure
            assert client.get("/rules/status/403/").status_code == 403
            # Two failures: the limit is reached, and even a request that would succeed
            # is refused without calling the view.
            assert client.get("/rules/status/200/").status_code == 429
            usage = core.lookup("fail", "127.0.0.1")
        assert usage is not None and usage["count"] == 2

    def test_failure_statuses_setting(self, client: Client) -> None:
        with rules(self.RULE, RATELIMIT_FAILURE_STATUSES=[404]), frozen_clock(T0):
            assert statuses(client, "/rules/status/401/", 3) == [401] * 3
            assert statuses(client, "/rules/status/404/", 3) == [404, 404, 429]

    def test_login_failed_signal_counts_with_djangos_login_view(
        self, backend_kind: str, client: Client, db: Any
    ) -> None:
        User.objects.create_user("alice", password="right-password")
        login = rule("login", path="/accounts/login/", methods="POST", count="failures")
        with rules(login), frozen_clock(T0):
            wrong = {"username": "alice", "password": "wrong"}
            first = client.post("/accounts/login/", wrong)
            assert first.status_code == 200  # Django re-renders the form
            assert client.post("/accounts/login/", wrong).status_code == 200
            assert client.post("/accounts/login/", wrong).status_code == 429
            right = {"username": "alice", "password": "right-password"}
            assert client.post("/accounts/login/", right).status_code == 429

    def test_the_headers_show_no_counter_of_an_account_the_request_names(
        self, backend_kind: str, client: Client, db: Any
    ) -> None:
        """A stranger posting the victim's name with no password is no failure (its hit is
        taken back): the headers of that answer must not tell how many wrong passwords the
        victim's account had, nor when they expire. The client's own address is its own."""
        User.objects.create_user("victim", password="right-password")
        by_account = rule(
            "login-account", path="/accounts/login/", methods="POST", key="post:username"
        )
        by_ip = rule("login-ip", path="/accounts/login/", methods="POST")
        failures = {"count": "failures", "rate": "5/m"}
        with rules({**by_account, **failures}, {**by_ip, **failures}), frozen_clock(T0):
            wrong = {"username": "victim", "password": "wrong"}
            client.post("/accounts/login/", wrong, REMOTE_ADDR="192.0.2.1")
            client.post("/accounts/login/", wrong, REMOTE_ADDR="192.0.2.1")
            probe = client.post(
                "/accounts/login/", {"username": "victim"}, REMOTE_ADDR="198.51.100.9"
            )
            assert probe.status_code == 200
            assert "login-account" not in probe["RateLimit-Policy"]
            assert "login-account" not in probe["RateLimit"]
            assert probe["RateLimit"].startswith('"login-ip:5/m";r=')  # its own address
            # The view still sees it (its own provisional hit included).
            assert probe.wsgi_request.ratelimit_usage["login-account"]["count"] == 3

    def test_successful_logins_never_count(self, client: Client, db: Any) -> None:
        User.objects.create_user("bob", password="right-password")
        login = rule("login", path="/accounts/login/", methods="POST", count="failures")
        with rules(login), frozen_clock(T0):
            right = {"username": "bob", "password": "right-password"}
            assert [client.post("/accounts/login/", right).status_code for _ in range(5)] == [
                302
            ] * 5


class TestAsync:
    async def test_limits_and_headers(self, backend_kind: str, async_client: Any) -> None:
        with rules(rule("async", path="/rules/async/")), frozen_clock(T0):
            codes = [(await async_client.get("/rules/async/")).status_code for _ in range(3)]
            refused = await async_client.get("/rules/async/")
        assert codes == [200, 200, 429]
        assert refused["RateLimit"].startswith('"async:2/m";r=0;t=')

    async def test_failures_count(self, backend_kind: str, async_client: Any) -> None:
        fail = rule("fail", path="/rules/status/", count="failures")
        with rules(fail), frozen_clock(T0):
            codes = [(await async_client.get("/rules/status/401/")).status_code for _ in range(3)]
        assert codes == [401, 401, 429]

    async def test_user_keys_run_off_the_event_loop(self, async_client: Any, db: Any) -> None:
        from asgiref.sync import sync_to_async

        await sync_to_async(User.objects.create_user)("carol", password="pw")
        await async_client.alogin(username="carol", password="pw")
        with rules(rule("user", path="/rules/async/", key="user")), frozen_clock(T0):
            codes = [(await async_client.get("/rules/async/")).status_code for _ in range(3)]
        assert codes == [200, 200, 429]


class TestAccessLists:
    def test_denied_ips_get_403_everywhere(self, client: Client) -> None:
        with rules(rule("named"), RATELIMIT_DENY=["203.0.113.0/24", "2001:db8::/32"]):
            assert client.get("/rules/unnamed/", REMOTE_ADDR="203.0.113.9").status_code == 403
            assert client.get("/rules/named/", REMOTE_ADDR="2001:db8::7").status_code == 403
            assert client.get("/rules/named/", REMOTE_ADDR="198.51.100.1").status_code == 200
            problem = client.get(
                "/rules/named/", REMOTE_ADDR="203.0.113.9", HTTP_ACCEPT="application/json"
            )
        assert problem.status_code == 403 and problem.json()["status"] == 403

    def test_allowed_ips_and_users_skip_every_rule(self, client: Client, db: Any) -> None:
        user = User.objects.create_user("trusted", password="pw")
        allow = ["127.0.0.1", f"user:{user.pk}"]
        with rules(rule("named", rate="0/m"), RATELIMIT_ALLOW=allow):
            assert client.get("/rules/named/").status_code == 200
            assert client.get("/rules/named/", REMOTE_ADDR="192.0.2.1").status_code == 429
            client.force_login(user)
            assert client.get("/rules/named/", REMOTE_ADDR="192.0.2.1").status_code == 200

    def test_an_allowed_email_lifts_only_the_rules_keyed_on_it(self, client: Client) -> None:
        by_email = rule("by-email", key="email:username", rate="0/m")
        by_ip = rule("by-ip", rate="2/m")
        with rules(by_email, by_ip, RATELIMIT_ALLOW=["ada@example.com"]), frozen_clock(T0):
            ada = {"username": " ADA@example.com"}
            assert client.post("/rules/named/", {"username": "bob@x.org"}).status_code == 429
            # The email is only a claim: naming an allowed one never lifts the IP's limit.
            codes = [client.post("/rules/named/", ada).status_code for _ in range(3)]
        assert codes == [200, 200, 429]

    def test_denied_users_and_emails(self, client: Client, db: Any) -> None:
        user = User.objects.create_user("mallory", password="pw")
        deny = [f"user:{user.pk}", "email:eve@example.com"]
        login = rule("login", key="email:username", rate="100/m")
        with rules(login, rule("other", path="/rules/unnamed/"), RATELIMIT_DENY=deny):
            eve = {"username": "Eve@Example.com"}
            assert client.post("/rules/named/", eve).status_code == 403
            # Emails are matched where a rule is keyed on one.
            assert (
                client.post("/rules/unnamed/", {"username": "eve@example.com"}).status_code == 200
            )
            assert client.post("/rules/status/200/", eve).status_code == 200
            client.force_login(user)
            assert client.get("/rules/status/200/").status_code == 403


class TestSignals:
    def test_ratelimited_is_sent_on_every_block(self, client: Client) -> None:
        seen: list[dict[str, Any]] = []

        def receiver(sender: Any, **kwargs: Any) -> None:
            seen.append(kwargs)

        ratelimited.connect(receiver)
        try:
            with rules(rule("named", rate="1/m")), frozen_clock(T0):
                statuses(client, "/rules/named/", 3)
        finally:
            ratelimited.disconnect(receiver)
        assert len(seen) == 2
        assert seen[0]["rule"] == "named" and seen[0]["group"] == "rule:named"
        assert seen[0]["usage"]["should_limit"] and seen[0]["request"].path == "/rules/named/"
        assert "127.0.0.1" not in seen[0]["subject"]  # a hash, never the raw IP


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["memcached", "redis"])
def dead_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    port = dead_port()
    if request.param == "memcached":
        config = {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": f"127.0.0.1:{port}",
        }
    else:
        config = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{port}",
        }
    caches_setting = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(CACHES={**caches_setting, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        yield request.param
    reset_backends()
    caches["default"].clear()


class TestBackendDown:
    def test_rules_fail_open_with_a_log_and_a_signal(
        self, dead_backend: str, client: Client, caplog: pytest.LogCaptureFixture
    ) -> None:
        failures: list[Any] = []

        def receiver(sender: Any, **kwargs: Any) -> None:
            failures.append(kwargs["error"])

        backend_failed.connect(receiver)
        try:
            with rules(rule("named", rate="0/m")), caplog.at_level(logging.WARNING):
                assert statuses(client, "/rules/named/", 3) == [200, 200, 200]
        finally:
            backend_failed.disconnect(receiver)
        assert len(failures) == 3
        assert any("failed" in r.getMessage() for r in caplog.records)

    def test_a_dead_server_is_not_retried_for_a_while(
        self, dead_backend: str, client: Client, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        connects: list[Any] = []
        original = socket.socket.connect

        def connect(sock: socket.socket, address: Any) -> Any:
            connects.append(address)
            return original(sock, address)

        monkeypatch.setattr(socket.socket, "connect", connect)
        with rules(rule("named")):
            statuses(client, "/rules/named/", 5)
        assert len(connects) == 1  # the first failure marks it down for DEAD_RETRY

    def test_fail_closed_rules_answer_their_status(
        self, dead_backend: str, client: Client
    ) -> None:
        with rules(rule("named", fail_open=False)):
            response = client.get("/rules/named/", HTTP_ACCEPT="application/json")
            assert response.status_code == 503
            assert int(response["Retry-After"]) >= 1
            assert response.json()["rule"] == "named"


def test_invalid_rules_are_left_out_not_a_500(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with rules(rule("bad", rate="5/M"), rule("good", rate="0/m")), caplog.at_level(logging.ERROR):
        assert client.get("/rules/named/").status_code == 429  # the good rule applies
    assert any("'bad'" in r.getMessage() for r in caplog.records)


def test_disabled(client: Client) -> None:
    with rules(rule("named", rate="0/m"), RATELIMIT_ENABLE=False):
        assert client.get("/rules/named/").status_code == 200
