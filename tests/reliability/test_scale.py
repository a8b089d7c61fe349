"""Many processes: gunicorn with 4 workers on real memcached, Redis and PostgreSQL.

Clients are 4 processes of 8 threads. The limit of one subject holds across workers; visit
counts are exact after a graceful stop (each worker flushes on SIGTERM); ``kill -9`` of a
worker loses at most what it recorded since its last flush with the memory buffer, and
nothing with the Redis buffer. Numbers go to ``tests/artifacts/reliability.json``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.reliability import clients, procs, site_urls
from tests.reliability.common import ROOT, end, env, report
from tests.reliability.conftest import PROCESSES, THREADS, load, run, stop
from tests.servers import gunicorn_argv, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site_db(own_postgres: procs.Postgres) -> procs.Postgres:
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"],
        cwd=ROOT,
        env=env(
            DJANGO_SETTINGS_MODULE="tests.reliability.site_settings",
            RELIABILITY_DB=json.dumps(own_postgres.database),
        ),
        check=True,
        timeout=120,
    )
    return own_postgres


@contextlib.contextmanager
def gunicorn(pg: procs.Postgres, **settings: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """4 sync workers on a free port; SIGTERM (then SIGKILL) at the end whatever happens."""
    port = procs.free_port()
    log = open(os.path.join(pg.server.tmpdir, f"gunicorn-{port}.log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        gunicorn_argv("tests.reliability.site_wsgi", port),
        cwd=ROOT,
        env=env(
            DJANGO_SETTINGS_MODULE="tests.reliability.site_settings",
            RELIABILITY_DB=json.dumps(pg.database),
            **settings,
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        ready = wait_for(lambda: clients.get(port, "/pid/")[0] == 200 or proc.poll() is not None)
        assert ready and proc.poll() is None, f"gunicorn did not start: {log.name}"
        yield proc, port
    finally:
        end(proc, timeout=30)
        log.close()


def visits(pg: procs.Postgres) -> int:
    return int(run(pg, "snapshot")["totals"].get(site_urls.VISITS, 0))


@pytest.mark.parametrize("kind", ["memcached", "redis"])
def test_one_subject_across_workers_never_gets_more_than_the_limit(
    site_db: procs.Postgres, kind: str, request: pytest.FixtureRequest
) -> None:
    server: procs.Restartable = request.getfixturevalue(f"own_{kind}")
    settings = {"RELIABILITY_COUNTERS": kind}
    settings["MEMCACHED_SERVERS" if kind == "memcached" else "RELIABILITY_REDIS"] = (
        server.address if kind == "memcached" else server.url
    )
    with gunicorn(site_db, **settings) as (_proc, port):
        began = time.time()
        hits = load(port, "/limited/", requests=5)
        # A worker refuses from memory for up to clients.REFUSAL_MEMORY seconds, even
        # after other workers took their refused hits back (docs/concepts.rst, "Refusals
        # are remembered"): one request at a time after that, until one is refused.
        time.sleep(clients.REFUSAL_MEMORY + 0.5)
        topped_up = 0
        while topped_up <= clients.LIMIT and clients.get(port, "/limited/")[0] == 200:
            topped_up += 1
        # No admitted hit has left the window yet (it leaves 60 s after it was made at the
        # earliest).
        assert time.time() - began < 55, "the requests took longer than one window"
    statuses = Counter(status for status, _pid, _t in hits)
    admitted_by = Counter(pid for status, pid, _t in hits if status == 200)
    report(
        f"gunicorn-limit-{kind}",
        limit=clients.LIMIT,
        requests=len(hits),
        statuses=dict(statuses),
        admitting_workers=len(admitted_by),
        admitted_after_one_at_a_time=topped_up,
    )
    assert set(statuses) <= {200, 429}
    assert len(hits) == PROCESSES * THREADS * 5
    # docs/concepts.rst, "Never lenient": no window of length W ever admits more than N
    # requests, under any amount of concurrency.
    assert statuses[200] <= clients.LIMIT
    # docs/concepts.rst, "Refused hits are taken back" and "Tight": a refused request does
    # not use up the quota, so once the concurrent requests are answered the window holds
    # the admitted ones alone and one request at a time is admitted until it holds N.
    # (Concurrent requests may be refused where they would have fit: the strict side.)
    assert statuses[200] + topped_up == clients.LIMIT


def test_visit_counts_are_exact_after_sigterm(site_db: procs.Postgres) -> None:
    """No periodic flush at all (interval one hour): only the workers' SIGTERM flushes."""
    before = visits(site_db)
    with gunicorn(site_db, RELIABILITY_FLUSH_INTERVAL="3600") as (proc, port):
        hits = load(port, "/counted/", requests=10)
        assert visits(site_db) == before  # nothing flushed yet
        stop(proc)
    ok = sum(status == 200 for status, _pid, _t in hits)
    workers = len({pid for _s, pid, _t in hits})
    report("gunicorn-sigterm", served=ok, stored=visits(site_db) - before, workers=workers)
    assert ok == len(hits) == PROCESSES * THREADS * 10
    assert workers > 1
    assert visits(site_db) - before == ok


INTERVAL = 2.0
#: How far ``time.time()`` (the ledger's times) may run behind the monotonic clock that
#: times the flusher's wait, over one interval.
CLOCK_SLACK = 0.05


def who(port: int) -> tuple[int, str]:
    """The pid of the worker that answers, and the id of its metrics flushes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/pid/")
        response = conn.getresponse()
        response.read()
        return int(response.getheader("X-Pid") or 0), response.getheader("X-Flush-Id") or ""
    finally:
        conn.close()


def flushes_of(pg: procs.Postgres, flush_id: str) -> list[float]:
    """When each flush of one process was written (the flush ledger), in order."""
    rows = run(pg, "ledger")["rows"]
    mine = [(int(fid.rsplit(":", 1)[1]), at) for fid, at in rows if fid.startswith(flush_id + ":")]
    return [at for _seq, at in sorted(mine)]


@pytest.mark.parametrize("buffer", ["memory", "redis"])
def test_kill_9_of_a_worker(
    site_db: procs.Postgres, buffer: str, own_redis: procs.Restartable
) -> None:
    """SIGKILL to one worker in the middle of the traffic, then a graceful stop. With the
    memory buffer only that worker loses visits, at most what it served since its last
    flush; with the Redis buffer nothing is lost.

    The bound comes from the flushes the worker made (the flush ledger), not from when its
    flusher thread should have run: on a busy machine the thread runs late, and then the
    worker loses more than ``INTERVAL`` seconds' worth, as documented. Each flush seals what
    was recorded since the last one, and the thread seals a batch no sooner than
    ``INTERVAL`` after it wrote the one before (whose ledger time is when that write
    began); what was sealed before the last flush written is in the database."""
    totals_before = run(site_db, "snapshot")["totals"]
    settings = {
        "RELIABILITY_FLUSH_INTERVAL": str(INTERVAL),
        "RELIABILITY_BUFFER": buffer,
        "RELIABILITY_REDIS": own_redis.url,
    }
    with gunicorn(site_db, **settings) as (proc, port), ThreadPoolExecutor(1) as pool:
        began = time.time()  # no visit is recorded before this
        pending = pool.submit(load, port, "/counted/", 100_000, 9.0)
        time.sleep(1.5 + 6.0)  # clients start 1.5 s after the call; 6 s of traffic
        victim, flush_id = who(port)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        hits = pending.result(timeout=120)
        stop(proc)
    if buffer == "redis":
        run(site_db, "drain", RELIABILITY_REDIS=own_redis.url)
    totals = run(site_db, "snapshot")["totals"]

    def stored(series: str) -> int:
        return int(totals.get(series, 0)) - int(totals_before.get(series, 0))

    ok = [(pid, t) for status, pid, t in hits if status == 200]
    # Requests cut by the kill: the victim may have recorded one before its answer was lost.
    cut = len(hits) - len(ok)
    lost = len(ok) - stored(site_urls.VISITS)
    served = Counter(pid for pid, _t in ok)
    lost_by = {pid: n - stored(site_urls.by_worker(pid)) for pid, n in served.items()}
    by_victim = sorted(t for pid, t in ok if pid == victim)
    numbers: dict[str, Any] = {}
    if buffer == "memory":
        flushes = flushes_of(site_db, flush_id)
        # The earliest the victim's last flush written can have sealed its batch.
        last_seal = (flushes[-2] if len(flushes) > 1 else began) + INTERVAL - CLOCK_SLACK
        after_last_flush = [t for t in by_victim if t > last_seal]
        numbers = {
            "victim_flushes": len(flushes),
            "victim_last_flush_s_before_kill": round(killed_at - max(flushes, default=began), 2),
            "victim_served_after_its_last_flush": len(after_last_flush),
        }
    report(
        f"gunicorn-kill-9-{buffer}",
        served=len(ok),
        stored=stored(site_urls.VISITS),
        lost=lost,
        flush_interval_s=INTERVAL,
        victim_served=len(by_victim),
        victim_lost=lost_by.get(victim, 0),
        failed_requests=cut,
        **numbers,
    )
    assert by_victim, "the killed worker served nothing: the test proves nothing"
    if buffer == "redis":
        # Recorded before its response was sent: a request cut by the kill may count with
        # no 200 seen; none is lost.
        assert 0 <= -lost <= cut
        return
    assert flushes, "the killed worker never flushed: the test proves nothing"
    assert all(t < killed_at for t in flushes)
    # Only the killed worker loses anything: every other worker flushed all it served.
    assert {pid: n for pid, n in lost_by.items() if pid != victim} == dict.fromkeys(
        set(served) - {victim}, 0
    )
    # docs/reliability.rst, "Many gunicorn workers": a worker killed with SIGKILL loses at
    # most what it recorded since its last flush.
    assert -cut <= lost_by[victim] <= len(after_last_flush)
