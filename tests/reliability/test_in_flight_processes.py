"""In-flight limits across processes (docs/operators.rst, "Requests in flight"): gunicorn with
4 workers of 8 threads, clients in 4 processes of 8 threads, one subject, a rule of
``"concurrent": 5, "lease": "3s"`` on a view that sleeps 0.3 s (:mod:`inflight_site`), the
counters on real memcached and real Redis.

The view records in Redis who is inside it, so "how many at once" is exact across workers:
never more than 5. Then one worker is killed with SIGKILL while inside the view: the places
it held are never given back, so until they leave the window (the lease) the others run at
most ``5 - held`` at once; after the lease, 5 run at once again. Refusals are 429 with
``Retry-After: 1``. And a stream the client drops gives its place back when gunicorn closes
the response, not when its lease runs out.
"""

from __future__ import annotations

import contextlib
import http.client
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ratelimit_app.engine.in_flight import RETRY_AFTER
from tests.reliability.common import env, report, serving
from tests.reliability.conftest import PROCESSES, THREADS
from tests.reliability.inflight_site import CONCURRENT, LEASE, SUBJECT_HEADER, Recorder
from tests.servers import free_port, gunicorn_argv, wait_for

pytestmark = pytest.mark.slow

#: Seconds of traffic before the kill, and after the lease has run out.
BEFORE, RECOVERY = 4.0, 3.0
#: A hit leaves the window one fine bucket after the lease at the latest
#: (ratelimit_app.algorithms.windows: 60 fine buckets a window).
FINE_BUCKET = LEASE / 60
#: Slack for a busy machine: the check comes a little before the view records its entry,
#: and a worker's clock is read a little before its hit reaches the server.
SLACK = 0.5
#: Seconds a client waits after a refusal (it keeps 32 clients from spinning the CPU).
BACK_OFF = 0.05

Hit = tuple[int, str, float]  # status (0: the connection failed), Retry-After, end time


def get(port: int, subject: str, path: str = "/slow/") -> Hit:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={SUBJECT_HEADER: subject})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("Retry-After") or "", time.time()
    except OSError:
        return 0, "", time.time()  # a worker killed mid-request
    finally:
        conn.close()


def pound(port: int, subject: str, start: float, until: float) -> list[Hit]:
    """One client process: ``THREADS`` threads sending requests from ``start`` to ``until``
    (wall clock, so every process begins together), each waiting a little after a refusal."""
    hits: list[Hit] = []
    lock = threading.Lock()

    def run() -> None:
        time.sleep(max(0.0, start - time.time()))
        mine = []
        while time.time() < until:
            mine.append(get(port, subject))
            if mine[-1][0] == 429:
                time.sleep(BACK_OFF)
        with lock:
            hits.extend(mine)

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return hits


def clients(port: int, subject: str, start: float, until: float) -> list[Hit]:
    """``PROCESSES`` client processes of ``THREADS`` threads; their hits once all are done."""
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        args = (port, subject, start, until)
        parts = [pool.apply_async(pound, args) for _ in range(PROCESSES)]
        return [hit for part in parts for hit in part.get(timeout=until - time.time() + 60)]


@contextlib.contextmanager
def gunicorn(tmp: Path, **settings: str) -> Iterator[int]:
    """4 workers of 8 threads (gthread) on a free port, serving :mod:`inflight_site`."""
    port = free_port()
    argv = gunicorn_argv("django.core.wsgi:get_wsgi_application()", port)
    argv[argv.index("--worker-class") + 1] = "gthread"
    argv[-1:-1] = ["--threads", str(THREADS)]
    site = env(DJANGO_SETTINGS_MODULE="tests.reliability.inflight_site", **settings)
    with serving(argv, site, tmp / "gunicorn.log", lambda: get(port, "", "/ping/")[0] == 200):
        yield port


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def kill_one_inside(recorder: Recorder) -> tuple[int, float, list[float]]:
    """SIGKILL to the worker that entered the view last (it has the longest left to run):
    its pid, when, and when each of its requests inside the view had entered."""
    inside = wait_for(recorder.inside, timeout=5, interval=0.005)
    assert inside, "no request inside the view: the clients do not reach it"
    victim = max(inside, key=lambda entry: entry[1])[0]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    return victim, killed_at, recorder.restart(killed=victim).killed


def site_env(kind: str, request: pytest.FixtureRequest, redis_server: str) -> dict[str, str]:
    """The site's environment: counters on ``kind``, the record on Redis db 1 (apart from the
    counters, db 0), its keys under a new run id (also the subject: no earlier run counted
    it)."""
    run = f"inflight-{kind}-{time.time_ns()}"
    record = redis_server.rsplit("/", 1)[0] + "/1"
    settings = {"INFLIGHT_RECORD": record, "INFLIGHT_RUN": run, "RELIABILITY_COUNTERS": kind}
    if kind == "memcached":
        settings["MEMCACHED_SERVERS"] = request.getfixturevalue("memcached_server")
    else:
        settings["RELIABILITY_REDIS"] = redis_server
    return settings


@pytest.mark.parametrize("kind", ["memcached", "redis"])
def test_in_flight_limit_holds_across_workers_and_a_killed_worker(
    kind: str, request: pytest.FixtureRequest, redis_server: str, tmp_path: Path
) -> None:
    settings = site_env(kind, request, redis_server)
    run = settings["INFLIGHT_RUN"]
    recorder = Recorder(settings["INFLIGHT_RECORD"], run)
    with gunicorn(tmp_path, **settings) as port, ThreadPoolExecutor(1) as pool:
        start = time.time() + 2.0  # after the client processes have started
        until = start + BEFORE + LEASE + FINE_BUCKET + SLACK + RECOVERY
        pending = pool.submit(clients, port, run, start, until)
        sleep_until(start + BEFORE)
        before = recorder.restart()
        victim, killed_at, held = kill_one_inside(recorder)
        # Until the first of the places it held can have left the window.
        sleep_until(min(held, default=killed_at) + LEASE - SLACK)
        while_held = recorder.restart()
        assert time.time() < killed_at + LEASE, "too slow to tell: the lease may have run out"
        sleep_until(until)
        after = recorder.restart()
        hits = pending.result(timeout=120)
    statuses = Counter(status for status, _retry, _at in hits)
    waits = Counter(retry for status, retry, _at in hits if status == 429)
    back_after = round(after.at - killed_at, 2)
    report(
        f"gunicorn-in-flight-{kind}",
        concurrent=CONCURRENT,
        statuses=dict(statuses),
        most_before_kill=before.most,
        victim_held=len(held),
        most_while_held=while_held.most,
        most_after_lease=after.most,
        all_back_after_kill_s=back_after,
        peak=recorder.peak(),
    )
    assert set(statuses) <= {0, 200, 429}
    # docs/operators.rst, "Requests in flight": never more than ``concurrent`` at once.
    assert recorder.peak() <= CONCURRENT
    assert 0 < before.most <= CONCURRENT
    assert statuses[200] >= CONCURRENT and statuses[429] > 0
    assert waits == {"1": statuses[429]}
    # Only the requests the killed worker was serving failed, when it was killed.
    assert all(abs(at - killed_at) < 1.0 for status, _retry, at in hits if status == 0)
    # The places the killed worker held are not given back: the others run in the rest.
    assert held, f"worker {victim} was not inside the view when killed"
    assert while_held.most <= CONCURRENT - len(held)
    # After the lease every place is back: 5 at once again, as soon as the places have left
    # the window and the workers have stopped refusing from memory (RETRY_AFTER).
    assert after.most == CONCURRENT
    assert back_after <= LEASE + FINE_BUCKET + RETRY_AFTER + SLACK


def open_stream(port: int, subject: str) -> tuple[http.client.HTTPConnection, int]:
    """A stream of ``/stream/`` with its first chunk read (the view is inside), and its status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/stream/", headers={SUBJECT_HEADER: subject})
    response = conn.getresponse()
    response.read(65536)
    return conn, response.status


@pytest.mark.parametrize("kind", ["memcached", "redis"])
def test_a_stream_the_client_drops_gives_its_place_back(
    kind: str, request: pytest.FixtureRequest, redis_server: str, tmp_path: Path
) -> None:
    """The client goes away mid-stream: gunicorn closes the response, which gives the place
    back long before its lease (a minute) would."""
    settings = site_env(kind, request, redis_server)
    subject = settings["INFLIGHT_RUN"]
    with gunicorn(tmp_path, **settings) as port:
        first, status = open_stream(port, subject)
        assert status == 200
        assert get(port, subject, "/stream/")[:2] == (429, "1")
        first.sock.shutdown(socket.SHUT_RDWR)
        first.close()
        time.sleep(RETRY_AFTER + 0.5)  # the worker that refused stops refusing from memory
        second, status = open_stream(port, subject)
        second.close()
    assert status == 200
