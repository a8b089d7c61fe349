"""A TCP proxy that makes a server slow to answer: every chunk the server sends back reaches
the client ``delay`` seconds after the proxy read it, in order, per connection (what the
client sends goes through at once). A round trip through it takes ``delay`` more, which is
what a counter server across a network does to the limiter.

It runs on an event loop of its own in a background thread, on a free loopback port:
:func:`delayed` starts it and stops it. Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

HOST = "127.0.0.1"
#: Bytes read at once.
CHUNK = 65536


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` as it comes; close ``writer`` at the end."""
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _delayed_pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proxy: DelayProxy
) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``proxy.delay`` seconds after it was read (a
    queue keeps them in order; a chunk read while an earlier one waits is not delayed twice),
    and count the chunks (``proxy.answers``)."""
    delay = proxy.delay
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        try:
            while chunk := await reader.read(CHUNK):
                queue.put_nowait((time.monotonic() + delay, chunk))
                proxy.held += 1
                proxy.most_held = max(proxy.most_held, proxy.held)
        except (ConnectionError, OSError):
            pass
        queue.put_nowait((time.monotonic() + delay, b""))  # the end, delayed too

    reading = asyncio.ensure_future(read())
    try:
        while True:
            due, chunk = await queue.get()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if not chunk:
                break
            proxy.held -= 1
            writer.write(chunk)
            proxy.answers += 1
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        reading.cancel()
        writer.close()


class DelayProxy:
    """The proxy's loop, thread and listening socket; :meth:`start` and :meth:`stop` it.
    ``answers``: the chunks it has passed back to clients (so many answers at most: a test can
    tell that its client did go through it); ``held``: the answers it holds back now, and
    ``most_held`` the most it held at once (several: clients that waited at the same time,
    over connections of their own)."""

    def __init__(self, target_host: str, target_port: int, delay: float) -> None:
        self.target = (target_host, target_port)
        self.delay = delay
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.answers = 0
        self.held = self.most_held = 0

    @property
    def address(self) -> tuple[str, int]:
        return HOST, self.port

    async def _handle(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except (OSError, asyncio.CancelledError) as exc:
            client_w.close()
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        await asyncio.gather(_pipe(client_r, server_w), _delayed_pipe(server_r, client_w, self))

    def _track(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._handle(reader, writer))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _listen(self) -> int:
        self.server = await asyncio.start_server(self._track, HOST, 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:  # (after the connections: 3.12 waits for them)
            await asyncio.wait_for(self.server.wait_closed(), 5)

    def start(self) -> DelayProxy:
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@contextlib.contextmanager
def delayed(target_host: str, target_port: int, delay: float) -> Iterator[DelayProxy]:
    """A proxy to ``target_host:target_port`` whose answers come ``delay`` seconds late
    (its ``address``: ``(host, port)``), stopped (every connection closed) on leaving."""
    proxy = DelayProxy(target_host, target_port, delay).start()
    try:
        yield proxy
    finally:
        proxy.stop()
