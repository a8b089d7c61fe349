"""Throwaway memcached, Redis and PostgreSQL servers on free loopback ports.

Standard library only: ``make servers`` runs ``python3 -m tests.servers --ensure`` before the
virtualenv exists, and the fixtures in ``tests/conftest.py`` import this without Django.

Each ``start_*`` function picks a free port (bind to port 0, then hand the port to the server;
another process may grab it in between, so a server that dies at start is retried on a new
port), runs the server in a fresh temp dir, waits until it accepts connections and returns a
:class:`Server`. ``stop()`` is idempotent and also registered with :mod:`atexit`, so an
interrupted test run leaves no server behind.

CLI::

    python -m tests.servers memcached|redis|postgres   # start one, print it, wait for Ctrl-C
    python -m tests.servers --ensure                   # install missing Debian packages
"""

from __future__ import annotations

import argparse
import atexit
import functools
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MissingServerBinary",
    "Server",
    "ServerStartError",
    "ensure_packages",
    "find_binary",
    "start_memcached",
    "start_postgres",
    "start_redis",
    "wait_for",
]

HOST = "127.0.0.1"
START_TIMEOUT = 20.0
START_ATTEMPTS = 5

# Debian package that provides each binary we need.
PACKAGES: dict[str, str] = {
    "memcached": "memcached",
    "redis-server": "redis-server",
    "initdb": "postgresql",
    "pg_ctl": "postgresql",
    "chromium": "chromium",
    "wrk": "wrk",  # the load bench (bench/load.py) and its smoke test
}
# Other names a binary may go by on a developer machine.
ALIASES: dict[str, tuple[str, ...]] = {
    "chromium": ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"),
}


class MissingServerBinary(RuntimeError):
    """A server binary is not installed; ``package`` names the Debian package to install."""

    def __init__(self, binary: str, package: str) -> None:
        super().__init__(
            f"{binary!r} not found on PATH: install the Debian package {package!r} "
            f"(apt-get install {package}, or run `make servers` as root)"
        )
        self.binary = binary
        self.package = package


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


def _postgres_bin_dirs() -> list[str]:
    # Debian keeps initdb/pg_ctl out of PATH, one directory per major version; newest first.
    def version(path: str) -> float:
        try:
            return float(path.split("/")[-2])
        except ValueError:
            return 0.0

    return sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)


def find_binary(name: str) -> str | None:
    """Return the path of ``name`` (PATH, then PostgreSQL's Debian dirs), or None."""
    for candidate in ALIASES.get(name, (name,)):
        found = shutil.which(candidate)
        if found:
            return found
    if name in {"initdb", "pg_ctl", "postgres", "createdb"}:
        for directory in _postgres_bin_dirs():
            path = os.path.join(directory, name)
            if os.access(path, os.X_OK):
                return path
    return None


def require_binary(name: str) -> str:
    path = find_binary(name)
    if path is None:
        raise MissingServerBinary(name, PACKAGES.get(name, name))
    return path


def free_port(host: str = HOST) -> int:
    """A port that was free a moment ago (the OS picks it when binding port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _is_root() -> bool:
    return os.geteuid() == 0


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _read(path: str, limit: int = 4000) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()[-limit:]
    except OSError:
        return ""


def _terminate(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def _start_process(
    name: str, make_argv: Callable[[int, str], list[str]], url: Callable[[int], str]
) -> Server:
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
            if _accepts(HOST, port):
                server = Server(
                    name=name,
                    host=HOST,
                    port=port,
                    url=url(port),
                    tmpdir=tmpdir,
                    _stop=functools.partial(_terminate, proc),
                )
                atexit.register(server.stop)
                return server
            time.sleep(0.05)
        _terminate(proc)
        last_log = _read(log_path)
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


Argv = Callable[[int, str], list[str]]


def memcached_argv(memory_mb: int = 64, threads: int = 2) -> Argv:
    """``argv(port, tmpdir)`` of a loopback memcached (also for servers tests restart)."""
    binary = require_binary("memcached")

    def argv(port: int, _tmpdir: str) -> list[str]:
        args = [binary, "-l", HOST, "-p", str(port), "-U", "0"]
        args += ["-m", str(memory_mb), "-t", str(threads)]
        if _is_root():
            # memcached refuses to run as root without -u; drop to nobody when it exists.
            args += ["-u", "nobody" if _user_exists("nobody") else "root"]
        return args

    return argv


def redis_argv() -> Argv:
    """``argv(port, tmpdir)`` of a loopback redis-server without persistence."""
    binary = require_binary("redis-server")

    def argv(port: int, tmpdir: str) -> list[str]:
        args = [binary, "--port", str(port), "--bind", HOST, "--save", ""]
        return [*args, "--appendonly", "no", "--dir", tmpdir]

    return argv


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


def start_memcached(memory_mb: int = 64, threads: int = 2) -> Server:
    """Start memcached on a free loopback port. ``url`` is ``127.0.0.1:PORT``."""
    argv = memcached_argv(memory_mb, threads)
    return _start_process("memcached", argv, url=lambda port: f"{HOST}:{port}")


def start_redis() -> Server:
    """Start redis-server on a free loopback port. ``url`` is ``redis://127.0.0.1:PORT/0``."""
    return _start_process("redis", redis_argv(), url=lambda port: f"redis://{HOST}:{port}/0")


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _as_postgres_user(argv: Sequence[str]) -> list[str]:
    """PostgreSQL refuses to run as root: when we are root, run it as the postgres user."""
    if not _is_root():
        return list(argv)
    runuser = shutil.which("runuser")
    if runuser is None or not _user_exists("postgres"):
        raise ServerStartError(
            "running as root needs `runuser` (util-linux) and a `postgres` OS user "
            "(created by the Debian package 'postgresql') to start PostgreSQL"
        )
    return [runuser, "-u", "postgres", "--", *argv]


def _run(argv: Sequence[str], what: str) -> None:
    result = subprocess.run(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    if result.returncode != 0:
        output = result.stdout.decode("utf-8", "replace")[-4000:]
        raise ServerStartError(f"{what} failed (exit {result.returncode}):\n{output}")


def start_postgres(dbname: str = "bucketry", user: str = "postgres") -> Server:
    """Start a PostgreSQL cluster in a temp dir on a free loopback port, trust auth.

    ``url`` is ``postgresql://postgres@127.0.0.1:PORT/bucketry``; ``extra`` holds
    ``dbname``, ``user`` and ``socket_dir``.
    """
    initdb = require_binary("initdb")
    pg_ctl = require_binary("pg_ctl")
    last_error = ""
    for _attempt in range(START_ATTEMPTS):
        tmpdir = tempfile.mkdtemp(prefix="bucketry-postgres-")
        datadir = os.path.join(tmpdir, "data")
        logfile = os.path.join(tmpdir, "postgres.log")
        if _is_root() and _user_exists("postgres"):
            entry = pwd.getpwnam("postgres")
            os.chown(tmpdir, entry.pw_uid, entry.pw_gid)
        try:
            _run(
                _as_postgres_user(
                    [
                        initdb,
                        "-D",
                        datadir,
                        "-U",
                        user,
                        "--auth=trust",
                        "-E",
                        "UTF8",
                        "--no-locale",
                        "--no-sync",
                    ]
                ),
                "initdb",
            )
        except ServerStartError:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        port = free_port()
        # fsync off: a throwaway cluster need not survive a power cut, and tests go faster.
        options = f"-p {port} -k {tmpdir} -c listen_addresses={HOST} -c fsync=off"
        start = [pg_ctl, "-D", datadir, "-l", logfile, "-w", "-t", "30", "-o", options, "start"]
        stop = _as_postgres_user([pg_ctl, "-D", datadir, "-m", "fast", "-w", "stop"])
        try:
            _run(_as_postgres_user(start), "pg_ctl start")
        except ServerStartError as exc:
            # Most likely the port was taken between free_port() and the bind: retry.
            last_error = f"{exc}\n{_read(logfile)}"
            subprocess.run(stop, capture_output=True, check=False)
            shutil.rmtree(tmpdir, ignore_errors=True)
            continue

        def stop_cluster(stop: list[str] = stop) -> None:
            subprocess.run(stop, capture_output=True, check=False, timeout=60)

        server = Server(
            name="postgres",
            host=HOST,
            port=port,
            url=f"postgresql://{user}@{HOST}:{port}/{dbname}",
            tmpdir=tmpdir,
            _stop=stop_cluster,
            extra={"dbname": dbname, "user": user, "socket_dir": tmpdir},
        )
        atexit.register(server.stop)
        try:
            createdb = find_binary("createdb")
            if createdb is None:
                raise ServerStartError("createdb not found next to initdb")
            _run([createdb, "-h", HOST, "-p", str(port), "-U", user, dbname], "createdb")
        except BaseException:
            server.stop()
            raise
        return server
    raise ServerStartError(
        f"postgres did not start after {START_ATTEMPTS} attempts:\n{last_error}"
    )


STARTERS: dict[str, Callable[[], Server]] = {
    "memcached": start_memcached,
    "redis": start_redis,
    "postgres": start_postgres,
}


def missing_packages(binaries: Sequence[str] = tuple(PACKAGES)) -> list[str]:
    """Debian packages still needed for ``binaries``, without duplicates, in order."""
    missing: list[str] = []
    for binary in binaries:
        package = PACKAGES.get(binary, binary)
        if find_binary(binary) is None and package not in missing:
            missing.append(package)
    return missing


def ensure_packages(binaries: Sequence[str] = tuple(PACKAGES)) -> int:
    """Install missing server packages with apt-get when root; otherwise say what to install.

    Returns a process exit status.
    """
    missing = missing_packages(binaries)
    if not missing:
        print("servers: memcached, redis-server, postgresql, chromium all present")
        return 0
    names = " ".join(missing)
    if not _is_root():
        print(
            f"servers: missing Debian package(s): {names}\n"
            f"         install them with: sudo apt-get install -y {names}",
            file=sys.stderr,
        )
        return 1
    if shutil.which("apt-get") is None:
        print(f"servers: missing {names} and no apt-get to install them", file=sys.stderr)
        return 1
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # apt's progress output would bury the test output: keep it in a log, show it on failure.
    with tempfile.NamedTemporaryFile(
        "w+", prefix="bucketry-apt-", suffix=".log", delete=False
    ) as log:
        print(f"servers: installing {names} with apt-get (log: {log.name})", flush=True)
        for argv in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        ):
            result = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            if result.returncode != 0:
                log.seek(0)
                tail = "".join(log.readlines()[-40:])
                print(f"{tail}servers: `{' '.join(argv)}` failed", file=sys.stderr)
                return 1
    still = missing_packages(binaries)
    if still:
        print(f"servers: still missing after install: {' '.join(still)}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.servers", description=__doc__)
    parser.add_argument("server", nargs="?", choices=sorted(STARTERS))
    parser.add_argument(
        "--ensure", action="store_true", help="install missing Debian packages (root only)"
    )
    args = parser.parse_args(argv)
    if args.ensure:
        return ensure_packages()
    if args.server is None:
        parser.error("name a server or pass --ensure")
    try:
        server = STARTERS[args.server]()
    except (MissingServerBinary, ServerStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{server.name} listening on {server.address}")
    print(f"url: {server.url}", flush=True)
    print("Ctrl-C to stop", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        # A second signal must not cut the shutdown short and leave the server running.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        server.stop()
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
