"""``make demo``'s script end to end, as a person runs it: start, use, Ctrl-C, start again.

The script (``python -m demo_site.run``, what the Makefile's ``demo`` target runs after
``make venv-demo``) is started in a session of its own, with its state in a temporary
directory and none of the variables that would point it at servers. Ctrl-C is what a
terminal sends: SIGINT to the script's process group. Every process of the session (the
script, the web server, the Celery worker and its beat) must then be gone. The waits are
generous; nothing here times the demo.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from http.cookiejar import CookieJar
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from demo_site.run import describe
from tests.demo.conftest import ROOT, VARIABLES

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="finds the demo's processes in /proc (Linux)"
)

START_WAIT, STOP_WAIT = 180.0, 60.0
SEND_DOWNSAMPLE = "from metrics_app.tasks import downsample; downsample.delay()"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def session_processes(sid: int) -> list[int]:
    """Every live process of session ``sid`` (zombies included: a zombie is an unreaped
    child, which would also be a bug)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid:
            found.append(int(entry.name))
    return found


class Demo:
    """``python -m demo_site.run`` in a session of its own, its output collected."""

    def __init__(self, state_dir: Path, port: int) -> None:
        env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        env.pop("PORT", None)
        env["DEMO_STATE_DIR"] = str(state_dir)
        self.env = dict(env, DJANGO_SETTINGS_MODULE="demo_site.settings")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "demo_site.run", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            self._queue.put(line)
        self.process.stdout.close()
        self._queue.put(None)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        """The first line matching ``pattern``, waiting up to ``timeout`` seconds."""
        for line in self.lines:
            if match := re.search(pattern, line):
                return match
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            if match := re.search(pattern, line):
                return match
        pytest.fail(f"no line matching {pattern!r} in {timeout:.0f} s:\n{self.output}")

    def ctrl_c(self) -> None:
        """What a terminal's Ctrl-C does: SIGINT to the foreground process group."""
        os.killpg(self.process.pid, signal.SIGINT)

    def wait_until_gone(self) -> list[int]:
        """Wait for the script to exit and its session to empty; the pids left, if any."""
        self.process.wait(timeout=STOP_WAIT)
        deadline = time.monotonic() + STOP_WAIT
        while (left := session_processes(self.process.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def kill_everything(self) -> None:
        for pid in session_processes(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=10)


class NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Browser:
    """A cookie-keeping HTTP client that does not follow redirects."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies = CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies), NoRedirects()
        )

    def request(self, path: str, data: dict[str, str] | None = None) -> tuple[int, str, str]:
        """``(status, Location header, body)``."""
        body = None if data is None else urllib.parse.urlencode(data).encode()
        try:
            with self.opener.open(self.base + path, data=body, timeout=30) as response:
                return response.status, "", response.read().decode()
        except urllib.error.HTTPError as answer:
            return answer.code, answer.headers.get("Location", ""), answer.read().decode()

    def cookie(self, name: str) -> str:
        return next(c.value or "" for c in self.cookies if c.name == name)


@pytest.fixture
def demos() -> Iterator[list[Demo]]:
    """Started demos; whatever a failed test leaves running is killed."""
    started: list[Demo] = []
    yield started
    for demo in started:
        if demo.process.poll() is None or session_processes(demo.process.pid):
            demo.kill_everything()


def test_start_use_stop_and_start_again(tmp_path: Path, demos: list[Demo]) -> None:
    state = tmp_path / "state"
    port = free_port()

    # First run: migrations, the seed, the superuser, then the servers.
    first = Demo(state, port)
    demos.append(first)
    base = first.wait_for(r"==> demo site: (http://127\.0\.0\.1:\d+)/", START_WAIT).group(1)
    assert base == f"http://127.0.0.1:{port}"
    first.wait_for(r"Press Ctrl-C to stop", START_WAIT)
    for expected in (
        "applying",
        "Seeded 4 links",
        "created the superuser demo (password: demo)",
        "WARNING: this is a demo",
        f"admin:     {base}/admin/",
        "database: SQLite",
        "(default;",
    ):
        assert expected in first.output
    first.wait_for(r"\[celery\] .* ready\.", START_WAIT)

    browser = Browser(base)
    status, _, home = browser.request("/")
    assert status == 200 and 'name="url"' in home and "/links/docs/" in home
    assert browser.request("/admin/login/")[0] == 200
    status, location, _ = browser.request(
        "/", {"url": "https://example.com/e2e", "csrfmiddlewaretoken": browser.cookie("csrftoken")}
    )
    assert status == 302
    key = re.fullmatch(r"/links/([^/]+)/", location)
    assert key is not None
    for _ in range(2):
        assert browser.request(f"/s/{key.group(1)}")[:2] == (302, "https://example.com/e2e")

    # The worker takes tasks from the demo's broker (the filesystem transport here).
    sent = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SEND_DOWNSAMPLE],
        cwd=ROOT,
        env=first.env,
        capture_output=True,
        text=True,
        timeout=STOP_WAIT,
        check=False,
    )
    assert sent.returncode == 0, sent.stderr
    first.wait_for(r"\[celery\] .*Task metrics_app\.downsample\[.*\] succeeded", START_WAIT)

    running = session_processes(first.process.pid)
    assert len(running) >= 4, first.output  # the script, the web server, the worker, its beat
    first.ctrl_c()
    assert first.wait_until_gone() == [], first.output
    assert first.process.returncode == 0, first.output
    assert "==> stopped" in first.output

    # The two visits reached the database: flushed by the web server at the latest as it
    # stopped (Ctrl-C ends it through its normal exit, which flushes the buffer).
    with closing(sqlite3.connect(state / "db.sqlite3")) as db:  # "with" alone never closes it
        total = db.execute(
            "SELECT total FROM metrics_app_series WHERE name = ?", (f"shorturl:{key.group(1)}",)
        ).fetchone()
    assert total == (2,)

    # Second run: everything is there, nothing is redone.
    second = Demo(state, port)
    demos.append(second)
    second.wait_for(r"==> demo site: ", START_WAIT)
    for expected in ("migrations: up to date", "already seeded", "superuser demo exists"):
        assert expected in second.output
    assert "applying" not in second.output
    assert Browser(base).request("/links/docs/")[0] == 200
    second.ctrl_c()
    assert second.wait_until_gone() == [], second.output
    assert second.process.returncode == 0


def test_a_busy_port_is_refused_with_advice(tmp_path: Path, demos: list[Demo]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        demo = Demo(tmp_path / "state", port)
        demos.append(demo)
        assert demo.process.wait(timeout=STOP_WAIT) == 2
    assert f"make demo PORT={port + 1}" in demo.output
    assert session_processes(demo.process.pid) == []


def test_a_bad_variable_is_named(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "demo_site.run", "--port", str(free_port())],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k not in VARIABLES},
            "DEMO_STATE_DIR": str(tmp_path / "state"),
            "DATABASE_URL": "mysql://u:hunter2@h/db",
        },
        capture_output=True,
        text=True,
        timeout=STOP_WAIT,
        check=False,
    )
    assert done.returncode == 2
    assert "error: DATABASE_URL: unsupported scheme 'mysql'" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout


def test_describe_says_where_each_setting_comes_from() -> None:
    defaults = SimpleNamespace(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "/x/db.sqlite3"}},
        CACHES={"ratelimit": {"LOCATION": "local"}},
        MEMCACHED_SERVERS=[],
        REDIS_URL=None,
        CELERY_BROKER_TRANSPORT_OPTIONS={"data_folder_in": "/x/broker/queue"},
    )
    lines = describe(defaults, {})
    assert lines[0] == (
        "database: SQLite /x/db.sqlite3 (default; set DATABASE_URL=postgres://... for PostgreSQL)"
    )
    assert "the web server's memory (default;" in lines[1]
    assert lines[2] == "Celery broker: files in /x/broker (default; set REDIS_URL for Redis)"

    servers = SimpleNamespace(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": "demo",
                "HOST": "db",
                "PORT": "5433",
            }
        },
        CACHES={"ratelimit": {"LOCATION": ["m1:11211", "m2:11211"]}},
        MEMCACHED_SERVERS=["m1:11211", "m2:11211"],
        REDIS_URL="redis://:hunter2@r:6379/0",
    )
    lines = describe(servers, {"DATABASE_URL": "postgres://..."})
    assert lines == [
        "database: PostgreSQL demo on db:5433 (from DATABASE_URL)",
        "rate-limit counters: memcached m1:11211, m2:11211 (from MEMCACHED_SERVERS)",
        "cache and Celery broker: Redis redis://:***@r:6379/0 (from REDIS_URL)",
    ]


def test_the_makefile_runs_this_script() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = re.search(r"^demo: venv-demo\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target is not None
    assert target.group(1) == '\t@$(PY) -m demo_site.run --port "$${PORT:-8000}"\n'
