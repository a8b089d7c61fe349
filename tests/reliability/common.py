"""Shared helpers: measured numbers go to ``tests/artifacts/reliability.json`` (git-ignored),
which ``docs/reliability.rst`` quotes; percentiles; subprocesses that always end."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.servers import wait_for

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "tests" / "artifacts" / "reliability.json"
_lock = threading.Lock()


def report(name: str, **numbers: Any) -> None:
    """Keep what a test measured (printed with ``-s``, and merged into the artifact)."""
    print(f"\n[reliability] {name}: {json.dumps(numbers, sort_keys=True)}")
    with _lock:
        ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(ARTIFACT.read_text())
        except (OSError, ValueError):
            data = {}
        data[name] = numbers
        ARTIFACT.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def summary(latencies: list[float]) -> dict[str, float]:
    """p50 / p99 / max in milliseconds."""
    if not latencies:
        return {"n": 0}
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "n": len(ordered),
        "p50_ms": ms(statistics.median(ordered)),
        "p99_ms": ms(p99),
        "max_ms": ms(ordered[-1]),
    }


def end(proc: subprocess.Popen[Any] | None, timeout: float = 10.0, group: bool = False) -> None:
    """SIGTERM, then SIGKILL after ``timeout``: a test never leaves a process behind.

    ``group``: ``proc`` was started with ``start_new_session=True``, and whatever is left of
    its process group once it has ended (children it did not stop: a Celery worker's pool
    and beat) is killed too.
    """
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    if group:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


@contextlib.contextmanager
def serving(
    argv: list[str], environ: dict[str, str], log_path: Path, ready: Callable[[], bool]
) -> Iterator[subprocess.Popen[bytes]]:
    """A server of ours (``argv``, a gunicorn's) started with ``environ``, its output in
    ``log_path``, once ``ready()`` says it answers; ended (:func:`end`) whatever happens."""
    with open(log_path, "wb") as log:  # (the child keeps its own descriptor)
        proc = subprocess.Popen(argv, cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT)
    try:
        up = wait_for(lambda: ready() or proc.poll() is not None)
        assert up and proc.poll() is None, f"the server did not start: {log_path}"
        yield proc
    finally:
        end(proc, timeout=30)


def env(**extra: str) -> dict[str, str]:
    """The environment of a Django subprocess of ours."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **extra}


#: ``RELIABILITY_COUNTERS`` of counters on a Redis Cluster (:func:`counter_backend`).
REDIS_CLUSTER = "redis-cluster"


def counter_caches() -> dict[str, dict[str, Any]]:
    """``CACHES`` of a one-module gunicorn site: the limiter's counters (alias
    ``ratelimit``) on ``RELIABILITY_COUNTERS``, ``memcached`` (``MEMCACHED_SERVERS``: one
    node, or several separated by commas), ``redis`` or ``redis-cluster``
    (``RELIABILITY_REDIS``: the server, or one node of the cluster; see
    :func:`counter_backend`), beside a local-memory default."""
    if os.environ.get("RELIABILITY_COUNTERS") == "memcached":
        counters: dict[str, Any] = {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": os.environ["MEMCACHED_SERVERS"].split(","),
        }
    else:
        counters = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": os.environ.get("RELIABILITY_REDIS", ""),
        }
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "ratelimit": counters,
    }


def counter_backend() -> str | None:
    """``RATELIMIT_BACKEND`` of the site: the Redis Cluster backend for ``redis-cluster``
    (django-redis has no cluster client: the cache alias only names a node), else ``None``
    (the backend that fits the cache)."""
    if os.environ.get("RELIABILITY_COUNTERS") == REDIS_CLUSTER:
        return "ratelimit_app.backends.redis.RedisClusterBackend"
    return None


def status(port: int, page: str, headers: dict[str, str] | None = None) -> int:
    """The status of one GET of ``page`` on a site of ours on ``port`` (0: no answer)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", page, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status
    except OSError:
        return 0
    finally:
        conn.close()
