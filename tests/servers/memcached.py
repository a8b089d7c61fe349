"""A throwaway memcached on a free loopback port."""

from __future__ import annotations

from tests.servers.debian import require_binary
from tests.servers.processes import HOST, Argv, Server, is_root, start_process, user_exists


def memcached_argv(memory_mb: int = 64, threads: int = 2) -> Argv:
    """``argv(port, tmpdir)`` of a loopback memcached (also for servers tests restart)."""
    binary = require_binary("memcached")

    def argv(port: int, _tmpdir: str) -> list[str]:
        args = [binary, "-l", HOST, "-p", str(port), "-U", "0"]
        args += ["-m", str(memory_mb), "-t", str(threads)]
        if is_root():
            # memcached refuses to run as root without -u; drop to nobody when it exists.
            args += ["-u", "nobody" if user_exists("nobody") else "root"]
        return args

    return argv


def start_memcached(memory_mb: int = 64, threads: int = 2) -> Server:
    """Start memcached on a free loopback port. ``url`` is ``127.0.0.1:PORT``."""
    argv = memcached_argv(memory_mb, threads)
    return start_process("memcached", argv, url=lambda port: f"{HOST}:{port}")
