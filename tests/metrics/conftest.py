"""Fixtures for the metrics tests: quiet settings, a frozen clock, a real Celery worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError

from metrics_app import buffer, query, storage
from metrics_app.testing import FrozenClock, frozen_clock, manual_flush

ROOT = Path(__file__).resolve().parents[2]

#: A Wednesday noon, so weeks (Mondays) and days do not line up with "now".
T0 = datetime(2024, 3, 6, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _metrics_quiet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No flusher thread, no SIGTERM handler, no broker calls from queries; empty buffer."""
    buffer.reset()
    monkeypatch.setattr(query, "DOWNSAMPLE_ON_READ", False)
    with manual_flush():
        yield
    buffer.reset()


@pytest.fixture
def clock() -> Iterator[FrozenClock]:
    with frozen_clock(T0) as fake:
        yield fake


class Worker:
    """A real ``celery worker`` subprocess on the Redis broker, with its own database."""

    def __init__(self, broker: str, env: dict[str, str], log: Path) -> None:
        from celery import Celery

        self.broker = broker
        self.log = log
        self.app = Celery("metrics-tests-client", broker=broker, backend=broker)
        self.app.conf.broker_connection_retry_on_startup = True
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v0"],
            cwd=ROOT,
            env=self.env,
            check=True,
            timeout=60,
        )
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "tests.metrics.celery_app",
                    "worker",
                    "--pool=solo",
                    "--loglevel=INFO",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            self.call("tests.ping", timeout=30)
        except Exception:
            self.stop()
            raise AssertionError(
                f"celery worker did not answer:\n{self.log.read_text()}"
            ) from None

    def call(self, task: str, *args: Any, timeout: float = 30, **kwargs: Any) -> Any:
        result = self.app.send_task(task, args=args, kwargs=kwargs)
        try:
            return result.get(timeout=timeout)
        finally:
            result.forget()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.app.close()


@pytest.fixture(scope="module")
def celery_worker(request: pytest.FixtureRequest, redis_server: str) -> Iterator[Worker]:
    """A worker process whose database is PostgreSQL with ``--db=postgres``, else a file.

    The worker has its own database (it cannot share the in-memory SQLite test database), so
    tests drive it through tasks: ``tests.seed`` and ``tests.snapshot`` in
    ``tests/metrics/celery_app.py``, beside the real ``metrics_app.*`` tasks.
    """
    tmp = Path(tempfile.mkdtemp(prefix="metrics-worker-"))
    if request.config.getoption("--db") == "postgres":
        database = dict(request.getfixturevalue("postgres_server"))
    else:
        database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp / "worker.sqlite3")}
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.metrics.worker_settings",
        "METRICS_WORKER_DB": json.dumps(database),
        "METRICS_TEST_REDIS": redis_server,
        "PYTHONPATH": str(ROOT),
    }
    worker = Worker(redis_server, env, tmp / "worker.log")
    worker.start()
    yield worker
    worker.stop()


def lose_first_commit_reply(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the next flush commit but raise as if the reply to its COMMIT were lost."""
    real = storage.write_counts
    calls: list[str] = []

    def commit_then_lose_reply(counts: Any, flush_id: str, **kw: Any) -> bool:
        calls.append(flush_id)
        applied = real(counts, flush_id, **kw)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return applied

    monkeypatch.setattr(storage, "write_counts", commit_then_lose_reply)
    return calls
