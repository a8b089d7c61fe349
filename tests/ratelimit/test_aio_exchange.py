"""An exchange on the event loop (:func:`ratelimit_app.backends.aio.exchange`) sends, then
reads what comes back until its reader answers, and leaves the socket as it found it.

A socket with a timeout (the pools' sockets) is non-blocking in the kernel already: it is
written and read on its descriptor, its timeout untouched. A blocking socket is switched
for the exchange and switched back. The other end here is a thread of a plain socket
server on a socket pair: what a counter server does with bytes, without a protocol.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ratelimit_app.backends import aio


def until(end: bytes) -> Callable[[bytes], Any]:
    """A reader that answers the bytes read once they end with ``end``."""
    got = bytearray()

    def read(chunk: bytes) -> bytes | None:
        if not chunk:
            raise ConnectionError("closed")
        got.extend(chunk)
        return bytes(got) if got.endswith(end) else None

    return read


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


def serve(theirs: socket.socket, expect: int, answer: list[bytes]) -> threading.Thread:
    """Read ``expect`` bytes, then send each of ``answer`` (a reply in pieces)."""

    def run() -> None:
        got = 0
        while got < expect:
            got += len(theirs.recv(1 << 20))
        for piece in answer:
            theirs.sendall(piece)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def flags(sock: socket.socket) -> int:
    return fcntl.fcntl(sock.fileno(), fcntl.F_GETFL)


@pytest.mark.parametrize("timeout", [0.5, None])
async def test_an_exchange_answers_and_leaves_the_socket_as_it_was(
    pair: tuple[socket.socket, socket.socket], timeout: float | None
) -> None:
    ours, theirs = pair
    ours.settimeout(timeout)
    before = flags(ours)
    thread = serve(theirs, 5, [b"VA 1\r\n", b"1\r\n", b"MN\r\n"])
    assert await aio.exchange(ours, b"mn\r\n\r", until(b"MN\r\n")) == b"VA 1\r\n1\r\nMN\r\n"
    thread.join(5)
    assert ours.gettimeout() == timeout
    assert flags(ours) == before  # (a blocking socket is blocking again)
    assert bool(before & os.O_NONBLOCK) == (timeout is not None)


@pytest.mark.parametrize("timeout", [0.5, None])
async def test_a_request_longer_than_the_sockets_buffer_is_sent_whole(
    pair: tuple[socket.socket, socket.socket], timeout: float | None
) -> None:
    """What the first write could not take is sent when the loop can, then the answer read."""
    ours, theirs = pair
    ours.settimeout(timeout)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    data = b"x" * (4 << 20)
    thread = serve(theirs, len(data), [b"MN\r\n"])
    assert await aio.exchange(ours, data, until(b"MN\r\n")) == b"MN\r\n"
    thread.join(5)
    assert ours.gettimeout() == timeout


async def test_a_server_that_closes_mid_reply_is_a_failure(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    ours.settimeout(0.5)

    def run() -> None:
        theirs.recv(100)
        theirs.sendall(b"VA 1\r\n")
        theirs.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    with pytest.raises(ConnectionError):
        await aio.exchange(ours, b"mn\r\n", until(b"MN\r\n"))
    thread.join(5)


async def test_a_socket_with_a_timeout_is_not_switched(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """A pooled socket (with a timeout) is written and read on its descriptor: no switch of
    its timeout, which took four ``fcntl`` calls an exchange. A blocking one is switched
    and switched back."""
    ours, theirs = pair
    switched: list[float | None] = []

    class Counting(socket.socket):
        def settimeout(self, value: float | None) -> None:
            switched.append(value)
            super().settimeout(value)

    counting = Counting(ours.family, ours.type, ours.proto, ours.detach())
    try:
        counting.settimeout(0.5)
        switched.clear()
        thread = serve(theirs, 4, [b"MN\r\n"])
        assert await aio.exchange(counting, b"mn\r\n", until(b"MN\r\n")) == b"MN\r\n"
        thread.join(5)
        assert switched == []
        counting.settimeout(None)
        switched.clear()
        thread = serve(theirs, 4, [b"MN\r\n"])
        assert await aio.exchange(counting, b"mn\r\n", until(b"MN\r\n")) == b"MN\r\n"
        thread.join(5)
        assert switched == [0.0, None]
    finally:
        counting.close()
