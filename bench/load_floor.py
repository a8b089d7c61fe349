"""The floor of the load bench: one memcached round trip per request and no limiter around it.

:class:`RoundTripFloor` sits where ``RatelimitMiddleware`` does (bench settings only) and, for
the paths under :data:`FLOOR_PATH`, sends the memcached commands of the bench's three rules
(six ``ma`` increments and one ``get`` of 30 keys, keys of the same length as the limiter's,
fixed ones), waits for the whole reply, and adds ``RateLimit-Policy`` and ``RateLimit``
headers of the same length as the three rules' (fixed strings). It decides nothing.

What a request of this case costs over the plain view is what any limiter that keeps the
guarantees of ``docs/concepts`` (every request counted in shared memory before it is
admitted) pays on this machine before its own Python: the part of any budget for the
limiter (docs/performance: the 25% first asked of the three rules) that is not ours to spend.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

#: Requests under this path go through the floor (and to the bench's counted view).
FLOOR_PATH = "/bench/floor/"
#: The three bench rules' counts: six increments (a fine and a coarse bucket per rule) and
#: 30 buckets read: 10 per rule, the mean of a one-rate check at the default 60 buckets per
#: window (8 to 12 as the clock moves: the window's coarse buckets, the fine ones at its old
#: edge and the lookahead's next coarse bucket).
INCREMENTS = 6
READS = 30


def _key(i: int) -> bytes:
    """A key as long as the limiter's (``:1:rl:{<32 hex>}:60/60x10:179537758``)."""
    digest = hashlib.blake2b(b"floor%d" % (i // 8)).hexdigest()[:32]
    return b":1:rl:{%s}:60/60x10:%09d" % (digest.encode(), 179537758 + i)


def command() -> bytes:
    """The bytes the floor sends, as the limiter sends them: the increments, then a quiet
    meta read of each key marked with its place (the increments' keys, which hit, and
    others, which miss, as in a young window), then ``mn``."""
    writes = b"".join(b"ma %s N62 J1 v\r\n" % _key(i) for i in range(INCREMENTS))
    reads = b"".join(b"mg %s v q O%d\r\n" % (_key(i), i) for i in range(READS))
    return writes + reads + b"mn\r\n"


COMMAND = command()
#: (name, unit, window seconds, seconds to reset) of the three bench rules.
RULES = (
    ("bench-ip-m", "m", 60, 61),
    ("bench-email-h", "h", 3600, 3643),
    ("bench-ip-d", "d", 86400, 87763),
)
#: The headers of the rules that count the client itself (by its address), as the
#: limiter adds them: not the email rule's.
SHOWN = tuple(rule for rule in RULES if "-ip-" in rule[0])
HEADERS = {
    "RateLimit-Policy": ", ".join(
        f'"{name}:1000000000/{unit}";q=1000000000;w={window}' for name, unit, window, _ in SHOWN
    ),
    "RateLimit": ", ".join(
        f'"{name}:1000000000/{unit}";r=999999990;t={reset}' for name, unit, _, reset in SHOWN
    ),
}


def _address() -> tuple[str, int]:
    first = os.environ["MEMCACHED_SERVERS"].split(",")[0].strip()
    host, _, port = first.rpartition(":")
    return host or "127.0.0.1", int(port)


class RoundTripFloor:
    """Bench only: one round trip with the limiter's commands, nothing decided."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.sock: socket.socket | None = None  # connected in the worker, after the fork

    def round_trip(self) -> bytes:
        if self.sock is None:
            self.sock = socket.create_connection(_address(), timeout=1.0)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(COMMAND)
        reply = self.sock.recv(65536)
        while not reply.endswith(b"MN\r\n"):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("memcached closed the connection")
            reply += chunk
        return reply

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(FLOOR_PATH):
            response: HttpResponse = self.get_response(request)
            return response
        self.round_trip()
        response = self.get_response(request)
        for name, value in HEADERS.items():
            response[name] = value
        return response
