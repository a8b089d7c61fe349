"""A throwaway redis-server on a free loopback port, without persistence."""

from __future__ import annotations

from tests.servers.debian import require_binary
from tests.servers.processes import HOST, Argv, Server, start_process


def redis_argv() -> Argv:
    """``argv(port, tmpdir)`` of a loopback redis-server without persistence."""
    binary = require_binary("redis-server")

    def argv(port: int, tmpdir: str) -> list[str]:
        args = [binary, "--port", str(port), "--bind", HOST, "--save", ""]
        return [*args, "--appendonly", "no", "--dir", tmpdir]

    return argv


def start_redis() -> Server:
    """Start redis-server on a free loopback port. ``url`` is ``redis://127.0.0.1:PORT/0``."""
    return start_process("redis", redis_argv(), url=lambda port: f"redis://{HOST}:{port}/0")
