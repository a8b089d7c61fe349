"""Fixtures of the reliability tests: servers of their own, which tests kill and restart;
and the helpers several of their modules share: worker processes
(:mod:`tests.reliability.worker`) on a cluster of their own, and clients in processes of
threads (:func:`load`)."""

from __future__ import annotations

import json
import multiprocessing
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import start_or_skip
from tests.reliability import clients, procs
from tests.reliability.common import ROOT, end, env

#: The clients of :func:`load`: this many processes of this many threads.
PROCESSES, THREADS = 4, 8


@pytest.fixture
def own_memcached() -> Iterator[procs.Restartable]:
    server = start_or_skip(procs.memcached)
    yield server
    server.stop()


@pytest.fixture
def own_redis() -> Iterator[procs.Restartable]:
    server = start_or_skip(procs.redis)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[procs.Postgres]:
    server = start_or_skip(procs.Postgres)
    yield server
    server.stop()


# -- worker processes: tests/reliability/worker.py on a database of its own ----------------


def worker_env(pg: procs.Postgres, **extra: str) -> dict[str, str]:
    return env(
        DJANGO_SETTINGS_MODULE="tests.reliability.worker_settings",
        RELIABILITY_DB=json.dumps(pg.database),
        **extra,
    )


def spawn(pg: procs.Postgres, *args: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.worker", *args],
        cwd=ROOT,
        env=worker_env(pg, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> list[dict[str, Any]]:
    """The JSON lines of a worker that must exit 0 within ``timeout``."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        end(proc)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{stderr[-3000:]}"
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def run(pg: procs.Postgres, *args: str, **extra: str) -> dict[str, Any]:
    return finish(spawn(pg, *args, **extra))[-1]


# -- clients and a graceful stop of gunicorn ----------------------------------------------------


def load(
    port: int,
    path: str,
    requests: int,
    seconds: float = 60.0,
    form: dict[str, str] | None = None,
) -> list[tuple[int, int, float]]:
    """PROCESSES x THREADS clients, ``requests`` each (POSTs of ``form`` if given, see
    :func:`clients.hammer`), all starting together."""
    # After the client processes have started (and, for a form, fetched its page).
    start = time.time() + (1.5 if form is None else 2.0)
    context = multiprocessing.get_context("spawn")
    with context.Pool(PROCESSES) as pool:
        parts = [
            pool.apply_async(
                clients.hammer, (port, path, THREADS, requests, start, start + seconds, form)
            )
            for _ in range(PROCESSES)
        ]
        return [hit for part in parts for hit in part.get(timeout=seconds + 90)]


def stop(proc: subprocess.Popen[bytes]) -> None:
    """A graceful stop: SIGTERM to the master, which stops every worker."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
