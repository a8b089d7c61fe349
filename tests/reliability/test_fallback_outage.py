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
from tests.reliability.common import env, report, serving, status
from tests.reliability.fallback_site import LIMIT, PASSWORD
from tests.servers import free_port, gunicorn_argv

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
    return status(port, "/ping/")


def many(port: int, username: str, n: int) -> list[Hit]:
    """``n`` wrong passwords for ``username`` from :data:`THREADS` threads at once."""
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(lambda _: post(port, username), range(n)))


@contextlib.contextmanager
def gunicorn(tmp: Path, **settings: str) -> Iterator[int]:
    """:data:`WORKERS` sync workers on a free port, serving :mod:`fallback_site`."""
    port = free_port()
    argv = gunicorn_argv("django.core.wsgi:get_wsgi_application()", port, WORKERS)
    site = env(DJANGO_SETTINGS_MODULE="tests.reliability.fallback_site", **settings)
    with serving(argv, site, tmp / "gunicorn.log", lambda: ping(port) == 200):
        yield port


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


def test_a_stopped_redis_cluster_node_sends_its_subjects_to_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis Cluster, three masters and no replica, one stopped: the cluster client reports
    its slots' commands failed, and the subjects of those slots (and, while the backend is
    marked down, every subject) count in memory: no failure, nobody admitted past the limit.
    In process (the client is the same in a gunicorn worker)."""
    from django.test import RequestFactory, override_settings

    from ratelimit_app.backends import base, reset_backends
    from ratelimit_app.core import get_usage
    from ratelimit_app.engine import failure_dict
    from ratelimit_app.signals import fallback_changed
    from tests.servers import HOST
    from tests.servers.redis_cluster import Cluster

    cluster: Cluster = start_or_skip(Cluster)  # type: ignore[arg-type]
    config = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{HOST}:{cluster.ports[0]}/0",
    }
    changes: list[bool] = []

    def changed(in_memory: bool, **kwargs: object) -> None:
        changes.append(in_memory)

    fallback_changed.connect(changed, weak=False, dispatch_uid="cluster-fallback")
    monkeypatch.setattr(base, "DEAD_RETRY", 0.3)
    rf = RequestFactory()
    subjects = [f"10.9.0.{i}" for i in range(1, 31)]

    def check(ip: str) -> dict[str, object] | None:
        request = rf.get("/", REMOTE_ADDR=ip)
        return get_usage(
            request, "cluster-fb", key="ip", rate=f"{LIMIT}/m", increment=True,
            fail_open=False, fallback="memory",
        )  # fmt: skip

    try:
        with override_settings(
            CACHES={
                "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
                "rl": config,
            },
            RATELIMIT_USE_CACHE="rl",
            RATELIMIT_BACKEND="ratelimit_app.backends.redis.RedisClusterBackend",
        ):
            reset_backends()
            assert all((u or {}).get("count") == 1 for u in map(check, subjects))
            cluster.procs[2].kill()
            cluster.procs[2].wait(10)
            seen = {ip: [check(ip) for _ in range(2 * LIMIT)] for ip in subjects}
            reset_backends()
    finally:
        fallback_changed.disconnect(dispatch_uid="cluster-fallback")
        cluster.stop()
    for ip, usages in seen.items():
        assert failure_dict() not in usages and None not in usages, ip
        admitted = [u for u in usages if u and not u["should_limit"]]
        assert len(admitted) <= LIMIT and usages[-1]["should_limit"], ip  # type: ignore[index]
    assert changes and changes[0] is True, "no subject was counted in memory"
