"""A pooled connection to a counter server, used from an event loop without blocking it.

The async path of the engine (:func:`ratelimit_app.engine.trips.arun`) awaits a backend's
:meth:`~ratelimit_app.backends.base.Backend.aexecute`. memcached and Redis answer it on the
very connections their sync path pools (:class:`~ratelimit_app.backends.base.IdlePool`, one
pool per process and server): a check takes one, switches its socket to non-blocking for
the exchange, sends at once and reads when the running loop says the socket is readable,
and gives it back as it found it. So the loop serves other requests
while a server answers, and the connections are the same whichever path, thread or loop
used them last: no pool per event loop, nothing left behind by a loop that ends (Django
runs an async view under WSGI on an event loop of its own per request).

An exchange is bounded by :data:`~ratelimit_app.backends.base.SOCKET_TIMEOUT` (the sync
path bounds each read by it). A connection whose exchange failed, timed out or was
cancelled is closed by the caller, never given back: a late reply must not be read as the
next command's. A connection that is not open yet connects in a thread of the loop's
executor (once per pooled connection: a connect may resolve a name).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from typing import Any

from ratelimit_app.backends import base

__all__ = ["exchange"]


async def exchange(sock: socket.socket, data: bytes, read: Callable[[bytes], Any]) -> Any:
    """Send ``data`` on ``sock`` and feed ``read`` what comes back until it answers (not
    None), through the running loop; the socket is left as it was found (its timeout).
    ``read(b"")``: the server closed the connection (``read`` raises).

    What ``loop.sock_recv`` does, for less: the request is sent at once (a check's fits
    the socket's buffer), and the answer read when the loop says the socket is readable,
    with one timer for the wait. A socket with a timeout, as the pools make them, is
    already non-blocking in the kernel (Python waits for it in ``poll``): it is written and
    read with ``os.write`` and ``os.read`` on its descriptor, which never wait, and its
    timeout is left alone (switching it off and on again took four ``fcntl`` calls an
    exchange). A blocking socket (no timeout) is switched for the exchange, and so is every
    socket where a descriptor is no file (Windows)."""
    timeout = sock.gettimeout()
    if timeout is None or not _DESCRIPTOR_IO:
        sock.settimeout(0.0)
        try:
            return await _exchanged(sock, data, read, False)
        finally:
            sock.settimeout(timeout)
    return await _exchanged(sock, data, read, True)


#: A socket's descriptor is read and written with ``os.read`` and ``os.write`` (POSIX; on
#: Windows a socket is no file descriptor).
_DESCRIPTOR_IO = os.name == "posix"


async def _exchanged(
    sock: socket.socket, data: bytes, read: Callable[[bytes], Any], descriptor: bool
) -> Any:
    """:func:`exchange` on ``sock``, non-blocking now: on its descriptor (``descriptor``)
    or through the socket's own calls."""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    try:
        sent = os.write(fd, data) if descriptor else sock.send(data)
    except (BlockingIOError, InterruptedError):  # (a buffer full: all of it when the loop can)
        sent = 0
    if sent < len(data):  # (the loop's sendall wants the socket switched: it is, for that)
        timeout = sock.gettimeout()
        sock.settimeout(0.0)
        try:
            await asyncio.wait_for(loop.sock_sendall(sock, data[sent:]), base.SOCKET_TIMEOUT)
        finally:
            sock.settimeout(timeout)
    # The answer is never back as the request leaves (a round trip takes tens of
    # microseconds; a read tried at once found nothing 1,962 times in 2,000): wait for the
    # loop to say it is, then read what is there, and wait again only for more.
    await _readable(loop, fd)
    while True:
        try:
            chunk = os.read(fd, 65536) if descriptor else sock.recv(65536)
        except (BlockingIOError, InterruptedError):  # (the rest of a long answer)
            await _readable(loop, fd)
            continue
        answer = read(chunk)
        if answer is not None:
            return answer


async def _readable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Until ``fd`` is readable, within the socket timeout."""
    ready = loop.create_future()
    loop.add_reader(fd, _set, ready)
    late = loop.call_later(base.SOCKET_TIMEOUT, _late, ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
        late.cancel()


def _set(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


def _late(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_exception(TimeoutError(f"no answer within {base.SOCKET_TIMEOUT} s"))
