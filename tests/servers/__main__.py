"""``python -m tests.servers``: start one throwaway server, or install the missing ones.

Standard library only (``make servers`` runs it with the system's ``python3``)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence

import tests.servers
from tests.servers.debian import MissingServerBinary, ensure_packages
from tests.servers.memcached import start_memcached
from tests.servers.postgres import start_postgres
from tests.servers.processes import Server, ServerStartError
from tests.servers.redis import start_redis

STARTERS: dict[str, Callable[[], Server]] = {
    "memcached": start_memcached,
    "redis": start_redis,
    "postgres": start_postgres,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.servers", description=tests.servers.__doc__
    )
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
