"""Issue 40, "Async all the way": under ASGI no check makes the event loop wait on a counter
server.

uvicorn, one worker, serves async views (:mod:`async_urls`): one without a limit, one under
``@ratelimit``, one under a middleware rule, both limits keyed on a header (a key the engine
reads on the loop) with a rate nobody reaches, so every request is checked and admitted. The
counters are on real servers (:data:`KINDS`: one memcached, one Redis, two memcached nodes,
a three-node Redis Cluster), each behind a :mod:`delay_proxy` of its own, which makes each
answer :data:`DELAY` late, as a server across a network would. Clients keep
:data:`CONCURRENCY` requests in flight on keep-alive connections for :data:`SECONDS` on
each page (in :data:`ROUNDS` turns of the three pages), each client with a subject of its
own (so the subjects spread over the nodes), while a probe asks an unlimited page ten times
a second on a connection of its own.

A cluster client learns the nodes' addresses from ``CLUSTER SLOTS``: each node of the
cluster announces its proxy's port (``cluster-announce-port``), so the limiter's client
reaches every node through a proxy (:func:`announce`); the nodes still talk to each other
on their own bus ports.

A check that waits on the loop (a blocking socket call) stops every other request for the
round trip: the limited pages then serve a fraction of the unlimited one's requests, and the
probe waits behind the queue. A check that awaits its round trip lets the loop serve the
others meanwhile. The targets are ratios to the unlimited page on the same machine, the
probe's median, and how late the site's loop ran its timers (``/lag/``), the last two
against what the unlimited page costs the loop (see :data:`MAX_PROBE_P50`).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import start_or_skip
from tests.reliability import procs
from tests.reliability.async_settings import CLIENT_HEADER
from tests.reliability.common import (
    REDIS_CLUSTER,
    ROOT,
    env,
    ms,
    report,
    serving,
    status,
    summary,
)
from tests.reliability.delay_proxy import DelayProxy, delayed
from tests.servers import HOST, free_port, wait_for

pytestmark = pytest.mark.slow

#: Seconds each answer of the counter server is late (a server across a network).
DELAY = 0.020
#: Requests in flight at once, and seconds of traffic measured on each page (after
#: :data:`WARM_UP` seconds of traffic that open the connections and are not counted).
#: Four backends in about 40 s: 1.8 s a page is 600 to 1200 requests on 2 CPUs, the
#: probe's median of some 17 answers and the lag of 60 to 100 ticks.
CONCURRENCY, SECONDS, WARM_UP = 32, 1.8, 0.3
#: The pages are measured in turns, :data:`SECONDS` / ROUNDS each, so that the machine
#: changing pace (another process on its 2 CPUs) weighs on every page alike, not on the
#: one that ran then (each ratio is to the unlimited page).
ROUNDS = 2
#: Seconds between two requests of the probe.
PROBE_EVERY = 0.1

#: Issue 40's targets. A limited page serves at least half the requests of the unlimited
#: one. (With the check awaited, Little's law caps it at CONCURRENCY / DELAY = 1600 a second,
#: well above what one uvicorn worker serves on a small machine, 250 to 650 on 2 CPUs; with the
#: check blocking the loop, at 1 / DELAY = 50 a second; with the check in a thread of the
#: loop's executor, min(32, CPUs + 4) threads, at 6 / DELAY = 300 a second on 2 CPUs: the
#: cluster's check so measured 0.46 to 0.48x, with the probe and the loop's lag fine.)
MIN_RATIO = 0.5
#: The probe's median while a limited page is under load: the loop answers it between the
#: others' checks, not after a queue of round trips (a blocking check: about CONCURRENCY x
#: DELAY, 700 to 800 ms). But 32 requests in flight keep one worker's CPU busy, and the probe
#: waits its turn behind the work they bring: on a small machine the unlimited page misses
#: 50 ms too (55 to 140 ms on 2 CPUs). So the bound is 50 ms or :data:`SLOWER` times /plain/'s
#: median, whichever is larger: what the limits add, not what the machine lacks.
MAX_PROBE_P50 = 0.050
SLOWER = 2.0
#: How late the loop's timers may be during a limited run. A task on the site's loop sleeps
#: 10 ms again and again and adds up how late it wakes (async_urls.LoopLag). A check that
#: blocks the loop for its round trip makes a tick late by every check the loop runs
#: meanwhile: 200 ms a tick or more, the loop late over 90% of the run. A loop that never
#: waits on a socket is still late by the Python work it runs between two ticks; with 32
#: requests in flight that work keeps one worker's CPU busy, and /plain/ alone leaves the
#: timers late 60 to 80% of the run on 2 CPUs (15 to 45 ms a tick), so no share of the run (the
#: issue's "under a quarter") holds on a busy worker. The bound is per tick, against the
#: same work without a limit: at most DELAY (one round trip's worth) or SLOWER times
#: /plain/'s mean lateness, whichever is larger.
MAX_TICK_LAG = DELAY

PAGES = ("/plain/", "/decorated/", "/ruled/")
LIMITED = PAGES[1:]
#: Where the counters are: one memcached, one Redis, two memcached nodes (each subject on
#: one, by rendezvous hashing), a three-node Redis Cluster (each subject in one slot).
KINDS = ("memcached", "redis", "memcached-2-nodes", REDIS_CLUSTER)


@dataclass
class Run:
    """One page under load: requests done in :data:`SECONDS`, their statuses, the probe's
    latencies, what ``/lag/`` said and the answers each node's proxy passed back meanwhile
    (added up over the :data:`ROUNDS`)."""

    page: str
    done: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    probe: list[float] = field(default_factory=list)
    lag: dict[str, float] = field(default_factory=dict)
    answers: list[int] = field(default_factory=list)

    def add_lag(self, lag: dict[str, float]) -> None:
        """Add what ``/lag/`` said of one round."""
        for name, value in lag.items():
            was = self.lag.get(name, 0)
            self.lag[name] = max(was, value) if name == "max_s" else round(was + value, 4)

    @property
    def rate(self) -> float:
        return self.done / SECONDS

    @property
    def lag_share(self) -> float:
        """The share of the run the loop's timers were late, all added up."""
        return self.lag["total_s"] / max(self.lag["seconds"], 1e-9)

    @property
    def tick_lag(self) -> float:
        """How late a tick of the loop's monitor was, on average."""
        return self.lag["total_s"] / max(self.lag["ticks"], 1)

    def numbers(self) -> dict[str, Any]:
        return {
            "per_s": round(self.rate, 1),
            "statuses": dict(self.statuses),
            "probe": summary(self.probe),
            "lag": {
                **self.lag,
                "share": round(self.lag_share, 3),
                "per_tick_ms": ms(self.tick_lag),
            },
            "backend_answers": sum(self.answers),
            "answers_per_node": self.answers,
        }


# -- a keep-alive HTTP/1.1 client on asyncio streams ---------------------------------------


def message(page: str, client: str) -> bytes:
    return f"GET {page} HTTP/1.1\r\nHost: {HOST}\r\n{CLIENT_HEADER}: {client}\r\n\r\n".encode()


async def fetch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sent: bytes) -> int:
    """Send one request on a kept-alive connection and read its whole answer: its status
    (uvicorn sends Django's responses with a Content-Length or chunked)."""
    writer.write(sent)
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower().split("\r\n")
    headers = dict(line.split(":", 1) for line in head[1:] if ":" in line)
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif "chunked" in headers.get("transfer-encoding", ""):
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            await reader.readexactly(size + 2)
        await reader.readuntil(b"\r\n")  # (no trailers)
    return int(head[0].split(" ", 2)[1])


@contextlib.asynccontextmanager
async def connection(
    port: int,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def client(port: int, run: Run, until: float, n: int) -> None:
    """Requests one after the other until ``until``, as subject ``load-<n>``; those done by
    then count."""
    sent = message(run.page, f"load-{n}")
    async with connection(port) as (reader, writer):
        while time.monotonic() < until:
            run.statuses[await fetch(reader, writer, sent)] += 1
            if time.monotonic() <= until:
                run.done += 1


async def probe(port: int, run: Run, until: float) -> None:
    """``/probe/`` (no limit) on a grid of :data:`PROBE_EVERY` seconds: each request at the
    next point of the grid after the previous answer (the points it missed while waiting are
    skipped, not sent in a burst), its latency from when it was sent."""
    sent = message("/probe/", "probe")
    async with connection(port) as (reader, writer):
        start = due = time.monotonic()
        while due < until:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            asked = time.monotonic()
            assert await fetch(reader, writer, sent) == 200
            answered = time.monotonic()
            run.probe.append(answered - asked)
            due = start + (int((answered - start) / PROBE_EVERY) + 1) * PROBE_EVERY


async def load(port: int, run: Run, seconds: float) -> None:
    """:data:`CONCURRENCY` clients and the probe for ``seconds``."""
    until = time.monotonic() + seconds
    tasks = [client(port, run, until, n) for n in range(CONCURRENCY)]
    await asyncio.wait_for(asyncio.gather(*tasks, probe(port, run, until)), seconds + 60)


def get_json(port: int, page: str) -> dict[str, Any]:
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    try:
        conn.request("GET", page)
        response = conn.getresponse()
        assert response.status == 200, f"{page}: {response.status}"
        return dict(json.loads(response.read()))
    finally:
        conn.close()


def ready_status(port: int, page: str) -> int:
    return status(port, page, {CLIENT_HEADER: "ready"})


def measure(port: int, proxies: list[DelayProxy]) -> dict[str, Run]:
    """Each page warmed up, then :data:`ROUNDS` turns of the pages under load."""
    for page in PAGES:
        asyncio.run(load(port, Run(page), WARM_UP))
    runs = {page: Run(page, answers=[0] * len(proxies)) for page in PAGES}
    for _round in range(ROUNDS):
        for run in runs.values():
            measure_round(port, proxies, run)
    return runs


def measure_round(port: int, proxies: list[DelayProxy], run: Run) -> None:
    """``run``'s page under load for a round, the loop's lag read just before and after
    (which starts its count again)."""
    get_json(port, "/lag/")
    answers = [proxy.answers for proxy in proxies]
    asyncio.run(load(port, run, SECONDS / ROUNDS))
    for n, (proxy, before) in enumerate(zip(proxies, answers, strict=True)):
        run.answers[n] += proxy.answers - before
    run.add_lag(get_json(port, "/lag/"))


# -- the counter servers, each behind a delay proxy -------------------------------------------


@contextlib.contextmanager
def servers(kind: str) -> Iterator[list[int]]:
    """The ports of ``kind``'s counter servers (a cluster's: its nodes'), started for this
    test alone (the cluster's nodes will announce other ports) and stopped on leaving."""
    with contextlib.ExitStack() as stack:
        if kind == REDIS_CLUSTER:
            from tests.servers.redis_cluster import Cluster  # (needs redis-py)

            cluster = start_or_skip(Cluster)
            stack.callback(cluster.stop)
            yield cluster.ports
            return
        start = procs.redis if kind == "redis" else procs.memcached
        nodes = [start_or_skip(start) for _ in range(2 if kind == "memcached-2-nodes" else 1)]
        for node in nodes:
            stack.callback(node.stop)
        yield [node.port for node in nodes]


def announced(node: int) -> set[int]:
    """The ports the cluster's node on ``node`` gives its clients (``CLUSTER SLOTS``)."""
    import redis

    with redis.Redis(host=HOST, port=node, socket_timeout=5) as client:
        return {int(owner[2][1]) for owner in client.execute_command("CLUSTER", "SLOTS")}


def announce(nodes: list[int], proxies: list[DelayProxy]) -> None:
    """Each node of the cluster on ``nodes`` announces its proxy's port (the clients then
    reach every node through its proxy), once every node tells so; checked with redis-py's
    cluster client through a proxy."""
    import redis
    from redis.cluster import RedisCluster

    ports = {proxy.port for proxy in proxies}
    for node, proxy in zip(nodes, proxies, strict=True):
        with redis.Redis(host=HOST, port=node, socket_timeout=5) as client:
            client.config_set("cluster-announce-ip", HOST)
            client.config_set("cluster-announce-port", proxy.port)
    # The other nodes learn it by gossip, within a second or so.
    assert wait_for(lambda: all(announced(node) == ports for node in nodes)), [
        announced(node) for node in nodes
    ]
    answers = [proxy.answers for proxy in proxies]
    keys = [f"announce-{n}" for n in range(30)]  # in every third of the slots
    with RedisCluster.from_url(f"redis://{HOST}:{proxies[0].port}/0") as client:
        assert {node.port for node in client.get_nodes()} == ports
        with client.pipeline() as pipe:  # (each node's commands in one round trip)
            for n, key in enumerate(keys):
                pipe.set(key, n)
            for key in keys:
                pipe.getdel(key)
            replies = pipe.execute()
    assert replies == [True] * len(keys) + [str(n).encode() for n in range(len(keys))]
    assert all(p.answers > a for p, a in zip(proxies, answers, strict=True)), "a node skipped"


@contextlib.contextmanager
def counters(kind: str) -> Iterator[tuple[dict[str, str], list[DelayProxy]]]:
    """``kind``'s servers, each behind a delay proxy: the site's settings (its counters
    through the proxies) and the proxies, all stopped on leaving."""
    with contextlib.ExitStack() as stack:
        nodes = stack.enter_context(servers(kind))
        proxies = [stack.enter_context(delayed(HOST, node, DELAY)) for node in nodes]
        if kind == REDIS_CLUSTER:
            announce(nodes, proxies)
        addresses = [f"{host}:{port}" for host, port in (proxy.address for proxy in proxies)]
        if kind.startswith("memcached"):
            site = {"RELIABILITY_COUNTERS": "memcached", "MEMCACHED_SERVERS": ",".join(addresses)}
        else:  # (a cluster's: one node, from which the client learns the others)
            site = {"RELIABILITY_COUNTERS": kind, "RELIABILITY_REDIS": f"redis://{addresses[0]}/0"}
        yield site, proxies


# -- the site --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site's SQLite database, migrated once for every backend (each test serves a
    copy of it). The counters play no part in migrating: the system checks, which look at
    them, are skipped (the site is checked by serving it)."""
    path = tmp_path_factory.mktemp("async-loop") / "db.sqlite3"
    site = env(DJANGO_SETTINGS_MODULE="tests.reliability.async_settings")
    migrate = [sys.executable, "-m", "django", "migrate", "--verbosity", "0", "--skip-checks"]
    site["RELIABILITY_SQLITE"] = str(path)
    subprocess.run(migrate, cwd=ROOT, env=site, check=True, timeout=120)
    return path


@contextlib.contextmanager
def uvicorn(tmp: Path, database: Path, settings: dict[str, str]) -> Iterator[int]:
    """One uvicorn worker on a free port serving :mod:`async_settings`' site, on a copy of
    the migrated ``database``."""
    shutil.copyfile(database, tmp / "db.sqlite3")
    site = env(
        DJANGO_SETTINGS_MODULE="tests.reliability.async_settings",
        RELIABILITY_SQLITE=str(tmp / "db.sqlite3"),
        **settings,
    )
    port = free_port()
    argv = [
        *(sys.executable, "-m", "uvicorn", "django.core.asgi:get_asgi_application"),
        *("--factory", "--workers", "1", "--host", HOST, "--port", str(port)),
        *("--no-access-log", "--lifespan", "off"),
    ]
    with serving(argv, site, tmp / "uvicorn.log", lambda: ready_status(port, "/plain/") == 200):
        yield port


def misses(runs: dict[str, Run]) -> list[str]:
    """Issue 40's targets each limited run misses."""
    plain = runs["/plain/"]
    most_p50 = max(MAX_PROBE_P50, SLOWER * statistics.median(plain.probe))
    most_tick_lag = max(MAX_TICK_LAG, SLOWER * plain.tick_lag)
    found = []
    for page in LIMITED:
        run = runs[page]
        ratio = run.rate / plain.rate
        if ratio < MIN_RATIO:
            found.append(f"{page} serves {ratio:.2f}x /plain/'s requests (want >= {MIN_RATIO})")
        p50 = statistics.median(run.probe)
        if p50 >= most_p50:
            found.append(f"probe p50 {ms(p50)} ms during {page} (want < {ms(most_p50)})")
        if run.tick_lag >= most_tick_lag:
            found.append(
                f"the loop's ticks were {ms(run.tick_lag)} ms late on average during {page}, "
                f"late {run.lag_share:.0%} of the run, at most {ms(run.lag['max_s'])} ms "
                f"(want < {ms(most_tick_lag)} ms a tick)"
            )
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_checks_never_make_the_event_loop_wait(kind: str, database: Path, tmp_path: Path) -> None:
    with counters(kind) as (site, proxies), uvicorn(tmp_path, database, site) as port:
        runs = measure(port, proxies)
    log = (tmp_path / "uvicorn.log").read_text(errors="replace")
    plain = runs["/plain/"]
    report(
        f"async_loop_{kind}",
        delay_ms=ms(DELAY),
        concurrency=CONCURRENCY,
        seconds=SECONDS,
        rounds=ROUNDS,
        nodes=len(proxies),
        **{page.strip("/"): run.numbers() for page, run in runs.items()},
        ratios={page: round(runs[page].rate / plain.rate, 3) for page in LIMITED},
    )
    # The setup works: every request answered 200, the limited ones checked on the servers
    # behind the proxies, every node of them (the subjects spread over the nodes), which
    # never failed (a failure is logged and fails open).
    for run in runs.values():
        assert set(run.statuses) == {200}, f"{run.page}: {run.statuses}"
        assert len(run.probe) >= 3, f"{run.page}: the probe barely ran"
    assert plain.done > CONCURRENCY * SECONDS, f"/plain/ barely served: {plain.numbers()}"
    for page in LIMITED:
        assert all(runs[page].answers), f"{page}: no check reached a node: {runs[page].answers}"
    assert "ratelimit:" not in log, f"the limiter logged errors:\n{log[-3000:]}"
    # Issue 40: the limits cost the loop no waiting.
    assert not misses(runs), "; ".join(misses(runs))
