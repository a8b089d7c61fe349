"""``make demo``: set the demo up, run the web server and a Celery worker, stop on Ctrl-C.

``python -m demo_site.run [--port 8000]`` (the Makefile's ``demo`` target, after
``make venv-demo``):

1. checks that the port is free and reads the settings (a bad ``DATABASE_URL``,
   ``MEMCACHED_SERVERS`` or ``REDIS_URL`` stops it here, naming the variable), and says which
   database, counters and broker it uses, and whether they come from the environment;
2. applies the migrations that are not applied yet, seeds the demo data (``demo_seed``, once)
   and creates the superuser ``demo`` (password ``demo``) if it does not exist; on a second
   run each of these finds its work done in a query, so the demo starts in seconds;
3. starts ``manage.py runserver`` on ``127.0.0.1:<port>`` and ``celery -A demo_site worker
   --beat``, each in a process group of its own, their output prefixed with their name;
4. prints the URLs once the web server answers, and waits;
5. on Ctrl-C (SIGINT), SIGTERM or SIGHUP, or when one of them exits, stops both: SIGINT to
   the web server (which flushes its buffered visits at exit), SIGTERM to the worker (a warm
   shutdown), and SIGKILL to whatever is left of either process group after 15 seconds, so
   no process outlives the demo.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

BASE_DIR = Path(__file__).resolve().parent.parent
SETTINGS_MODULE = "demo_site.settings"
DEMO_USER, DEMO_PASSWORD, DEMO_EMAIL = "demo", "demo", "demo@example.com"
#: Seconds to wait for the web server to answer, and for the children to stop.
START_TIMEOUT, STOP_TIMEOUT = 60.0, 15.0

_print_lock = threading.Lock()


def say(line: str = "", *, stream: IO[str] | None = None) -> None:
    """Print a line at once (the children's output is printed from threads too)."""
    with _print_lock:
        print(line, file=stream or sys.stdout, flush=True)


class DemoError(Exception):
    """A problem the person running the demo can fix; the message says how."""


def check_port(host: str, port: int) -> None:
    """Raise :class:`DemoError` if ``host:port`` cannot be listened on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise DemoError(
                f"cannot listen on {host}:{port} ({exc.strerror}): is another demo running? "
                f"Choose another port: make demo PORT={port + 1}"
            ) from None


def describe(settings: Any, environ: Mapping[str, str]) -> list[str]:
    """What the demo runs on, one line each, saying which values come from the environment."""
    from demo_site.env import masked_url

    lines = []
    database = settings.DATABASES["default"]
    if environ.get("DATABASE_URL", "").strip():
        source = "from DATABASE_URL"
    else:
        source = "default; set DATABASE_URL=postgres://... for PostgreSQL"
    if database["ENGINE"].endswith("postgresql"):
        where = f"{database['HOST'] or 'local socket'}:{database['PORT'] or 5432}"
        lines.append(f"database: PostgreSQL {database['NAME']} on {where} ({source})")
    else:
        lines.append(f"database: SQLite {database['NAME']} ({source})")
    counters = settings.CACHES["ratelimit"]
    if settings.MEMCACHED_SERVERS:
        lines.append(
            f"rate-limit counters: memcached {', '.join(counters['LOCATION'])} "
            "(from MEMCACHED_SERVERS)"
        )
    elif settings.REDIS_URL:
        lines.append(
            f"rate-limit counters: Redis {masked_url(settings.REDIS_URL)} (from REDIS_URL)"
        )
    else:
        lines.append(
            "rate-limit counters: the web server's memory (default; set MEMCACHED_SERVERS or "
            "REDIS_URL to share them)"
        )
    if settings.REDIS_URL:
        lines.append(
            f"cache and Celery broker: Redis {masked_url(settings.REDIS_URL)} (from REDIS_URL)"
        )
    else:
        folder = settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"]
        lines.append(
            f"Celery broker: files in {Path(folder).parent} (default; set REDIS_URL for Redis)"
        )
    return lines


def prepare() -> None:
    """Migrate if needed, seed once, create the superuser if missing (in this process)."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        say(f"==> applying {len(plan)} migrations")
        call_command("migrate", interactive=False, verbosity=0)
    else:
        say("==> migrations: up to date")
    say("==> demo data")
    call_command("demo_seed")
    user_model = get_user_model()
    if user_model.objects.filter(username=DEMO_USER).exists():
        say(f"==> superuser {DEMO_USER} exists")
    else:
        user_model.objects.create_superuser(DEMO_USER, DEMO_EMAIL, DEMO_PASSWORD)
        say(f"==> created the superuser {DEMO_USER} (password: {DEMO_PASSWORD})")


@dataclass
class Child:
    """A process the demo started, in a process group of its own."""

    name: str
    process: subprocess.Popen[str]
    stop_signal: int
    reader: threading.Thread | None = None

    def group_alive(self) -> bool:
        """True while any process of the child's group exists (the leader, or its children:
        the worker's embedded beat)."""
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover  (a pid reused by another user)
            return False
        return True

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)


class Supervisor:
    """Starts the children, relays their output, and stops every one of them."""

    def __init__(self) -> None:
        self.children: list[Child] = []
        self.stop_requested = threading.Event()
        self.reason = ""

    def start(self, name: str, command: Sequence[str], stop_signal: int) -> Child:
        env = dict(os.environ, DJANGO_SETTINGS_MODULE=SETTINGS_MODULE, PYTHONUNBUFFERED="1")
        process = subprocess.Popen(
            list(command),
            cwd=BASE_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            # Its own group: Ctrl-C reaches only this process, which stops each group in
            # order, and a group signal also reaches the worker's own children.
            process_group=0,
        )
        child = Child(name, process, stop_signal)
        child.reader = threading.Thread(
            target=self._relay, args=(child,), name=f"relay-{name}", daemon=True
        )
        child.reader.start()
        self.children.append(child)
        return child

    @staticmethod
    def _relay(child: Child) -> None:
        assert child.process.stdout is not None
        for line in child.process.stdout:
            say(f"[{child.name}] {line.rstrip()}")

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """Signal handler: stop (the main loop notices within half a second)."""
        self.reason = signal.Signals(signum).name
        self.stop_requested.set()

    def dead_child(self) -> Child | None:
        return next((c for c in self.children if c.process.poll() is not None), None)

    def wait_for_port(self, host: str, port: int, timeout: float) -> bool:
        """True once ``host:port`` accepts a connection; False on a stop, a dead child or
        the timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stop_requested.is_set() or self.dead_child() is not None:
                return False
            try:
                with socket.create_connection((host, port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.1)
        return False

    def run_until_stopped(self) -> int:
        """Wait for a stop signal (exit status 0) or a child's exit (1)."""
        while not self.stop_requested.wait(0.5):
            dead = self.dead_child()
            if dead is not None:
                say(
                    f"==> {dead.name} exited with status {dead.process.returncode}: stopping",
                    stream=sys.stderr,
                )
                return 1
        say(f"\n==> {self.reason or 'stop'}: stopping the web server and the Celery worker")
        return 0

    def stop_all(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every child group: its stop signal, then SIGKILL after ``timeout`` seconds."""
        for child in self.children:
            child.signal_group(child.stop_signal)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(c.group_alive() for c in self.children):
            for child in self.children:
                child.process.poll()  # reap the leader, so its group can empty
            time.sleep(0.1)
        for child in self.children:
            if child.group_alive():
                say(f"==> {child.name} did not stop in {timeout:.0f} s: killing it")
                child.signal_group(signal.SIGKILL)
            child.process.wait()
            if child.reader is not None:
                child.reader.join(timeout=5)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo until Ctrl-C; the exit status is 0 after a requested stop."""
    parser = argparse.ArgumentParser(prog="python -m demo_site.run", description=__doc__)
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("PORT") or 8000), help="default 8000"
    )
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    args = parser.parse_args(argv)
    started = time.monotonic()
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    sys.path.insert(0, str(BASE_DIR))

    import django
    from django.core.exceptions import ImproperlyConfigured
    from django.db import DatabaseError, connections

    configured = False
    try:
        check_port(args.host, args.port)
        django.setup()
        configured = True
        from django.conf import settings

        say(f"==> django-bucketry demo (files in {getattr(settings, 'STATE_DIR', '?')})")
        for line in describe(settings, os.environ):
            say(f"    {line}")
        prepare()
    except (DemoError, ImproperlyConfigured) as exc:
        say(f"error: {exc}", stream=sys.stderr)
        return 2
    except DatabaseError as exc:
        say(f"error: the database failed: {exc}", stream=sys.stderr)
        return 2
    finally:
        if configured:
            connections.close_all()  # the children open their own

    say(f"WARNING: this is a demo: the superuser {DEMO_USER} has the password '{DEMO_PASSWORD}'.")
    say(f"         Keep it on {args.host}; never expose it to a network.")

    supervisor = Supervisor()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, supervisor.request_stop)
    address = f"{args.host}:{args.port}"
    status = 1
    try:
        python = sys.executable
        celery = [python, "-m", "celery", "-A", "demo_site", "worker", "--beat", "--pool", "solo"]
        celery += ["--loglevel", "INFO", "--hostname", "demo@%h"]
        celery += ["--without-gossip", "--without-mingle"]  # one worker: nobody to talk to
        # --insecure: serve the admin's CSS even with DEBUG=false (a demo, never production).
        supervisor.start(
            "web",
            [python, "manage.py", "runserver", "--noreload", "--insecure", address],
            signal.SIGINT,  # KeyboardInterrupt: a normal exit, so the atexit flush runs
        )
        supervisor.start(
            "celery",
            celery,
            signal.SIGTERM,  # a warm shutdown
        )
        if supervisor.wait_for_port(args.host, args.port, START_TIMEOUT):
            base = f"http://{address}"
            say(f"==> demo site: {base}/   (ready in {time.monotonic() - started:.1f} s)")
            say(f"    admin:     {base}/admin/   log in as {DEMO_USER} / {DEMO_PASSWORD}")
            say(f"    limits:    {base}/limits/   charts: {base}/links/docs/")
            say("    Press Ctrl-C to stop.")
            status = supervisor.run_until_stopped()
        elif not supervisor.stop_requested.is_set():
            say(f"error: the web server did not answer on {address}", stream=sys.stderr)
    finally:
        supervisor.stop_all()
    say("==> stopped")
    return status


if __name__ == "__main__":
    sys.exit(main())
