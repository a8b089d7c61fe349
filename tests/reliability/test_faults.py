"""Faults: counter servers and the database die, hang and come back under load.

Every server here is the test's own (:mod:`tests.reliability.procs`), on a free loopback port,
so killing it hurts no other test; every wait has a deadline. Measured numbers go to
``tests/artifacts/reliability.json`` and ``docs/reliability.rst``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
from django.test import Client, override_settings

from ratelimit_app.backends import base, reset_backends
from ratelimit_app.backends.base import Server
from ratelimit_app.engine.refusals import remembered as memory
from tests.conftest import start_or_skip
from tests.reliability import procs, worker
from tests.reliability.common import ROOT, end, ms, report, summary
from tests.reliability.conftest import finish, run, spawn, worker_env
from tests.servers import wait_for

#: The limit of the open rule: small, so the subject is over it within a few requests.
LIMIT = 10
RULES = [
    {"name": "open", "path": "/open/", "key": "ip", "rate": f"{LIMIT}/m"},
    {"name": "closed", "path": "/closed/", "key": "ip", "rate": "100000/m", "fail_open": False},
]
#: How long a failed server is skipped here (``backends.base.DEAD_RETRY`` is 5 s).
DEAD_RETRY = 1.0
SOCKET_TIMEOUT = base.SOCKET_TIMEOUT


def cache_config(kind: str, server: procs.Restartable) -> dict[str, Any]:
    if kind == "memcached":
        return {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": server.address,
        }
    return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url}


@contextlib.contextmanager
def limiter(
    config: dict[str, Any],
    dead_retry: float = DEAD_RETRY,
    refusal_memory: float = memory.REFUSAL_MEMORY,
    **extra: Any,
) -> Iterator[None]:
    """RatelimitMiddleware with :data:`RULES` on ``config``; settings rules only (no DB)."""
    with (
        mock.patch.object(base, "DEAD_RETRY", dead_retry),
        mock.patch.object(memory, "REFUSAL_MEMORY", refusal_memory),
        override_settings(
            CACHES={
                "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
                "rl": config,
            },
            RATELIMIT_USE_CACHE="rl",
            RATELIMIT_RULES=RULES,
            ROOT_URLCONF="tests.reliability.urls",
            **extra,
        ),
    ):
        reset_backends()
        try:
            yield
        finally:
            reset_backends()


@dataclass
class Hit:
    path: str
    started: float
    took: float
    status: int  # 0: the request raised (a 500 through a real server)
    error: str = ""


@dataclass
class Load:
    """Client threads hitting the rules of one subject until stopped; every response kept."""

    paths: tuple[str, ...]
    hits: list[Hit] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for path in self.paths:
            thread = threading.Thread(target=self._run, args=(path,), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads), "a client thread hung"

    def _run(self, path: str) -> None:
        client = Client(REMOTE_ADDR="203.0.113.7")
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                status, error = client.get(path).status_code, ""
            except Exception as exc:  # the test client re-raises what would be a 500
                status, error = 0, repr(exc)
            self.hits.append(Hit(path, started, time.monotonic() - started, status, error))
            time.sleep(0.002)  # a steady stream, not a spin that starves the main thread

    def between(self, path: str, start: float, end: float = float("inf")) -> list[Hit]:
        """The hits on ``path`` sent at or after ``start`` and answered before ``end``.

        A request still waiting on a frozen server when it thaws gets a real answer (a 429
        when the limit is in force), so it does not belong to the time the server was away.
        """
        return [
            h
            for h in list(self.hits)
            if h.path == path and start <= h.started and h.started + h.took < end
        ]

    def first(self, path: str, status: int, after: float) -> Hit | None:
        return next(
            (
                h
                for h in list(self.hits)
                if h.path == path and h.status == status and h.started >= after
            ),
            None,
        )


#: How long the counter server stays away.
OUTAGE = 5.0
#: What a loaded machine may add to a request beyond its socket timeouts: generous (860 ms
#: for one request was seen in CI with another load running), and still well under
#: :data:`OUTAGE`, so a request that waits for the server to come back is caught.
SCHEDULING_MARGIN = 3.0


@contextlib.contextmanager
def attempts_that_failed() -> Iterator[list[float]]:
    """When each failed attempt on a server marked it down (``time.monotonic()``): each is a
    request that tried the server and paid for it, at most a socket timeout; the requests in
    between skip the server (``docs/backends.rst``: a dead server costs each process about
    one timeout every ``DEAD_RETRY`` seconds)."""
    times: list[float] = []
    real = Server.mark_down

    def mark_down(self: Server) -> None:
        times.append(time.monotonic())
        real(self)

    Server.mark_down = mark_down  # type: ignore[method-assign]
    try:
        yield times
    finally:
        Server.mark_down = real  # type: ignore[method-assign]


@pytest.mark.parametrize("how", ["kill", "freeze"])
@pytest.mark.parametrize("kind", ["memcached", "redis"])
def test_counter_server_lost_under_load_and_back(
    kind: str, how: str, request: pytest.FixtureRequest
) -> None:
    """No 5xx; the open rule admits, the fail-closed rule answers 503; the server gone
    (killed, or hung: accepts and never answers) is tried about once per
    DEAD_RETRY, each try bounded by the socket timeout; the limit is enforced
    again within seconds after it returns. Bounds are counts and timeouts, never one
    latency compared with another: on a loaded machine both move."""
    server: procs.Restartable = request.getfixturevalue(f"own_{kind}")
    cap = 1.0  # the refusal memory's cap: shorter than the outage, so both show
    config = cache_config(kind, server)
    paths = ("/open/",) * 3 + ("/closed/",)
    with (
        limiter(config, refusal_memory=cap),
        attempts_that_failed() as failed,
        Load(paths) as load,
    ):
        assert wait_for(lambda: load.first("/open/", 429, 0.0), timeout=20), "never limited"
        time.sleep(0.5)
        up_end = time.monotonic()
        server.kill() if how == "kill" else server.freeze()
        lost = time.monotonic()
        time.sleep(OUTAGE)
        returning = time.monotonic()  # a restart takes a while: requests may reach it before
        server.restart() if how == "kill" else server.thaw()
        back = time.monotonic()
        enforced = wait_for(lambda: load.first("/open/", 429, back), timeout=20)
        reopened = wait_for(lambda: load.first("/closed/", 200, back), timeout=20)
        time.sleep(0.2)

    errors = [h for h in load.hits if h.status not in (200, 429, 503)]
    assert not errors, f"{len(errors)} failed requests, first: {errors[0]}"
    up = load.between("/open/", 0.0, up_end)
    down = load.between("/open/", lost, returning)
    closed_down = load.between("/closed/", lost, returning)
    assert down and closed_down
    # While the server is away nothing is a 500, and nothing is limited (fail open) but the
    # refusals this process made just before, remembered for at most the cap
    # seconds (the subject's window was full: refusing it stays never lenient).
    limited = [
        (round(h.started - lost, 4), round(h.took, 4))
        for h in down
        if h.status != 200 and h.started - lost > cap + 0.2
    ]
    assert not limited, f"limited while the server was away (started after loss, took): {limited}"
    assert [h for h in down if h.status == 200 and h.started - lost > cap + 0.2]
    # The fail-closed rule answers 503 meanwhile.
    assert {h.status for h in closed_down} == {503}
    assert enforced, "the limit was never enforced again after the server came back"
    assert reopened, "the fail-closed rule never admitted again after the server came back"
    until_enforced = enforced.started + enforced.took - back
    healthy, during = summary([h.took for h in up]), summary([h.took for h in down])
    # Every request sent while the server was away, answered then or after it came back.
    sent_away = [h for h in load.hits if lost <= h.started < returning]
    tries = [t for t in failed if lost <= t < returning]
    away = returning - lost
    report(
        f"limiter-{kind}-{how}",
        healthy=healthy,
        down=during,
        added_p50_ms=round(during["p50_ms"] - healthy["p50_ms"], 2),
        requests_while_away=len(sent_away),
        server_tries_while_away=len(tries),
        slowest_while_away_ms=ms(max(h.took for h in sent_away)),
        seconds_to_enforce_after_return=round(until_enforced, 2),
        closed_rule_statuses_down=sorted({h.status for h in closed_down}),
        dead_retry_s=DEAD_RETRY,
        socket_timeout_s=SOCKET_TIMEOUT,
    )
    assert tries, "the server was never found gone: the test proves nothing"
    # docs/backends.rst, "A server that fails": marked down for DEAD_RETRY seconds,
    # so a dead server costs each process about one timeout every DEAD_RETRY
    # seconds. Each time it may be asked again, each client thread tries it at most once
    # (the first failure marks it down again); one more round for tries made just before
    # the loss that fail after it.
    assert len(tries) <= len(paths) * (away // DEAD_RETRY + 2)
    # docs/backends.rst, the socket timeout: it bounds what a dead or slow server adds
    # to a request. A try is a connection and a command, each under the timeout (twice over
    # for a client that retries once); none waits for the server to come back.
    hang = max(h.took for h in sent_away)
    assert hang < 4 * SOCKET_TIMEOUT + SCHEDULING_MARGIN, f"a request took {hang:.2f} s"
    assert until_enforced < DEAD_RETRY + 10


def test_fault_helpers_measure_latency() -> None:
    assert summary([0.001, 0.002, 0.003])["p50_ms"] == ms(0.002)


# -- the database: stopped while visits flow, a lost commit reply, downsampling killed -------


@pytest.fixture(scope="module")
def metrics_db(own_postgres: procs.Postgres) -> procs.Postgres:
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"],
        cwd=ROOT,
        env=worker_env(own_postgres),
        check=True,
        timeout=120,
    )
    return own_postgres


def test_database_stopped_while_visits_flow(metrics_db: procs.Postgres) -> None:
    """PostgreSQL stopped for 3 s while a process records visits and its flusher thread
    flushes every 0.3 s: once it is back, every visit is in the database exactly once."""
    before = run(metrics_db, "snapshot")["totals"].get("visits:fault", 0)
    proc = spawn(metrics_db, "visits", "7", RELIABILITY_FLUSH_INTERVAL="0.3")
    try:
        time.sleep(2.0)
        metrics_db.down()
        down_at = time.monotonic()
        time.sleep(3.0)
        metrics_db.up()
        up_at = time.monotonic()
        result = finish(proc)[-1]
        drained = time.monotonic()
    finally:
        end(proc)
        with contextlib.suppress(Exception):
            metrics_db.up()  # already up unless the test failed between down and up
    snap = run(metrics_db, "snapshot")
    stored = snap["totals"]["visits:fault"] - before
    in_buckets = sum(b[3] for b in snap["buckets"] if b[0] == "visits:fault") - before
    report(
        "metrics-postgres-stopped",
        recorded=result["recorded"],
        stored=stored,
        database_down_s=round(up_at - down_at, 2),
        failed_flushes=result["flush_failures"],
        first_failure=result["first_failure"][:120],
        left_for_exit_flush=result["left_for_exit"],
        worker_done_after_up_s=round(drained - up_at, 2),
    )
    assert result["flush_failures"] > 0, "the outage was never seen: the test proves nothing"
    assert stored == in_buckets == result["recorded"]
    # The flusher thread recovered by itself; the exit flush had nothing left to save.
    assert result["left_for_exit"] == 0


def test_sigterm_inside_a_database_query_flushes_and_exits(metrics_db: procs.Postgres) -> None:
    """gunicorn's SIGTERM may land while a worker waits on PostgreSQL. The flush runs beside
    the interrupted query, on a connection of its own (on the worker's own connection it
    would wait on itself until the graceful timeout, and its visits would be lost), and the
    server's handler still runs after it."""
    before = run(metrics_db, "snapshot")["totals"].get("visits:sigterm", 0)
    proc = spawn(metrics_db, "sigterm-in-query", "30")
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"ready": True}
        time.sleep(0.5)  # inside pg_sleep by now
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        lines = finish(proc, timeout=25)
        took = time.monotonic() - sent
    finally:
        end(proc)
    stored = run(metrics_db, "snapshot")["totals"]["visits:sigterm"] - before
    report("metrics-sigterm-in-query", exit_after_sigterm_s=round(took, 2), stored=stored)
    assert {"previous_handler": True} in lines
    assert {"query_finished": True} not in lines
    assert stored == 7
    assert took < 10, "the worker waited instead of flushing beside the query"


@pytest.mark.django_db
@pytest.mark.db_matrix
def test_a_flush_whose_commit_reply_was_lost_is_not_counted_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch commits, then the connection drops before the reply: the buffer keeps the
    batch and retries it with the same flush id, which the ledger recognises."""
    from django.db import OperationalError

    from metrics_app import buffer, storage
    from metrics_app.models import Bucket, FlushLedger, Series

    real = storage.write_counts
    calls: list[str] = []

    def commit_then_lose_the_reply(counts: Any, flush_id: str, **kwargs: Any) -> bool:
        calls.append(flush_id)
        applied = real(counts, flush_id, **kwargs)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return applied

    monkeypatch.setattr(storage, "write_counts", commit_then_lose_the_reply)
    buffer.reset()
    try:
        for _ in range(7):
            buffer.record("ledger:lost-reply", at=1_700_000_000)
        assert buffer.flush(raise_errors=False) is None  # "failed": kept for a retry
        assert buffer.stats()["pending_batches"] == 1
        assert buffer.flush() == 0  # the retry: the ledger knows it, nothing applied
    finally:
        buffer.reset()
    assert calls[0] == calls[1]  # the same batch id both times
    assert Series.objects.get(name="ledger:lost-reply").total == 7
    assert sum(Bucket.objects.values_list("count", flat=True)) == 7
    assert FlushLedger.objects.filter(flush_id=calls[0]).count() == 1


def sums(snapshot: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, _resolution, _start, count in snapshot["buckets"]:
        out[name] = out.get(name, 0) + count
    return out


@pytest.fixture(scope="module")
def folded_once(metrics_db: procs.Postgres) -> dict[str, Any]:
    """The seeded data after one undisturbed run: what every other run must end with."""
    seeded = run(metrics_db, "seed")
    assert seeded["rows"] == worker.SERIES * worker.MINUTES
    expected = sums(run(metrics_db, "snapshot"))
    result = run(metrics_db, "downsample", "100000")
    assert result["folded"] > seeded["rows"] and not result["skipped"]
    snap = run(metrics_db, "snapshot")
    assert sums(snap) == expected
    assert {b[1] for b in snap["buckets"]} == {300, 3600}  # two tiers folded into
    return snap


#: Long enough for a process to start and find the dead run's lock still held.
LOCK_TTL = 6


def test_downsampling_killed_mid_run(
    metrics_db: procs.Postgres, folded_once: dict[str, Any], own_memcached: procs.Restartable
) -> None:
    """SIGKILL in the middle of a run (batches of 100 rows): sums are conserved; the lock
    it held (a shared cache) keeps others out until its TTL, then a run finishes the job."""
    run(metrics_db, "seed")
    seeded = sums(run(metrics_db, "snapshot"))
    lock = {"RELIABILITY_LOCK_CACHE": own_memcached.address, "RELIABILITY_LOCK_TTL": str(LOCK_TTL)}
    proc = spawn(metrics_db, "downsample", "100", **lock)
    try:
        assert proc.stdout is not None
        progress = 0
        deadline = time.monotonic() + 60
        while progress < 5 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            progress += "progress" in line
        assert progress == 5, "the run ended before it could be killed"
        proc.kill()
        proc.wait(10)
    finally:
        end(proc)
    killed_at = time.monotonic()
    assert run(metrics_db, "downsample", "1000", **lock)["skipped"]  # the dead run's lock
    killed = run(metrics_db, "snapshot")
    assert sums(killed) == seeded  # whatever batch was open rolled back whole
    resolutions = {b[1] for b in killed["buckets"]}
    assert {60, 300} <= resolutions, "not killed mid-run: nothing or everything folded"
    rerun = wait_for(
        lambda: (r := run(metrics_db, "downsample", "1000", **lock))["skipped"] is False and r,
        timeout=30,
        interval=0.5,
    )
    assert rerun, "the dead run's lock never expired"
    report(
        "downsample-killed",
        lock_ttl_s=LOCK_TTL,
        rerun_after_s=round(time.monotonic() - killed_at, 1),
    )
    assert run(metrics_db, "snapshot") == folded_once


@pytest.mark.parametrize("shared_lock", [True, False], ids=["shared-lock", "no-lock"])
def test_two_downsampling_runs_at_once(
    metrics_db: procs.Postgres,
    folded_once: dict[str, Any],
    shared_lock: bool,
    own_memcached: procs.Restartable,
) -> None:
    """Two runs started together: with the shared lock one of them is skipped (or finds
    nothing left); without it (a lock cache per process) both fold at once. Either way the
    result is exactly that of one run: nothing folded twice."""
    run(metrics_db, "seed")
    lock = {"RELIABILITY_LOCK_CACHE": own_memcached.address} if shared_lock else {}
    both = [spawn(metrics_db, "downsample", "200", **lock) for _ in range(2)]
    try:
        results = [finish(proc)[-1] for proc in both]
    finally:
        for proc in both:
            end(proc)
    folding = [r for r in results if r["folded"]]
    report(
        f"downsample-twice-{'shared-lock' if shared_lock else 'no-lock'}",
        folded=[r["folded"] for r in results],
        skipped=[r["skipped"] for r in results],
    )
    if shared_lock:
        assert len(folding) == 1
    assert run(metrics_db, "snapshot") == folded_once


def test_a_lost_memcached_node_moves_its_subjects_through_the_middleware() -> None:
    """Three nodes, 30 subjects over the limit; one node killed: no error, its subjects
    start again from zero on the others (availability over accuracy), the rest stay limited.
    (Bucket placement per node: tests/ratelimit/test_backends.py::test_several_memcached_nodes.)
    """
    nodes = [start_or_skip(procs.memcached) for _ in range(3)]  # type: ignore[arg-type]
    try:
        config = {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": [n.address for n in nodes],
        }
        subjects = [f"198.51.100.{n}" for n in range(30)]
        # Without the refusal memory: the refusals just made would hold for a few seconds
        # more (never lenient); this test is about where the counts go.
        with limiter(config, dead_retry=60.0, refusal_memory=0):
            clients = {s: Client(REMOTE_ADDR=s) for s in subjects}
            for subject, client in clients.items():
                statuses = [client.get("/open/").status_code for _ in range(LIMIT + 1)]
                assert statuses == [200] * LIMIT + [429], subject
            nodes[1].kill()
            started = time.monotonic()
            after = {s: c.get("/open/").status_code for s, c in clients.items()}
            took = time.monotonic() - started
            moved = [s for s, status in after.items() if status == 200]
            assert set(after.values()) <= {200, 429}
            assert 0 < len(moved) < len(subjects)  # the dead node's share, and only that
            for subject in moved:  # limited again on their new node
                statuses = [clients[subject].get("/open/").status_code for _ in range(LIMIT)]
                assert statuses == [200] * (LIMIT - 1) + [429], subject
        report("memcached-node-lost", subjects=len(subjects), moved=len(moved), ms_for_30=ms(took))
    finally:
        for node in nodes:
            node.stop()
