"""A log-in limit with a fallback while its counter server is killed, under gunicorn with 4
workers (docs/operators, *Counting in memory during an outage*).

The rule allows 5 wrong passwords a minute per username and fails closed, but counts in each
worker's memory while its server is down. Before the kill the server counts for every
worker (5 wrong passwords, then 429s); while it is dead no request fails (no 500, no 503),
each worker lets at most 5 wrong passwords through (at most 4 x 5 in the minute), and other
clients are served; once it is back, the next checks count on it again (5 for a new
username across every worker, not 5 per worker). Every server is the test's own.
"""

from __future__ import annotations

import contextlib
import http.client
import subprocess
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ratelimit_app.backends.base import DEAD_RETRY
from tests.conftest import start_or_skip
from tests.reliability import procs
from tests.reliability.common import ROOT, end, env, report
from tests.reliability.fallback_site import LIMIT, PASSWORD
from tests.servers import free_port, gunicorn_argv, wait_for

pytestmark = pytest.mark.slow

WORKERS = 4
#: Client threads, each request on a new connection (so the workers share them).
THREADS = 16

Hit = tuple[int, str]  # status (0: the connection failed), the worker's pid


def post(port: int, username: str, password: str = "wrong", path: str = "/login/") -> Hit:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = urllib.parse.urlencode({"username": username, "password": password})
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("X-Pid") or ""
    except OSError:
        return 0, ""
    finally:
        conn.close()


def ping(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/ping/")
        response = conn.getresponse()
        response.read()
        return response.status
    except OSError:
        return 0
    finally:
        conn.close()


def many(port: int, username: str, n: int) -> list[Hit]:
    """``n`` wrong passwords for ``username`` from :data:`THREADS` threads at once."""
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(lambda _: post(port, username), range(n)))


@contextlib.contextmanager
def gunicorn(tmp: Path, **settings: str) -> Iterator[int]:
    """:data:`WORKERS` sync workers on a free port, serving :mod:`fallback_site`."""
    port = free_port()
    argv = gunicorn_argv("django.core.wsgi:get_wsgi_application()", port, WORKERS)
    log = open(tmp / "gunicorn.log", "wb")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env(DJANGO_SETTINGS_MODULE="tests.reliability.fallback_site", **settings),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        ready = wait_for(lambda: ping(port) == 200 or proc.poll() is not None)
        assert ready and proc.poll() is None, f"gunicorn did not start: {log.name}"
        yield port
    finally:
        end(proc, timeout=30)
        log.close()


@pytest.mark.parametrize("kind", ["memcached", "redis"])
def test_a_login_limit_counts_in_each_workers_memory_while_its_server_is_dead(
    kind: str, tmp_path: Path
) -> None:
    server: procs.Restartable = start_or_skip(getattr(procs, kind))  # type: ignore[arg-type]
    settings = {"RELIABILITY_COUNTERS": kind}
    if kind == "memcached":
        settings["MEMCACHED_SERVERS"] = server.address
    else:
        settings["RELIABILITY_REDIS"] = server.url
    try:
        with gunicorn(tmp_path, **settings) as port:
            up = Counter(status for status, _ in many(port, "before", 40))
            assert up == {401: LIMIT, 429: 40 - LIMIT}, up  # the server counts for all

            server.kill()
            killed = time.monotonic()
            down = many(port, "victim", 200)
            others = [ping(port) for _ in range(20)] + [
                post(port, "someone", PASSWORD)[0] for _ in range(20)
            ]
            took = time.monotonic() - killed
            statuses = Counter(status for status, _ in down)
            through = Counter(pid for status, pid in down if status == 401)
            assert set(statuses) <= {401, 429}, statuses  # no 500, no 503, no lost request
            assert took < 60  # (all of it within the minute of the limit's window)
            # Each worker counts alone: at most LIMIT wrong passwords each, WORKERS x LIMIT
            # in all; and some did count (the limit neither failed open nor closed).
            assert max(through.values()) <= LIMIT and sum(through.values()) <= WORKERS * LIMIT
            assert statuses[429] >= 200 - WORKERS * LIMIT
            assert others == [200] * 40  # other clients are served

            server.restart()
            time.sleep(DEAD_RETRY + 0.5)  # every worker asks the server again
            back = Counter(status for status, _ in many(port, "after", 40))
            assert back == {401: LIMIT, 429: 40 - LIMIT}, back  # on the server again
    finally:
        server.stop()
    report(
        f"fallback-{kind}-killed",
        wrong_passwords_sent_while_dead=len(down),
        reached_the_view=sum(through.values()),
        by_worker=sorted(through.values()),
        seconds=round(took, 2),
    )
