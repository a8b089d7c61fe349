"""Graceful exit: SIGTERM and atexit flush the buffer (real subprocesses, file SQLite)."""

from __future__ import annotations

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
        METRICS_FLUSH_INTERVAL=3600,  # the thread will not get a chance: exit must flush
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    from django.core.management import call_command
    call_command("migrate", verbosity=0)
    import metrics_app
    mode = sys.argv[2]
    if mode == "chained":
        def previous(signum, frame):
            print("previous handler ran", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, previous)
    metrics_app.record("bye", 3)
    print("ready", flush=True)
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
        if mode != "exit":
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
