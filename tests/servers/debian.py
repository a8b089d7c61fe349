"""Where the server binaries are, and the Debian packages that install them.

``make servers`` (``python3 -m tests.servers --ensure``) installs what is missing when run as
root; otherwise it prints the ``apt-get`` line to run.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from tests.servers.processes import is_root

#: The Debian package that provides each binary we need.
PACKAGES: dict[str, str] = {
    "memcached": "memcached",
    "redis-server": "redis-server",
    "initdb": "postgresql",
    "pg_ctl": "postgresql",
    "chromium": "chromium",
    "wrk": "wrk",  # the load bench (python -m bench.load) and its smoke test
    "valgrind": "valgrind",  # instructions per request (python -m bench.instructions)
    "prometheus": "prometheus",  # a real scrape of the exporter (tests/reliability)
    "promtool": "prometheus",  # the documented alerts and the scrape checked (docs/observability)
}
#: Other names a binary may go by on a developer machine.
ALIASES: dict[str, tuple[str, ...]] = {
    "chromium": ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"),
}
#: PostgreSQL's programs, which Debian keeps out of PATH.
POSTGRES_PROGRAMS = frozenset({"initdb", "pg_ctl", "postgres", "createdb"})


class MissingServerBinary(RuntimeError):
    """A server binary is not installed; ``package`` names the Debian package to install."""

    def __init__(self, binary: str, package: str) -> None:
        super().__init__(
            f"{binary!r} not found on PATH: install the Debian package {package!r} "
            f"(apt-get install {package}, or run `make servers` as root)"
        )
        self.binary = binary
        self.package = package


def postgres_bin_dirs() -> list[str]:
    """Debian's PostgreSQL program directories, one per major version, newest first."""

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
    if name in POSTGRES_PROGRAMS:
        for directory in postgres_bin_dirs():
            path = os.path.join(directory, name)
            if os.access(path, os.X_OK):
                return path
    return None


def require_binary(name: str) -> str:
    """The path of ``name``; :class:`MissingServerBinary` naming its package if absent."""
    path = find_binary(name)
    if path is None:
        raise MissingServerBinary(name, PACKAGES.get(name, name))
    return path


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
        print(f"servers: {', '.join(sorted(set(PACKAGES.values())))} all present")
        return 0
    names = " ".join(missing)
    if not is_root():
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
