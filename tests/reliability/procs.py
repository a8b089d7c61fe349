"""Servers the reliability tests may kill, freeze and restart on the same port.

The session servers of ``tests/conftest.py`` are shared by the whole run and must never be
hurt, so these tests start their own: memcached and Redis as foreground processes whose pid
we hold (``kill`` is SIGKILL, ``freeze`` is SIGSTOP: a server that accepts connections and
never answers), PostgreSQL through :func:`tests.servers.start_postgres` with ``pg_ctl`` to stop
and start the same cluster again. Standard library only, built on :mod:`tests.servers`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

from tests.servers import (
    HOST,
    START_ATTEMPTS,
    ServerStartError,
    accepts,
    as_postgres_user,
    free_port,
    memcached_argv,
    redis_argv,
    require_binary,
    run_checked,
    start_postgres,
)

TIMEOUT = 20.0


def process_state(pid: int) -> str:
    """The one-letter state /proc reports for ``pid`` (``T``: stopped), or ``""`` if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


class Restartable:
    """A foreground server process on a fixed port, which tests kill and start again."""

    def __init__(self, name: str, argv: Callable[[int, str], list[str]], url: str) -> None:
        self.name = name
        self._argv = argv
        self._url = url
        self.tmpdir = tempfile.mkdtemp(prefix=f"bucketry-reliability-{name}-")
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return self._url.format(address=self.address)

    def start(self) -> Restartable:
        """First start on a free port (retried on a new one if it was taken meanwhile)."""
        for _attempt in range(START_ATTEMPTS):
            self.port = free_port()
            if self._launch():
                return self
        raise ServerStartError(f"{self.name} did not start: {self.log()}")

    def restart(self) -> None:
        """Start again on the same port (the clients' configuration names it)."""
        self.kill()
        deadline = time.monotonic() + TIMEOUT
        while not self._launch():
            if time.monotonic() > deadline:
                raise ServerStartError(f"{self.name} did not restart: {self.log()}")
            time.sleep(0.1)

    def _launch(self) -> bool:
        log = open(os.path.join(self.tmpdir, "log"), "ab")  # noqa: SIM115 (the child keeps it)
        with log:
            self.proc = subprocess.Popen(
                self._argv(self.port, self.tmpdir),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.tmpdir,
                start_new_session=True,
            )
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and self.proc.poll() is None:
            if accepts(HOST, self.port):
                return True
            time.sleep(0.02)
        self.kill()
        return False

    def kill(self) -> None:
        """SIGKILL: no goodbye to the clients, every count it held is gone."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: the port still accepts connections (the kernel does), nothing answers."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        # The signal takes effect asynchronously: until the kernel reports the process as
        # stopped it may still answer a request or two sent after this call.
        deadline = time.monotonic() + TIMEOUT
        while process_state(self.proc.pid) not in ("T", "t"):
            if time.monotonic() > deadline:
                raise ServerStartError(f"{self.name} did not stop on SIGSTOP")
            time.sleep(0.001)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log(self) -> str:
        try:
            with open(os.path.join(self.tmpdir, "log"), encoding="utf-8", errors="replace") as fh:
                return fh.read()[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        self.kill()
        subprocess.run(["rm", "-rf", self.tmpdir], check=False)


def memcached() -> Restartable:
    return Restartable("memcached", memcached_argv(), "{address}").start()


def redis() -> Restartable:
    return Restartable("redis", redis_argv(), "redis://{address}/0").start()


class Postgres:
    """A throwaway cluster (``tests.servers.start_postgres``) that can be stopped and started."""

    def __init__(self) -> None:
        self.server = start_postgres()
        self.pg_ctl = require_binary("pg_ctl")
        self.datadir = os.path.join(self.server.tmpdir, "data")

    @property
    def database(self) -> dict[str, Any]:
        """A ``DATABASES`` entry for the cluster's database."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": self.server.extra["dbname"],
            "USER": self.server.extra["user"],
            "PASSWORD": "",
            "HOST": self.server.host,
            "PORT": str(self.server.port),
            # Short connect timeout: a flush against a stopped server fails fast.
            "OPTIONS": {"connect_timeout": 2},
        }

    def down(self) -> None:
        """Stop at once (``-m immediate``: open connections are cut, as in a crash)."""
        run_checked(
            as_postgres_user([self.pg_ctl, "-D", self.datadir, "-m", "immediate", "-w", "stop"]),
            "pg_ctl stop",
        )

    def up(self) -> None:
        tmpdir, port = self.server.tmpdir, self.server.port
        options = f"-p {port} -k {tmpdir} -c listen_addresses={HOST} -c fsync=off"
        logfile = os.path.join(tmpdir, "postgres.log")
        argv = [self.pg_ctl, "-D", self.datadir, "-l", logfile, "-w", "-t", "30"]
        run_checked(as_postgres_user([*argv, "-o", options, "start"]), "pg_ctl start")

    def stop(self) -> None:
        self.server.stop()
