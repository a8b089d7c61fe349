"""Graceful exit: SIGTERM and atexit flush the buffer (real subprocesses, file SQLite)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["metrics_app"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    from metrics_app.buffer import flusher
    flusher.FLUSH_INTERVAL = 3600  # the thread will not get a chance: exit must flush
    from django.core.management import call_command
    call_command("migrate", verbosity=0)
    import metrics_app
    mode = sys.argv[2]
    if mode == "chained":
        def previous(signum, frame):
            print("previous handler ran", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, previous)
    if mode == "forked":
        # Like gunicorn --preload: the parent installed its hooks before the fork; the child
        # inherits them and installs its own on its first record().
        metrics_app.record("before-fork")
        import warnings
        with warnings.catch_warnings():
            # Python 3.12+ warns of fork() in a process with threads (the flusher's), on
            # stderr, which this test reads: gunicorn --preload forks the same way.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid:
            _, status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    metrics_app.record("bye", 3)
    print("ready", flush=True)
    print(os.getpid(), flush=True)
    if mode == "exit":
        sys.exit(0)
    time.sleep(30)
    """
)


def run(tmp_path: Path, mode: str) -> tuple[int, str]:
    db = tmp_path / "db.sqlite3"
    with subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(db), mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        if mode == "forked":
            os.kill(int(proc.stdout.readline()), signal.SIGTERM)
        elif mode != "exit":
            proc.send_signal(signal.SIGTERM)
        out = proc.stdout.read()
        code = proc.wait(timeout=30)
    conn = sqlite3.connect(db)
    try:
        total = conn.execute("SELECT total FROM metrics_app_series WHERE name = 'bye'").fetchone()
    finally:
        conn.close()
    assert total == (3,), out
    return code, out


def test_atexit_flushes(tmp_path: Path) -> None:
    assert run(tmp_path, "exit")[0] == 0


def test_sigterm_with_default_action_flushes_then_exits_143(tmp_path: Path) -> None:
    assert run(tmp_path, "default")[0] == 128 + signal.SIGTERM


def test_sigterm_chains_the_previous_handler(tmp_path: Path) -> None:
    code, out = run(tmp_path, "chained")
    assert code == 0
    assert "previous handler ran" in out


def test_sigterm_in_a_forked_child_flushes_the_childs_counts_then_exits_143(
    tmp_path: Path,
) -> None:
    """The child's handler is the one it inherited, not chained to itself a second time."""
    assert run(tmp_path, "forked")[0] == 128 + signal.SIGTERM
