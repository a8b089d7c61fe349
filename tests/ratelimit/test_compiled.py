"""The compiled path (ratelimit_app.engine.compiled) gives the general path's answers.

Every scenario runs twice on the same backend, once as the middleware runs it (plain rules
on the compiled path) and once with the compiled path turned off (``applies`` answering
False), and each response, usage dict, signal and round trip must be the same. The tests
also check that the compiled path is the one taken, so that the comparison compares two
paths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Any

import pytest
from django.test import Client, RequestFactory, override_settings

from ratelimit_app import core, store
from ratelimit_app.algorithms import windows
from ratelimit_app.backends import get_backend, reset_backends
from ratelimit_app.config.access import AccessList
from ratelimit_app.config.rules import parse_rule
from ratelimit_app.engine import compiled, enforce
from ratelimit_app.operators import operations
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.signals import ratelimited
from ratelimit_app.testing import frozen_clock, remember_refusals
from tests.ratelimit.conftest import rules
from tests.servers.processes import free_port

T0 = 1_800_000_000.0
_runs = itertools.count()
#: How many times a scenario's run took the compiled path while refusals were remembered.
REMEMBERING = [0]

RULES = [
    {"name": "ip-m", "path": "/rules/named/", "key": "ip", "rate": "3/m"},
    {"name": "ip-h", "path": "/rules/named/", "key": "ip", "rate": "5/h"},
    {"name": "email", "path": "/rules/named/", "key": "post:email", "rate": "2/m"},
    {"name": "several", "path": "/rules/unnamed/", "key": "ip", "rate": "2/s;4/m"},
    {"name": "quota", "path": "/rules/unnamed/", "key": "ip", "quota": "6/month"},
    {"name": "watch", "path": "/rules/unnamed/", "key": "ip", "rate": "1/m", "block": False},
    {"name": "costly", "path": "/rules/unnamed/", "key": "ip", "rate": "10/m", "cost": 3},
]

#: (seconds after T0, method, path, client address, email): a site's traffic, several
#: clients past their limits, refusals that take back the other rules' hits, waits timed.
SCENARIO = [
    (0.0, "get", "/rules/named/", "10.0.0.1", None),
    (0.2, "post", "/rules/named/", "10.0.0.1", "a@example.com"),
    (0.4, "post", "/rules/named/", "10.0.0.2", "a@example.com"),
    (0.6, "post", "/rules/named/", "10.0.0.3", "a@example.com"),
    (1.0, "get", "/rules/named/", "10.0.0.1", None),
    (1.5, "get", "/rules/named/", "10.0.0.1", None),
    (2.0, "head", "/rules/named/", "10.0.0.1", None),
    (3.0, "get", "/rules/unnamed/", "10.0.0.4", None),
    (3.1, "get", "/rules/unnamed/", "10.0.0.4", None),
    (3.2, "get", "/rules/unnamed/", "10.0.0.4", None),
    (4.5, "get", "/rules/unnamed/", "10.0.0.4", None),
    (61.0, "get", "/rules/named/", "10.0.0.1", None),
    (62.0, "post", "/rules/named/", "10.0.0.3", "b@example.com"),
    (70.0, "get", "/rules/unnamed/", "10.0.0.4", None),
    (71.0, "get", "/rules/unnamed/", "::ffff:10.0.0.4", None),
    (72.0, "get", "/rules/unnamed/", "2001:db8::1", None),
]


pytestmark = pytest.mark.usefixtures("rules_site")


class Seen:
    """What a run saw: each response's answer, and the round trips and their ops."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.trips: list[list[tuple[Any, ...]]] = []
        self.signals: list[tuple[Any, ...]] = []
        backend = get_backend()
        execute = backend.execute

        def counting(ops: Any, now_us: int) -> Any:
            self.trips.append([tuple(map(_plain, op)) for op in ops])
            return execute(ops, now_us)

        monkeypatch.setattr(backend, "execute", counting)

    def signalled(self, sender: Any, **kwargs: Any) -> None:
        self.signals.append(
            (kwargs["group"], kwargs.get("rule"), kwargs["subject"], kwargs["usage"])
        )


def _plain(field: Any) -> Any:
    """An op's field as a value (a plan is compared by identity: by its buckets here)."""
    return (field.writes, field.reads) if isinstance(field, windows.Plan) else field


def _choosing(applies: Any, taken: list[bool], general: bool) -> Any:
    """``applies`` as it answers (kept in ``taken``), or False for the ``general`` run.
    ``REMEMBERING`` counts the times it answered True while refusals were remembered."""

    def choosing(*args: Any) -> bool:
        found: bool = applies(*args)
        taken.append(found)
        if found and RUNTIME.refusals.entries:
            REMEMBERING[0] += 1
        return found and not general

    return choosing


def play(
    monkeypatch: pytest.MonkeyPatch,
    general: bool,
    scenario: list[Any],
    prefix: str,
    remembering: bool = False,
) -> tuple[list[Any], Seen]:
    """Run ``scenario`` (on the compiled path, or on the general one) under a key prefix of
    its own, every refusal remembered (``remembering``) or only a flood's; what each
    request was answered, and what the run saw."""
    taken: list[bool] = []
    with (
        monkeypatch.context() as patch,
        override_settings(RATELIMIT_CACHE_PREFIX=prefix),  # (a new refusal memory)
        remember_refusals() if remembering else contextlib.nullcontext(),
    ):
        reset_backends()
        seen = Seen(patch)
        for name in ("applies", "usable"):  # the rules' door, and a single limit's
            patch.setattr(compiled, name, _choosing(getattr(compiled, name), taken, general))
        ratelimited.connect(seen.signalled)
        answers = []
        try:
            for at, method, path, address, email in scenario:
                with frozen_clock(T0 + at):  # (a quota's usage says when it renews: read now)
                    if callable(path):  # a call of get_usage (or the like) of its own
                        answers.append(path(RequestFactory().get("/", REMOTE_ADDR=address)))
                        continue
                    data = {} if email is None else {"email": email}
                    response = getattr(Client(), method)(path, data, REMOTE_ADDR=address)
                    usage = getattr(response.wsgi_request, "ratelimit_usage", None)
                    usage = None if usage is None else dict(usage)
                answers.append(
                    (
                        response.status_code,
                        response.get("RateLimit-Policy"),
                        response.get("RateLimit"),
                        response.get("Retry-After"),
                        usage,
                    )
                )
        finally:
            ratelimited.disconnect(seen.signalled)
        assert any(taken), "the compiled path never applied: nothing was compared"
    reset_backends()
    return answers, seen


def both(
    monkeypatch: pytest.MonkeyPatch, scenario: list[Any], remembering: bool = False
) -> tuple[Any, Any]:
    run = next(_runs)
    return (
        play(monkeypatch, False, scenario, f"compiled-{run}:", remembering),
        play(monkeypatch, True, scenario, f"general-{run}:", remembering),
    )


def test_the_compiled_path_answers_as_the_general_one(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with rules(*RULES):
        (fast, fast_seen), (slow, slow_seen) = both(monkeypatch, SCENARIO)
    for i, (one, other) in enumerate(zip(fast, slow, strict=True)):
        assert one == other, SCENARIO[i]
    assert fast_seen.signals == slow_seen.signals
    assert fast_seen.trips == slow_seen.trips
    statuses = [answer[0] for answer in fast]
    assert 429 in statuses and statuses.count(200) >= 8  # refusals and admissions compared
    assert len(fast_seen.signals) >= 4


def test_a_rule_sets_plans_follow_the_clock_back_and_forth(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled path keeps a rule set's plans for the current fine buckets
    (``compiled.Prepared``): a clock that moves within a bucket, to its last moment and its
    first, into the next and back, sends the general path's ops (plans) every time."""
    second = 1 / 60  # (a 1/s rate's fine bucket; the 1/m rate's is a second)
    times = [5.0, 5.0 + second / 2, 6.0 - 1e-9, 6.0, 5.5, 70.0, 3.0, 3.0 + second, 130.0, 7.0]
    scenario = [(at, "get", "/rules/unnamed/", "10.0.0.9", None) for at in times]
    plain = [rule for rule in RULES if rule["name"] in ("several", "costly")]
    with rules(*plain):
        (fast, fast_seen), (slow, slow_seen) = both(monkeypatch, scenario)
    assert fast == slow
    assert fast_seen.trips == slow_seen.trips
    assert len({str(trip) for trip in fast_seen.trips}) >= 6  # plans of several buckets


def test_a_rule_sets_plans_follow_the_layout(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule set prepared under one layout (buckets per window) is made again under
    another, within the same fine bucket: the ops are the general path's."""

    def layout(per_window: int) -> Any:
        def change(request: Any) -> None:
            monkeypatch.setattr(windows, "BUCKETS_PER_WINDOW", per_window)

        return change

    get = (5.0, "get", "/rules/unnamed/", "10.0.0.9", None)
    scenario = [
        (5.0, None, layout(60), "10.0.0.9", None),
        get,
        (5.0, None, layout(12), "10.0.0.9", None),
        get,
        (5.0, None, layout(60), "10.0.0.9", None),
    ]
    plain = [rule for rule in RULES if rule["name"] in ("several", "costly")]
    with rules(*plain):
        (fast, fast_seen), (slow, slow_seen) = both(monkeypatch, scenario)
    assert fast == slow
    assert fast_seen.trips == slow_seen.trips
    first, second = fast_seen.trips
    assert first != second  # (the layouts' plans differ: the comparison compares them)


def test_the_compiled_path_is_the_one_taken_for_plain_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    general: list[Any] = []
    deciding = enforce.deciding
    monkeypatch.setattr(
        enforce, "deciding", lambda *a, **k: general.append(a) or deciding(*a, **k)
    )
    with rules(*RULES[:2]), frozen_clock(T0):
        assert Client().get("/rules/named/").status_code == 200
        assert general == []  # the compiled path decided it
        with rules(*RULES[:2], {**RULES[0], "name": "dry", "shadow": True}):
            assert Client().get("/rules/named/").status_code == 200
        assert len(general) == 1  # a dry run is no plain rule: the general path


def test_a_single_limit_on_the_compiled_path_answers_as_on_the_general_one(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``get_usage`` and ``@ratelimit`` (one limit each, ``core.limit_verdicting``)."""

    def usage(**limit: Any) -> Any:
        return lambda request: core.get_usage(request, key="ip", **{"increment": True, **limit})

    calls = [
        usage(group="one", rate="2/m"),
        usage(group="two", rate="2/s;3/m"),
        usage(group="costly", rate="5/m", cost=2),
        usage(group="quota", quota="3/month"),
        usage(group="look", rate="2/m", increment=False),
    ]
    scenario = [
        (at, "get", call, address, None)
        for at in (0.0, 0.3, 0.6, 1.2, 40.0)
        for address in ("10.1.0.1", "10.1.0.2")
        for call in calls
    ]
    scenario += [(at, "get", "/blocking/", "10.1.0.3", None) for at in (0.0, 1.0, 2.0, 3.0, 4.0)]
    scenario += [(at, "get", "/stacked/", "10.1.0.4", None) for at in (0.0, 1.0, 2.0, 3.0)]
    (fast, fast_seen), (slow, slow_seen) = both(monkeypatch, scenario)
    for i, (one, other) in enumerate(zip(fast, slow, strict=True)):
        assert one == other, scenario[i][:2]
    assert fast_seen.signals == slow_seen.signals
    assert fast_seen.trips == slow_seen.trips
    limited = [a for a in fast if isinstance(a, dict) and a["should_limit"]]
    assert len(limited) >= 8  # refusals compared, not only admissions
    assert [a[0] for a in fast[-9:]] == [200, 200, 200, 429, 429, 200, 200, 429, 429]


@pytest.mark.django_db
def test_a_ban_held_goes_to_the_general_path_before_any_round_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = {"name": "plain", "path": "/rules/named/", "key": "ip", "rate": "100/m"}
    scenario = [
        (0.0, "get", "/rules/named/", "10.0.0.9", None),
        (1.0, "get", "/rules/named/", "10.0.0.8", None),
        (2.0, "get", "/rules/named/", "::ffff:10.0.0.9", None),
    ]
    with rules(plain), frozen_clock(T0):
        assert operations.ban("plain", "10.0.0.9", 600) is not None
        (fast, fast_seen), (slow, slow_seen) = both(monkeypatch, scenario)
    assert fast == slow
    assert [a[0] for a in fast] == [429, 200, 429]
    assert len(fast_seen.trips) == len(slow_seen.trips) == 1  # the banned ones: none


@pytest.mark.django_db
def test_an_override_in_force_sets_the_compiled_path_aside() -> None:
    from ratelimit_app.models import Override
    from ratelimit_app.overrides import applied

    plain = {"name": "plain", "path": "/rules/named/", "key": "ip", "rate": "100/m"}
    row = Override(limit="plain", subject="10.0.0.9", rate="1/m")
    row.full_clean()
    row.save()
    try:
        with rules(plain):
            current = store.current()
            assert not compiled.applies(current.rules.rules, current)
            found = []
            for at in (0.0, 1.0, 2.0):
                for address in ("10.0.0.9", "10.0.0.8"):
                    with frozen_clock(T0 + at):
                        response = Client().get("/rules/named/", REMOTE_ADDR=address)
                    found.append(response.status_code)
    finally:
        applied.forget()
    assert found == [200, 200, 429, 200, 429, 200]  # the override's 1/m, the rule's 100/m


@pytest.mark.parametrize(
    ("fields", "status"),
    [({}, 200), ({"fail_open": False}, 503), ({"fallback": "memory"}, 200)],
)
def test_a_failure_is_the_general_paths(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], status: int
) -> None:
    dead = {  # (nothing listens there)
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": f"127.0.0.1:{free_port()}",
    }
    one = {"name": "dead", "path": "/rules/named/", "key": "ip", "rate": "1/m", **fields}
    scenario = [(float(i), "get", "/rules/named/", "10.0.0.5", None) for i in range(3)]
    caches_setting = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    dead_settings = override_settings(
        CACHES={**caches_setting, "rl": dead}, RATELIMIT_USE_CACHE="rl"
    )
    with dead_settings, rules(one):
        (fast, _), (slow, _) = both(monkeypatch, scenario)
    reset_backends()
    assert fast == slow
    assert fast[0][0] == status
    if "fallback" in fields:  # counted in memory: the second request is refused
        assert [a[0] for a in fast] == [200, 429, 429]


def test_plain_rules_are_the_rules_that_only_count() -> None:
    base = {"name": "r", "path": "/x/", "key": "ip", "rate": "5/m"}
    assert parse_rule(base).plain
    assert parse_rule({**base, "rate": "2/s;5/m"}).plain
    assert parse_rule({"name": "q", "path": "/x/", "key": "ip", "quota": "10/day"}).plain
    assert parse_rule({**base, "cost": 3}).plain
    assert parse_rule({**base, "block": False}).plain
    for other in (
        {"shadow": True},
        {"count": "failures"},
        {"concurrent": 2},
        {"algorithm": "leaky_bucket"},
        {"ban": {"after": 2, "within": "1h", "for": "10m"}},
        {"rate": "tests.ratelimit.test_rates.rate_for"},
    ):
        assert not parse_rule({**base, **other}).plain, other


def test_the_compiled_path_stands_aside_while_something_in_force_could_change_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with rules(*RULES[:3]):
        current = store.current()
        found = current.rules.rules
        assert compiled.applies(found, current)
        assert not compiled.applies((), current)
        monkeypatch.setattr(windows, "HIERARCHICAL", True)
        assert not compiled.applies(found, current)
        monkeypatch.setattr(windows, "HIERARCHICAL", False)
        assert compiled.applies(found, current)
        listed = AccessList(emails=frozenset({"a@example.com"}))
        assert not compiled.applies(found, dataclasses.replace(current, allow=listed))
        assert not compiled.applies(found, dataclasses.replace(current, deny=listed))


def test_refusals_remembered_leave_the_compiled_path_to_other_subjects(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site that refused anyone lately remembers it: the compiled path stays for the
    others, and a request of a remembered subject goes to the general path (which answers
    it from memory)."""
    REMEMBERING[0] = 0
    flood = [(80.0 + i / 10, "get", "/rules/named/", "10.0.0.9", None) for i in range(7)]
    flood.insert(-1, (80.55, "get", "/rules/named/", "10.0.0.8", None))  # (another client)
    scenario = SCENARIO + flood
    general: list[str] = []  # the clients the compiled path sent to the general one
    deciding = enforce.deciding

    def asked(request: Any, *args: Any, **kwargs: Any) -> Any:
        general.append(request.META["REMOTE_ADDR"])
        return deciding(request, *args, **kwargs)

    run = next(_runs)
    with rules(*RULES):
        with monkeypatch.context() as patch:
            patch.setattr(enforce, "deciding", asked)
            fast, fast_seen = play(monkeypatch, False, scenario, f"compiled-{run}:", True)
        slow, slow_seen = play(monkeypatch, True, scenario, f"general-{run}:", True)
    for i, (one, other) in enumerate(zip(fast, slow, strict=True)):
        assert one == other, scenario[i]
    assert fast_seen.signals == slow_seen.signals
    assert fast_seen.trips == slow_seen.trips
    flooded = [answer[0] for answer in fast[-8:]]
    assert flooded.count(429) >= 4 and flooded[-2] == 200  # (the other client admitted)
    # The flood's remembered refusals went to the general path; the other client, admitted
    # meanwhile, did not.
    assert general.count("10.0.0.9") >= 3 and "10.0.0.8" not in general
    assert REMEMBERING[0] >= 4  # (the compiled path taken while refusals were remembered)


def test_an_admitted_count_makes_its_decisions_only_when_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An admitted request of plain rules (``compiled.Admitted``) makes no decision nor
    result unless something reads them; read, they are the general path's."""
    made: list[Any] = []
    init = enforce.Decision.__init__

    def counting(self: Any, *args: Any) -> None:
        made.append(args)
        init(self, *args)

    monkeypatch.setattr(enforce.Decision, "__init__", counting)
    with rules(*RULES[:3]), frozen_clock(T0):
        # (The first request of a limit an exporter has not seen yet reads its decision.)
        client = Client(REMOTE_ADDR="10.3.0.1")
        assert client.post("/rules/named/", {"email": "d@example.com"}).status_code == 200
        made.clear()
        response = client.post("/rules/named/", {"email": "c@example.com"})
        assert response.status_code == 200
        assert response["RateLimit"] == '"ip-m:3/m";r=1;t=61, "ip-h:5/h";r=3;t=3660'
        assert made == []  # headers and all, from the counts
        usage = response.wsgi_request.ratelimit_usage
        assert usage["email"]["remaining"] == 1 and len(made) == 3
        assert usage["ip-m"]["count"] == 2 and len(made) == 3  # made once
        (verdict,) = response.wsgi_request._ratelimit.verdicts
        assert type(verdict) is compiled.Admitted
        assert [d.shown for d in verdict.decisions] == [True, True, False]
        assert all(d.provisional() and not d.refused for d in verdict.decisions)
