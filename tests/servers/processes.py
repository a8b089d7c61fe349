"""Ports, processes and the :class:`Server` handle every throwaway server returns.

A free port is one the OS handed out a moment ago (bind to port 0): another process may grab
it before the server binds, so :func:`start_process` retries a server that dies at start on a
new port. Each server runs in a fresh temp dir in its own process group, and its ``stop()``
is registered with :mod:`atexit`, so an interrupted run leaves no server behind.
"""

from __future__ import annotations

import atexit
import functools
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

HOST = "127.0.0.1"
#: Seconds a server has to accept connections after it was started.
START_TIMEOUT = 20.0
#: Starts on a new free port before a server counts as broken.
START_ATTEMPTS = 5

#: ``argv(port, tmpdir)``: the command line of a foreground server on ``port``.
Argv = Callable[[int, str], list[str]]


class ServerStartError(RuntimeError):
    """A server was found but did not come up; the message carries its log."""


@dataclass
class Server:
    """A running throwaway server. ``address`` is ``host:port``; ``url`` is client-ready."""

    name: str
    host: str
    port: int
    url: str
    tmpdir: str
    _stop: Callable[[], None] = field(repr=False)
    extra: dict[str, str] = field(default_factory=dict)
    _stopped: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        """Stop the server and delete its temp dir. Safe to call more than once."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._stop()
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def free_port(host: str = HOST) -> int:
    """A port that was free a moment ago (the OS picks it when binding port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def accepts(host: str, port: int) -> bool:
    """Whether something accepts a TCP connection on ``host:port`` within half a second."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def is_root() -> bool:
    return os.geteuid() == 0


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def read_tail(path: str, limit: int = 4000) -> str:
    """The last ``limit`` characters of a log file ("" if it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()[-limit:]
    except OSError:
        return ""


def run_checked(argv: Sequence[str], what: str) -> None:
    """Run ``argv`` to its end; :class:`ServerStartError` with its output if it fails."""
    result = subprocess.run(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    if result.returncode != 0:
        output = result.stdout.decode("utf-8", "replace")[-4000:]
        raise ServerStartError(f"{what} failed (exit {result.returncode}):\n{output}")


def terminate(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if ``proc`` has not ended within ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def start_process(name: str, make_argv: Argv, url: Callable[[int], str]) -> Server:
    """Run a foreground server on a free port, retrying when the port was taken meanwhile."""
    last_log = ""
    for _attempt in range(START_ATTEMPTS):
        tmpdir = tempfile.mkdtemp(prefix=f"bucketry-{name}-")
        port = free_port()
        log_path = os.path.join(tmpdir, f"{name}.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                make_argv(port, tmpdir),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=tmpdir,
                # Own process group: Ctrl-C in the terminal reaches us, not the server first.
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            if accepts(HOST, port):
                server = Server(
                    name=name,
                    host=HOST,
                    port=port,
                    url=url(port),
                    tmpdir=tmpdir,
                    _stop=functools.partial(terminate, proc),
                )
                atexit.register(server.stop)
                return server
            time.sleep(0.05)
        terminate(proc)
        last_log = read_tail(log_path)
        shutil.rmtree(tmpdir, ignore_errors=True)
    raise ServerStartError(f"{name} did not start after {START_ATTEMPTS} attempts:\n{last_log}")


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll ``predicate()`` until it returns something truthy; return its last value (falsy
    on timeout). For tests waiting on servers, workers and flushes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def gunicorn_argv(wsgi: str, port: int, workers: int = 4) -> list[str]:
    """gunicorn serving ``wsgi`` (a module path) with ``workers`` sync workers on loopback
    ``port``; a graceful stop waits up to 20 s for the workers (they flush their visits)."""
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "--workers",
        str(workers),
        "--worker-class",
        "sync",
        "--bind",
        f"{HOST}:{port}",
        "--graceful-timeout",
        "20",
        "--timeout",
        "60",
        wsgi,
    ]
