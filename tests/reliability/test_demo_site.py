"""demo_site itself under gunicorn (4 sync workers) with a Celery worker and its beat.

The servers are real and the tests' own: PostgreSQL (``DATABASE_URL``), memcached
(``MEMCACHED_SERVERS``) and Redis (``REDIS_URL``: Celery's broker, the default cache, and the
rate-limit counters when no memcached is given), all through demo_site's environment
variables; ``tests.reliability.demo_settings`` only where demo_site has no switch (the Redis
metrics buffer). Clients are 4 processes of 8 threads (:func:`tests.reliability.clients.hammer`).

* The ``signup`` rule (20 a day per IP: every client is 127.0.0.1, one subject) admits exactly
  20 sign-ups across the 4 workers, with the counters in memcached and in Redis.
* Every redirect of ``/s/<key>`` the clients saw is in the series ``shorturl:<key>`` after a
  graceful stop (memory buffer: each worker flushes on SIGTERM), or once the Celery worker's
  beat has drained the Redis buffer.

Numbers go to ``tests/artifacts/reliability.json`` (``demo-site-*``).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis as redis_py

from tests.reliability import clients, procs
from tests.reliability.common import ROOT, end, env, report
from tests.reliability.conftest import PROCESSES, THREADS, load, stop
from tests.servers import gunicorn_argv, wait_for

pytestmark = pytest.mark.slow

#: demo_site's ``signup`` rule: ``20/d`` per IP (``demo_site/settings.py``).
SIGNUP_LIMIT = 20
PASSWORD = "Bucketry-reliability-83150"
#: Seconds of redirects in the visit-count tests.
SECONDS = 4.0
#: metrics_app's Redis buffer (``redis_buffer.REDIS_KEY`` in a hash tag) and its pending set.
REDIS_BUFFER = "{metrics:buffer}"


def demo_env(pg: procs.Postgres, state_dir: Path, **extra: str) -> dict[str, str]:
    """demo_site's variables, every one given (nothing leaks in from the caller's shell)."""
    db = pg.database
    variables = {
        "DJANGO_SETTINGS_MODULE": "demo_site.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "MEMCACHED_SERVERS": "",
        "REDIS_URL": "",
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECRET_KEY": "django-bucketry-demo-site-test-not-secret",
        "DEMO_STATE_DIR": str(state_dir),  # the beat schedule file
    }
    return env(**{**variables, **extra})


@pytest.fixture(scope="module")
def demo_db(
    own_postgres: procs.Postgres, tmp_path_factory: pytest.TempPathFactory
) -> procs.Postgres:
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"],
        cwd=ROOT,
        env=demo_env(own_postgres, tmp_path_factory.mktemp("demo-migrate")),
        check=True,
        timeout=120,
    )
    return own_postgres


def sql(pg: procs.Postgres, query: str, *args: Any) -> Any:
    """The first column of the first row of ``query`` (None when there is no row)."""
    db = pg.database
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], dbname=db["NAME"], user=db["USER"], connect_timeout=5
    ) as conn:
        row = conn.execute(query, args).fetchone()
    return None if row is None else row[0]


def total(pg: procs.Postgres, series: str) -> int:
    found = sql(pg, "SELECT total FROM metrics_app_series WHERE name = %s", series)
    return int(found or 0)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@contextlib.contextmanager
def celery_worker(environ: dict[str, str], logdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A demo_site worker --beat`` (prefork, 2 processes), in a session of its own:
    SIGTERM (a warm shutdown), then SIGKILL to whatever is left, whatever happens."""
    log_path = logdir / "celery.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "demo_site",
                "worker",
                "--beat",
                "--loglevel=INFO",
                "--concurrency=2",
                "--hostname",
                f"demo-test-{uuid.uuid4().hex[:8]}@%h",
            ],
            cwd=ROOT,
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def started() -> bool:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        return " ready." in text and "beat: Starting" in text

    try:
        wait_for(lambda: started() or proc.poll() is not None, timeout=40, interval=0.1)
        assert proc.poll() is None and started(), f"celery did not start:\n{_tail(log_path)}"
        yield proc
    finally:
        end(proc, timeout=20, group=True)


@contextlib.contextmanager
def gunicorn(
    environ: dict[str, str], logdir: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``gunicorn demo_site.wsgi``, 4 sync workers on a free port; SIGTERM (then SIGKILL, to
    the whole session) at the end whatever happens."""
    port = procs.free_port()
    log_path = logdir / "gunicorn.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            gunicorn_argv("demo_site.wsgi", port),
            cwd=ROOT,
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        up = wait_for(lambda: clients.get(port, "/limits/")[0] == 200 or proc.poll() is not None)
        assert up and proc.poll() is None, f"gunicorn did not start:\n{_tail(log_path)}"
        yield proc, port
    finally:
        end(proc, timeout=30, group=True)


def memcached_items(address: str) -> int:
    """``curr_items`` of a memcached (``stats``)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    stats = dict(line.split(" ")[1:3] for line in data.decode().splitlines() if " " in line)
    return int(stats["curr_items"])


def ratelimit_keys(url: str) -> int:
    """Rate-limit counters in a Redis: django-redis' ``:1:`` and ``RATELIMIT_CACHE_PREFIX``."""
    client = redis_py.Redis.from_url(url)
    try:
        return sum(1 for _key in client.scan_iter(match=":1:rl:*", count=1000))
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["memcached", "redis"])
def test_signup_limit_holds_across_workers(
    demo_db: procs.Postgres,
    own_redis: procs.Restartable,
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """32 clients POST 3 sign-ups each (96, all valid, each with a new username and email):
    exactly 20 accounts are created (302), the other 76 get 429, whichever worker serves."""
    servers = {"REDIS_URL": own_redis.url}
    memcached: procs.Restartable | None = None
    if kind == "memcached":
        memcached = request.getfixturevalue("own_memcached")
        servers["MEMCACHED_SERVERS"] = memcached.address
    environ = demo_env(demo_db, tmp_path, **servers)
    tag = uuid.uuid4().hex[:8]
    form = {
        "username": f"u{tag}-{{n}}",
        "email": f"u{tag}-{{n}}@example.com",
        "password1": PASSWORD,
        "password2": PASSWORD,
    }
    requests = 3
    with celery_worker(environ, tmp_path), gunicorn(environ, tmp_path) as (_proc, port):
        began = time.monotonic()
        hits = load(port, "/accounts/signup/", requests, form=form)
        elapsed = time.monotonic() - began
        in_redis = ratelimit_keys(own_redis.url)
        in_memcached = memcached_items(memcached.address) if memcached else 0
    statuses = Counter(status for status, _pid, _t in hits)
    accounts = sql(demo_db, "SELECT count(*) FROM auth_user WHERE username LIKE %s", f"u{tag}-%")
    report(
        f"demo-site-signup-limit-{kind}",
        limit=SIGNUP_LIMIT,
        requests=len(hits),
        statuses={str(k): v for k, v in statuses.items()},
        accounts_created=accounts,
        counters_in_memcached=in_memcached,
        counters_in_redis=in_redis,
        seconds=round(elapsed, 2),
    )
    assert len(hits) == PROCESSES * THREADS * requests
    assert set(statuses) <= {302, 429}, statuses  # every admitted sign-up was valid
    assert statuses[302] <= SIGNUP_LIMIT  # never lenient, across 4 workers
    assert statuses[302] == SIGNUP_LIMIT  # and tight: all within one window
    assert accounts == SIGNUP_LIMIT
    # The counters are where demo_site says: memcached when given, else Redis.
    if kind == "memcached":
        assert in_memcached > 0 and in_redis == 0
    else:
        assert in_redis > 0


def create_link(port: int, url: str) -> str:
    """Through the site's form, as a visitor would: the new link's key."""
    browser = clients.Browser(port)
    assert browser.request("GET", "/")[0] == 200
    status, location, _t = browser.request("POST", "/", {"url": url})
    assert status == 302 and location.startswith("/links/"), (status, location)
    return location.rstrip("/").rsplit("/", 1)[-1]


def redis_buffer_empty(url: str) -> bool:
    """Nothing left in metrics_app's Redis buffer: no live hash, no hash being drained."""
    client = redis_py.Redis.from_url(url)
    try:
        return not client.exists(REDIS_BUFFER) and not client.scard(f"{REDIS_BUFFER}:pending")
    finally:
        client.close()


@pytest.mark.parametrize("buffer", ["memory", "redis"])
def test_visit_counts_are_exact(
    demo_db: procs.Postgres, own_redis: procs.Restartable, buffer: str, tmp_path: Path
) -> None:
    """32 clients follow one short link for 4 s; gunicorn is stopped with SIGTERM. Memory
    buffer: the series total equals the 302s seen once gunicorn has exited (each worker flushes
    on SIGTERM). Redis buffer: the web workers only ``HINCRBY``; the Celery worker's beat
    drains the buffer into the database (every 10 s), and the total reaches exactly the 302s
    seen."""
    settings = "demo_site.settings" if buffer == "memory" else "tests.reliability.demo_settings"
    environ = demo_env(demo_db, tmp_path, REDIS_URL=own_redis.url, DJANGO_SETTINGS_MODULE=settings)
    with celery_worker(environ, tmp_path), gunicorn(environ, tmp_path) as (proc, port):
        key = create_link(port, f"https://example.com/{buffer}/{uuid.uuid4().hex}")
        series = f"shorturl:{key}"
        hits = load(port, f"/s/{key}", requests=1_000_000, seconds=SECONDS)
        stored_before_stop = total(demo_db, series)
        began = time.monotonic()
        stop(proc)
        stop_seconds = time.monotonic() - began
        stored_at_stop = total(demo_db, series)
        drain_seconds = 0.0
        if buffer == "redis":
            # Bounded: the beat sends a drain every 10 s.
            wait_for(lambda: total(demo_db, series) >= len(hits), timeout=45, interval=0.2)
            wait_for(lambda: redis_buffer_empty(own_redis.url), timeout=15, interval=0.2)
            drain_seconds = time.monotonic() - began
    stored = total(demo_db, series)
    statuses = Counter(status for status, _pid, _t in hits)
    seen = statuses[302]
    report(
        f"demo-site-visits-{buffer}",
        redirects_seen=seen,
        requests=len(hits),
        requests_per_s=round(len(hits) / SECONDS),
        stored=stored,
        stored_before_stop=stored_before_stop,
        stored_when_gunicorn_exited=stored_at_stop,
        graceful_stop_s=round(stop_seconds, 2),
        drained_after_s=round(drain_seconds, 2),
    )
    assert set(statuses) == {302}, statuses
    assert seen >= PROCESSES * THREADS  # enough traffic to mean something
    if buffer == "redis":
        assert redis_buffer_empty(own_redis.url)
    assert stored == seen
