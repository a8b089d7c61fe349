"""Refusals remembered per process (ratelimit_app/engine/refusals.py): a flood costs no round
trip.

A subject refused with an exact wait is refused again from memory until the wait ends or
its cap (``engine.memory.REFUSAL_MEMORY`` seconds) passes; the answer stays correct
(``Retry-After`` and the ``RateLimit`` headers count down, the signal is sent); a reset in
this process is seen at once, one elsewhere within the cap.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest
from django.test import Client, RequestFactory, override_settings

from ratelimit_app import core, signals
from ratelimit_app.algorithms import windows
from ratelimit_app.backends import get_backend
from ratelimit_app.engine.refusals import memory as refusals
from ratelimit_app.engine.refusals import remembered as memory
from ratelimit_app.identity import keys
from ratelimit_app.operators import operations
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import RoundTrips, rules

T0 = 1_800_000_000.0


pytestmark = pytest.mark.usefixtures("rules_site")


def rule(name: str = "flood", **fields: Any) -> dict[str, Any]:
    return {"name": name, "path": "/rules/named/", "key": "ip", "rate": "2/m", **fields}


def test_a_refused_subject_is_refused_from_memory_until_its_wait_ends(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "REFUSAL_MEMORY", 120)
    with rules(rule()), frozen_clock(T0) as clock:
        trips = RoundTrips(monkeypatch)
        assert [client.get("/rules/named/").status_code for _ in range(2)] == [200, 200]
        clock.advance(10)
        first = client.get("/rules/named/")
        assert first.status_code == 429
        wait = int(first["Retry-After"])
        assert 45 <= wait <= 51
        before = trips.count
        later = []
        for _ in range(5):
            clock.advance(3)
            later.append(client.get("/rules/named/"))
        assert trips.count == before  # no round trip at all
        assert [r.status_code for r in later] == [429] * 5
        assert [int(r["Retry-After"]) for r in later] == [wait - 3 * k for k in range(1, 6)]
        assert later[-1]["RateLimit"] == f'"flood:2/m";r=0;t={wait - 15}'
        assert later[-1]["RateLimit-Policy"] == first["RateLimit-Policy"]
        assert b"Please wait" in later[-1].content
        clock.advance(wait - 15)  # the wait is over: asked again, and admitted
        assert client.get("/rules/named/").status_code == 200
        assert trips.count == before + 1


def test_the_cap_bounds_what_memory_cannot_see(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reset made elsewhere (here: the counters deleted behind this process's back) is
    seen within the cap (here 2 s)."""
    monkeypatch.setattr(memory, "REFUSAL_MEMORY", 2)
    with rules(rule()), frozen_clock(T0) as clock:
        trips = RoundTrips(monkeypatch)
        statuses = [client.get("/rules/named/").status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        target = operations.target("flood", "127.0.0.1")
        assert target is not None
        ns = keys.namespace(target.scope, "ip", "127.0.0.1")
        get_backend().delete(
            ns, sorted(windows.stored_suffixes(target.rates, clock(), 60))
        )  # another process's reset: this one is not told
        before = trips.count
        clock.advance(1.5)
        assert client.get("/rules/named/").status_code == 429  # from memory
        assert trips.count == before
        clock.advance(0.5)
        assert client.get("/rules/named/").status_code == 200  # the cap ran out: asked
        assert trips.count == before + 2  # a look (room after all), then the counted check


def test_a_due_refusal_is_confirmed_by_one_look(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap runs out before the wait: one round trip that writes nothing confirms the
    refusal (a counted check that is refused makes two), and the answer stays exact."""
    monkeypatch.setattr(memory, "REFUSAL_MEMORY", 2)
    with rules(rule(rate="2/h")), frozen_clock(T0) as clock:
        assert [client.get("/rules/named/").status_code for _ in range(2)] == [200, 200]
        clock.advance(60)
        first = client.get("/rules/named/")
        assert first.status_code == 429
        wait = int(first["Retry-After"])
        assert 3540 <= wait <= 3600  # the hits leave with their fine bucket (60 s)
        counts = [r["count"] for r in core.lookup("flood", "127.0.0.1")["rates"]]
        assert counts == [2]
        writes = RoundTrips(monkeypatch)
        answers = []
        for _ in range(10):  # five caps' worth
            clock.advance(1)
            answers.append(client.get("/rules/named/"))
        assert [r.status_code for r in answers] == [429] * 10
        assert [int(r["Retry-After"]) for r in answers] == [wait - k for k in range(1, 11)]
        assert writes.count == 5 and writes.writing == 0  # one look a cap, no writes
        assert [r["count"] for r in core.lookup("flood", "127.0.0.1")["rates"]] == counts
        clock.advance(wait - 10)  # the wait is over: counted, and admitted
        assert client.get("/rules/named/").status_code == 200


def test_a_reset_in_this_process_is_seen_at_once(backend_kind: str, client: Client) -> None:
    with rules(rule()), frozen_clock(T0):
        assert [client.get("/rules/named/").status_code for _ in range(3)] == [200, 200, 429]
        assert core.reset("flood", "127.0.0.1")
        assert client.get("/rules/named/").status_code == 200


def test_the_signal_and_metrics_go_on_for_remembered_refusals(
    backend_kind: str, client: Client
) -> None:
    seen: list[str] = []

    def receiver(sender: Any, rule: str | None = None, **kwargs: Any) -> None:
        seen.append(rule or "")

    signals.ratelimited.connect(receiver)
    try:
        with rules(rule()), frozen_clock(T0):
            codes = [client.get("/rules/named/").status_code for _ in range(6)]
    finally:
        signals.ratelimited.disconnect(receiver)
    assert codes == [200, 200, 429, 429, 429, 429]
    assert seen == ["flood"] * 4


def test_a_botnet_costs_one_check_per_subject(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Client()
    addresses = [f"198.51.100.{i}" for i in range(1, 61)]  # locmem keeps 300 keys
    with rules(rule(rate="1/m")), frozen_clock(T0):
        trips = RoundTrips(monkeypatch)
        for ip in addresses:
            assert client.get("/rules/named/", REMOTE_ADDR=ip).status_code == 200
        admitted = trips.count
        codes = [
            client.get("/rules/named/", REMOTE_ADDR=ip).status_code
            for _ in range(4)
            for ip in addresses
        ]
    assert set(codes) == {429}
    # Each subject's first refusal: the check, then the take-back with the exact read.
    assert trips.count - admitted == 2 * len(addresses)


def test_the_decorator_and_get_usage_share_the_memory(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.44")
    with frozen_clock(T0) as clock:
        trips = RoundTrips(monkeypatch)
        usages = [
            core.get_usage(request, "g", key="ip", rate="1/m", increment=True) for _ in range(4)
        ]
        assert trips.count == 1 + 2  # admitted; refused (check + exact read); then memory
        assert [u and u["should_limit"] for u in usages] == [False, True, True, True]
        clock.advance(3)
        usage = core.get_usage(request, "g", key="ip", rate="1/m", increment=True)
        assert usage is not None and usage["retry_after"] == usages[1]["retry_after"] - 3  # type: ignore[index]
        look = core.get_usage(request, "g", key="ip", rate="1/m")  # a look asks the backend
        assert trips.count == 3 + 2 and look is not None and look["should_limit"]
    client = Client()
    monkeypatch.setattr(memory, "REFUSAL_MEMORY", 60)
    with frozen_clock(T0):
        trips = RoundTrips(monkeypatch)
        codes = [client.get("/blocking/").status_code for _ in range(8)]
        assert codes == [200, 200, 200] + [429] * 5
        assert trips.count == 3 + 2


def test_a_conservative_wait_is_not_remembered(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hierarchical buckets time a wait up to one coarse bucket late: not exact, so each
    refusal asks the backend."""
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.45")
    monkeypatch.setattr(windows, "HIERARCHICAL", True)
    with frozen_clock(T0):
        trips = RoundTrips(monkeypatch)
        for _ in range(4):
            core.get_usage(request, "h", key="ip", rate="1/m", increment=True)
    assert trips.count == 1 + 2 * 3  # each refusal: the check, then the take-back
    assert len(RUNTIME.refusals) == 0


def test_zero_turns_the_memory_off(backend_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.46")
    monkeypatch.setattr(memory, "REFUSAL_MEMORY", 0)
    with frozen_clock(T0):
        trips = RoundTrips(monkeypatch)
        for _ in range(4):
            core.get_usage(request, "z", key="ip", rate="1/m", increment=True)
    assert trips.count == 1 + 2 * 3


# -- the memory itself -------------------------------------------------------------------


def test_the_memory_is_bounded_least_recently_used() -> None:
    memory: refusals.Memory[str] = refusals.Memory(size=2)
    memory.remember("a", 0, 10, "A")
    memory.remember("b", 0, 10, "B")
    assert memory.recall("a", 1) == (1, "A")  # "a" used last: "b" is the oldest now
    memory.remember("c", 0, 10, "C")
    assert memory.recall("b", 1) is None
    assert memory.recall("a", 2) == (2, "A") and memory.recall("c", 2) == (2, "C")
    assert memory.recall("a", 10) is None  # ended
    assert memory.recall("c", -1) is None  # the clock went back: not trusted
    assert len(memory) == 0


def test_holds_tells_whether_any_key_has_an_entry() -> None:
    memory: refusals.Memory[str] = refusals.Memory()
    assert not memory.holds(["a", None])
    memory.remember("a", 0, 10, "A")
    assert memory.holds([None, "a"]) and not memory.holds(["b", None])
    assert memory.holds(["a"])  # ended or not: recall and due decide that


def test_subjects_not_remembered_are_not_looked_up_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A site that refused anyone lately holds refusals, and every checked request asks the
    memory about its own subjects: those not remembered cost one lock-free look each, not a
    recall and a due under the lock."""
    request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.9")
    with frozen_clock(1_000_000.0):
        for _ in range(2):  # another subject, refused and remembered
            core.get_usage(request, "flooded", key="ip", rate="1/h", increment=True)
        assert len(RUNTIME.refusals)
        looked: list[object] = []
        for name in ("recall", "due"):
            real = getattr(RUNTIME.refusals, name)
            monkeypatch.setattr(
                RUNTIME.refusals, name, lambda *a, _real=real: looked.append(a) or _real(*a)
            )
        other = RequestFactory().get("/", REMOTE_ADDR="198.51.100.4")
        usage = core.get_usage(other, "flooded", key="ip", rate="1/h", increment=True)
        assert usage is not None and not usage["should_limit"]
        assert looked == []
        refused = core.get_usage(request, "flooded", key="ip", rate="1/h", increment=True)
        assert refused is not None and refused["should_limit"] and looked  # from memory


def test_threads_share_one_memory_safely() -> None:
    memory: refusals.Memory[int] = refusals.Memory(size=100)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(2000):
                memory.remember((n, i % 150), 0, 10, i)
                memory.recall((n, (i * 7) % 150), 1)
                if i % 97 == 0:
                    memory.forget([(n, i % 150)])
        except BaseException as exc:  # pragma: no cover - the failure being tested for
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(memory) <= 100


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_inherit_a_held_lock() -> None:
    """gunicorn --preload forks while other threads may hold the lock."""
    memory: refusals.Memory[str] = refusals.Memory()
    refusals.after_fork(memory)
    memory.remember("a", 0, 10, "A")
    with memory._lock:  # another thread is inside the memory at the fork
        pid = os.fork()
        if pid == 0:  # the child: must not deadlock
            signal.alarm(5)
            memory.remember("b", 0, 10, "B")
            ok = memory.recall("a", 1) == (1, "A") and memory.recall("b", 1) == (1, "B")
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_test_suite_that_clears_the_cache_forgets_the_refusals_too(
    backend_kind: str,
) -> None:
    from django.core.cache import caches

    from ratelimit_app.testing import forget_refusals

    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.47")
    with frozen_clock(T0):
        for _ in range(2):
            core.get_usage(request, "t", key="ip", rate="1/m", increment=True)
        caches["rl"].clear()  # what a test's setUp does
        forget_refusals()
        usage = core.get_usage(request, "t", key="ip", rate="1/m", increment=True)
    assert usage is not None and not usage["should_limit"]


def test_the_memory_holds_at_most_refusal_memory_size_subjects(
    backend_kind: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``engine.memory.REFUSAL_MEMORY_SIZE``: the least recently refused subject is forgotten
    (its next request is checked again, with a round trip); the others are still refused
    from memory."""
    addresses = ["192.0.2.61", "192.0.2.62", "192.0.2.63"]
    monkeypatch.setattr(memory, "REFUSAL_MEMORY", 60)
    monkeypatch.setattr(RUNTIME.refusals, "size", 2)
    with rules(rule(rate="1/m")), frozen_clock(T0):
        for address in addresses:
            assert client.get("/rules/named/", REMOTE_ADDR=address).status_code == 200
            assert client.get("/rules/named/", REMOTE_ADDR=address).status_code == 429
        assert len(RUNTIME.refusals) == 2
        trips = RoundTrips(monkeypatch)
        for address in addresses[1:]:  # remembered: no round trip
            assert client.get("/rules/named/", REMOTE_ADDR=address).status_code == 429
        assert trips.count == 0
        # The first was forgotten: checked again (still refused, by the counters).
        assert client.get("/rules/named/", REMOTE_ADDR=addresses[0]).status_code == 429
        assert trips.count > 0


def test_a_few_refusals_are_not_remembered_so_cache_clear_alone_resets_a_limit(
    backend_kind: str,
) -> None:
    """What a project's suite written for django-ratelimit does in ``setUp``: no helper of
    ours, just ``cache.clear()`` (the suite-wide fixture keeps the memory on for our own
    tests; here it is as a project has it). No test environment is detected: a process
    remembers refusals only while it refuses a flood."""
    from django.core.cache import caches

    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.48")
    before = memory.remember_always(False)
    forget_refusals()
    try:
        with frozen_clock(T0):
            for _ in range(3):
                core.get_usage(request, "t", key="ip", rate="1/m", increment=True)
            assert len(RUNTIME.refusals) == 0  # two refusals: nothing remembered
            caches["rl"].clear()
            usage = core.get_usage(request, "t", key="ip", rate="1/m", increment=True)
            assert usage is not None and not usage["should_limit"] and usage["count"] == 1
            for _ in range(memory.FLOOD + 1):  # a flood of refusals...
                core.get_usage(request, "t", key="ip", rate="1/m", increment=True)
            assert len(RUNTIME.refusals) == 1  # ...is remembered
    finally:
        memory.remember_always(before)
        forget_refusals()


def test_the_flood_gate_counts_this_second_and_the_one_before() -> None:
    memory: refusals.Memory[str] = refusals.Memory(flood=3)
    assert [memory.flooding(10.1), memory.flooding(10.9)] == [False, False]
    assert memory.flooding(11.0)  # 1 now + 2 the second before
    assert not memory.flooding(13.0)  # a second with none in between: counted afresh
    memory.always = True
    assert memory.flooding(20.0)


# -- the 429 page ------------------------------------------------------------------------


def test_the_429_page_is_rendered_once_per_answer(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rendering the template cost more than a check (124 µs against 20 µs kept): this app's
    own pages are kept per distinct answer; a project's override is rendered every time,
    with the request (it may use it)."""
    from django.template import loader

    from ratelimit_app.engine import responses
    from ratelimit_app.exceptions import Ratelimited

    usage = {"rate": "2/m", "retry_after": 7, "should_limit": True, "remaining": 0, "rates": []}
    request = RequestFactory().get("/")
    RUNTIME.drop(responses._Answers)
    rendered = []
    render = responses._render
    monkeypatch.setattr(responses, "_render", lambda *a: rendered.append(a) or render(*a))
    pages = [
        responses.too_many_requests(request, Ratelimited(), usage, "flood").content
        for _ in range(3)
    ]
    fresh = loader.render_to_string(
        "ratelimit_app/429.html",
        {
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": "This request exceeds the limit 2/m of rule 'flood'. Try again in 7 "
            "seconds.",
            "retry_after": 7,
            "rule": "flood",
            "rate": "2/m",
        },
    ).encode()
    assert pages == [fresh] * 3
    assert len(rendered) == 1
    (tmp_path / "ratelimit_app").mkdir()
    (tmp_path / "ratelimit_app" / "problem.html").write_text("{{ request.path }}: {{ detail }}")
    templates = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "DIRS": [str(tmp_path)],
            "APP_DIRS": True,
            "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
        }
    ]
    with override_settings(TEMPLATES=templates):  # overrides the page 429.html extends
        page = responses.too_many_requests(
            RequestFactory().get("/where/"), Ratelimited(), usage, "flood"
        )
    # From its context alone (no request: a page kept for one client is shown to the next).
    assert page.content.decode().startswith(": This request exceeds")


@pytest.mark.parametrize("charset", ["utf-8", "iso-8859-1"])
def test_a_kept_page_is_encoded_as_its_response_says(tmp_path: Any, charset: str) -> None:
    """A page is kept encoded; its bytes are the page in the response's charset, whatever
    ``DEFAULT_CHARSET`` says when it is answered (a page kept in another is not reused)."""
    from ratelimit_app.engine import responses
    from ratelimit_app.exceptions import Ratelimited

    (tmp_path / "ratelimit_app").mkdir()
    (tmp_path / "ratelimit_app" / "429.html").write_text("Café · wait {{ retry_after }} s")
    templates = [
        {"BACKEND": "django.template.backends.django.DjangoTemplates", "DIRS": [str(tmp_path)]}
    ]
    usage = {"rate": "2/m", "retry_after": 9, "should_limit": True, "remaining": 0, "rates": []}
    RUNTIME.drop(responses._Answers)

    def answered() -> Any:
        return responses.too_many_requests(RequestFactory().get("/"), Ratelimited(), usage)

    with override_settings(TEMPLATES=templates):
        assert answered().content == "Café · wait 9 s".encode()
        with override_settings(DEFAULT_CHARSET=charset):
            page = answered()
            assert page.charset == charset
            assert page.content == "Café · wait 9 s".encode(charset)
            assert answered().content == page.content  # (kept)


def test_a_projects_page_is_rendered_from_its_context_alone_and_kept(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ratelimit_app.engine import responses
    from ratelimit_app.exceptions import Ratelimited

    (tmp_path / "ratelimit_app").mkdir()
    (tmp_path / "ratelimit_app" / "429.html").write_text(
        "[{{ request.path }}] wait {{ retry_after }}s"
    )
    templates = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "DIRS": [str(tmp_path)],
            "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
        }
    ]
    usage = {"rate": "2/m", "retry_after": 7, "should_limit": True, "remaining": 0, "rates": []}
    rendered = []
    render = responses._render
    monkeypatch.setattr(responses, "_render", lambda *a: rendered.append(a) or render(*a))
    with override_settings(TEMPLATES=templates):
        pages = {
            responses.too_many_requests(RequestFactory().get(p), Ratelimited(), usage).content
            for p in ("/a/", "/b/")
        }
        assert pages == {b"[] wait 7s"}  # from its context alone, once
        assert len(rendered) == 1


def test_a_flood_is_counted_not_logged_request_by_request(
    backend_kind: str, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with rules(rule()), frozen_clock(T0), caplog.at_level("WARNING", "django.request"):
        codes = [client.get("/rules/named/").status_code for _ in range(8)]
    assert codes == [200, 200] + [429] * 6
    logged = [r for r in caplog.records if r.name == "django.request"]
    assert len(logged) == 1  # the refusal that was checked; the repeats came from memory


def test_a_refusal_is_due_between_its_cap_and_the_end_of_its_wait() -> None:
    memory: refusals.Memory[str] = refusals.Memory()
    memory.remember("a", 0, 5, "A", ends=20)
    assert memory.recall("a", 4) == (4, "A") and memory.due("a", 4) is None
    assert memory.recall("a", 6) is None  # the cap ran out: not refused from memory...
    assert memory.due("a", 6) == (6, 14, "A")  # ...but due for a look
    assert memory.due("a", 20) is None and len(memory) == 0  # the wait ended: forgotten
    memory.remember("b", 0, 5, "B")  # no end given: the wait ends with the cap
    assert memory.due("b", 6) is None and len(memory) == 0


def test_a_crowds_refusals_are_not_logged_one_by_one_once_they_flood(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A crowd of subjects, each refused once: django.request logs the refusals before the
    process counts a flood (``Memory.flood`` a second), not the thousands after; each is
    still signalled."""
    sent: list[dict[str, Any]] = []

    def receive(**kwargs: Any) -> None:
        sent.append(kwargs)

    signals.ratelimited.connect(receive)
    forget_refusals()
    crowd = [f"198.51.{n // 256}.{n % 256}" for n in range(300)]
    roomy = {  # (a local-memory cache culls at 300 keys by default: counts would be lost)
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "crowd",
        "OPTIONS": {"MAX_ENTRIES": 100_000},
    }
    caches = {"default": roomy, "crowd": roomy}
    try:
        with (
            override_settings(CACHES=caches, RATELIMIT_USE_CACHE="crowd"),
            rules(rule(rate="1/m")),
            frozen_clock(T0 + 0.5),
        ):
            for ip in crowd:
                assert client.get("/rules/named/", REMOTE_ADDR=ip).status_code == 200
            with caplog.at_level("WARNING", logger="django.request"):
                refused = [client.get("/rules/named/", REMOTE_ADDR=ip) for ip in crowd]
    finally:
        signals.ratelimited.disconnect(receive)
        forget_refusals()
    assert {r.status_code for r in refused} == {429} and len(sent) == len(crowd)
    logged = [r for r in caplog.records if "Too Many Requests" in r.getMessage()]
    flood = RUNTIME.refusals.flood
    assert flood - 2 <= len(logged) <= flood, len(logged)
