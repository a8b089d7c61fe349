"""memcached through pymemcache clients: one pipelined round trip a check.

What the round trips say is :mod:`.memcached_protocol`'s: a check is one write of every
subject's increments and a quiet read of each other bucket, a leaky bucket is compare-and-set
with the meta commands. This module holds the servers: the nodes and their idle connections
(:class:`~.base.IdlePool`), which node a subject lives on, and what happens when one fails.

All buckets of one subject live on one node (rendezvous hashing on the subject), so a check
stays one round trip with several servers. A node that fails is marked down for
``base.DEAD_RETRY`` seconds (:class:`~.base.Server`) and its subjects move to the
others meanwhile: availability over accuracy, since the counts they had stay behind on the
dead node. Sockets set TCP_NODELAY and :data:`~.base.SOCKET_TIMEOUT`.

Leaky buckets (:mod:`ratelimit_app.algorithms.gcra`): one round trip reads every TAT of the
request with
its CAS id, a second stores each admitted request's new TAT only if the item is unchanged
(or, for a subject with no TAT yet, only if there is still none). A request whose store lost
the race reads and decides again, up to :data:`CAS_ATTEMPTS` times; after that it is refused
(never admitted on a guess).
"""

from __future__ import annotations

import hashlib
import operator
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from pymemcache.client.base import PooledClient

from ratelimit_app.algorithms import gcra
from ratelimit_app.backends import aio, base
from ratelimit_app.backends.base import (
    Backend,
    IdlePool,
    MeterOp,
    MeterReply,
    Op,
    Server,
    adrive,
    cache_settings,
    drive,
)
from ratelimit_app.backends.memcached_protocol import (
    MN,
    CheckCommand,
    MemcachedEncoded,
    ReplyError,
    cas_of,
    check_command,
    found_value,
    meta_delete,
    meta_gets,
    meta_set,
    parse_meta,
    quiet_deletes,
    shape,
    stored,
)
from ratelimit_app.exceptions import BackendError

#: Read-decide-store rounds of a leaky-bucket check before it is refused.
CAS_ATTEMPTS = 8
#: Check commands a backend keeps, one per shape (the plans, counts and amounts of a
#: request's ops: bounded by the configuration, not by the subjects); it starts over when full.
SHAPE_MEMO = 256
#: Reads the namespace of an op, in C.
_NAMESPACE = operator.itemgetter(0)
#: Reads what an op is but its namespace (its shape's part), in C.
_SHAPE = operator.itemgetter(slice(1, None))
_NO_SHAPE: Any = object()


def _servers(location: Any) -> list[str]:
    if isinstance(location, str):
        return [s.strip() for s in location.replace(";", ",").split(",") if s.strip()]
    return list(location)


def _address(server: str) -> Any:
    if server.startswith("unix:"):
        return server[5:]
    host, _, port = server.rpartition(":")
    return (host.strip("[]") or "127.0.0.1", int(port or 11211))


def _exchange(client: Any, command: bytes, end: bytes, count: int = 1) -> bytes:
    """One round trip on a pymemcache connection, for replies of any length.

    pymemcache's ``raw_command`` keeps only the last socket read of a reply (4 KiB), which
    cuts the reads of a busy subject, so the limiter reads on the client's socket itself.
    The reply is complete when it ends with ``end`` and holds ``count`` of them. A failure
    propagates, and the pool then drops the connection.
    """
    if client.sock is None:
        client.version()  # connects, with the client's timeouts and TCP_NODELAY
    sock = client.sock
    sock.sendall(command + b"\r\n")
    reply = sock.recv(65536)
    while not reply.endswith(end) or (count > 1 and reply.count(end) < count):
        chunk = sock.recv(65536)
        if not chunk:
            raise BackendError("memcached closed the connection mid-reply")
        reply += chunk
    return reply


def _meta_exchange(client: Any, command: bytes, count: int) -> list[tuple[bytes, bytes]]:
    """Send ``count`` meta commands followed by ``mn``; return each reply's (head, value)
    (:func:`~.memcached_protocol.parse_meta`)."""
    if client.sock is None:
        client.version()  # connects, with the client's timeouts and TCP_NODELAY
    sock = client.sock
    sock.sendall(command + b"mn\r\n")
    buf = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise BackendError("memcached closed the connection mid-reply")
        buf += chunk
        replies = parse_meta(buf, count)
        if replies is not None:
            return replies


async def _aexchange(sock: Any, command: bytes, end: bytes, count: int = 1) -> bytes:
    """:func:`_exchange` through the running event loop (:func:`.aio.exchange`)."""
    reply = b""

    def read(chunk: bytes) -> bytes | None:
        nonlocal reply
        if not chunk:
            raise BackendError("memcached closed the connection mid-reply")
        reply += chunk
        if reply.endswith(end) and (count == 1 or reply.count(end) >= count):
            return reply
        return None

    found: bytes = await aio.exchange(sock, command + b"\r\n", read)
    return found


async def _ameta_exchange(sock: Any, command: bytes, count: int) -> list[tuple[bytes, bytes]]:
    """:func:`_meta_exchange` through the running event loop (:func:`.aio.exchange`)."""
    buf = b""

    def read(chunk: bytes) -> list[tuple[bytes, bytes]] | None:
        nonlocal buf
        if not chunk:
            raise BackendError("memcached closed the connection mid-reply")
        buf += chunk
        return parse_meta(buf, count)

    found: list[tuple[bytes, bytes]] = await aio.exchange(sock, command + b"mn\r\n", read)
    return found


class _Ask(NamedTuple):
    """One exchange with a node that the backend's logic asks for (:meth:`MemcachedBackend.
    _executing`): ``command`` and, for a check, the ``end`` of its reply; for meta commands
    (``end`` None), ``count`` replies parsed."""

    node: _Node
    command: bytes
    end: bytes | None
    replies: int = 1


#: What the backend's logic is written as: a generator of exchanges, sent each reply.
Asking = Generator[_Ask, Any, Any]


class _Node(Server):
    """One memcached server: a pymemcache client on its idle connections, and whether it is
    marked down."""

    __slots__ = ("client",)

    def __init__(self, server: str, options: dict[str, Any]) -> None:
        super().__init__(server)
        self.client = PooledClient(_address(server), **options)
        self.client.client_pool = IdlePool(self.client._create_client, options["max_pool_size"])


class MemcachedBackend(Backend):
    inline_ok = False  # (I/O: aexecute awaits it on asyncio streams)
    encoding = MemcachedEncoded

    def __init__(self, alias: str, cache: Any) -> None:
        super().__init__(alias, cache)
        location, options = cache_settings(alias)
        timeout = base.SOCKET_TIMEOUT
        client_options = {
            "connect_timeout": timeout,
            "timeout": timeout,
            "no_delay": True,
            "max_pool_size": int(options.get("max_pool_size", 64)),
            "allow_unicode_keys": False,
        }
        self.nodes = [_Node(s, client_options) for s in _servers(location)]
        if not self.nodes:
            raise BackendError(f"{alias}: no memcached server in LOCATION")
        #: The check commands of recent shapes, by the ops but for their namespaces (a plan
        #: is hashed by identity); None for a shape made per check.
        self._shapes: dict[tuple[Any, ...], CheckCommand | None] = {}

    @property
    def servers(self) -> Sequence[Server]:
        return self.nodes

    # -- nodes: placement and failover --------------------------------------------------------

    def _node(self, namespace: str) -> _Node:
        """The node of the subject ``namespace``: of the nodes not marked down, the one
        that hashes highest with it. Raises BackendError when none is left."""
        if len(self.nodes) == 1:
            node = self.nodes[0]
            if node.dead_until:  # (every check comes here: no call while it is up)
                self._check_alive(node)
            return node
        now = time.monotonic()
        alive = [n for n in self.nodes if n.alive(now)]
        if not alive:
            raise BackendError(f"{self.alias}: every memcached server is marked down")
        return max(alive, key=lambda n: hashlib.blake2b(f"{n.name}|{namespace}".encode()).digest())

    def _by_node(
        self, namespaces: Sequence[str], run: Callable[[_Node, list[int]], Asking]
    ) -> Asking:
        """``run(node, indexes)`` (exchanges it asks for) for the subjects
        (``namespaces[i]``) of each node.

        A node that fails is marked down; the next choice is another node, which takes over
        its subjects at once (their earlier counts stay behind on the dead node). A failure
        that is not the node's (a lost write, a corrupt value) is raised as it is.
        """
        if len(self.nodes) == 1:  # the common case: no placement, nothing to fail over to
            if namespaces:
                yield from run(self._node(""), list(range(len(namespaces))))
            return
        pending = list(range(len(namespaces)))
        for attempt in range(len(self.nodes)):
            by_node: dict[_Node, list[int]] = {}
            for i in pending:
                by_node.setdefault(self._node(namespaces[i]), []).append(i)
            failed: list[int] = []
            for node, indexes in by_node.items():
                try:
                    yield from run(node, indexes)
                except BackendError:
                    if attempt == len(self.nodes) - 1 or node.alive(time.monotonic()):
                        raise
                    failed += indexes
            if not failed:
                return
            pending = failed

    # -- the exchanges: the logic asks (_Ask), a driver sends on a sync or asyncio connection

    def _drive(self, asking: Asking) -> Any:
        """Run ``asking`` on this thread: each exchange on a pooled connection."""
        return drive(asking, self._ask)

    def _ask(self, ask: _Ask) -> Any:
        if ask.end is None:
            return self._meta(ask.node, ask.command, ask.replies)
        return self._on(ask.node, _exchange, ask.command, ask.end, ask.replies)

    def _call(self, node: _Node, command: bytes, end: bytes, count: int = 1) -> bytes:
        """Send ``command`` on a pooled connection and read the reply up to ``end``."""
        reply: bytes = self._on(node, _exchange, command, end, count)  # no cast(): a call
        return reply

    def _meta(self, node: _Node, command: bytes, count: int) -> list[tuple[bytes, bytes]]:
        """Send ``count`` meta commands on a pooled connection; their (head, value) replies."""
        reply: list[tuple[bytes, bytes]] = self._on(node, _meta_exchange, command, count)
        return reply

    def _on(self, node: _Node, exchange: Callable[..., Any], *args: Any) -> Any:
        """``exchange(client, *args)`` on a pooled connection of ``node``; a failure marks
        the node down (and the pool drops the connection)."""
        # get_and_release(destroy_on_fail=True), without a generator-based context manager
        # on every request.
        pool: IdlePool = node.client.client_pool
        idle = pool.idle
        try:
            try:  # pool.get(), without its call
                client = idle.pop()
            except IndexError:
                client = pool.create()
            try:
                reply = exchange(client, *args)
            except Exception:
                client.close()
                raise
            if len(idle) < pool.max_idle:  # pool.release(client), without its call
                idle.append(client)
            else:
                client.close()
            return reply
        except Exception as exc:
            raise self._failed(exc, node) from exc

    async def _aon(self, ask: _Ask) -> Any:
        """``ask`` on a pooled connection of its node, through the running event loop
        (:mod:`.aio`: the sync path's connections); a failure marks the node down, and the
        connection is dropped then and on a cancellation."""
        pool: IdlePool = ask.node.client.client_pool
        try:
            client = pool.get()
            try:
                if client.sock is None:  # connects, in a thread (a name may be resolved)
                    await sync_to_async(client.version, thread_sensitive=False)()
                reply: Any
                if ask.end is None:
                    reply = await _ameta_exchange(client.sock, ask.command, ask.replies)
                else:
                    reply = await _aexchange(client.sock, ask.command, ask.end, ask.replies)
            except BaseException:
                client.close()
                raise
            pool.release(client)
        except Exception as exc:  # (TimeoutError and OSError among them)
            raise self._failed(exc, ask.node) from exc
        return reply

    # -- sliding windows ----------------------------------------------------------------------

    def execute(self, ops: Sequence[Op | MeterOp], now_us: int) -> list[Any]:
        # The common case first: sliding windows on one node, straight to the node.
        if len(self.nodes) != 1 or not ops:
            return super().execute(ops, now_us)
        for op in ops:
            if type(op) is not Op:
                return super().execute(ops, now_us)
        node = self._node("")
        sent, command = self._command(ops)  # type: ignore[arg-type]
        return self._parsed(command, self._on(node, _exchange, sent, MN))

    async def aexecute(self, ops: Sequence[Op | MeterOp], now_us: int) -> list[Any]:
        """:meth:`execute` on the running event loop's asyncio streams: the same commands,
        replies and failover (the logic is one generator, :meth:`_executing`)."""
        if len(self.nodes) != 1 or not ops:
            return await self._aexecuting(ops, now_us)
        for op in ops:
            if type(op) is not Op:
                return await self._aexecuting(ops, now_us)
        node = self._node("")  # (the common case, as execute's: straight to the node)
        sent, command = self._command(ops)  # type: ignore[arg-type]
        return self._parsed(command, await self._aon(_Ask(node, sent, MN)))

    async def _aexecuting(self, ops: Sequence[Op | MeterOp], now_us: int) -> list[Any]:
        result: list[Any] = await adrive(self._executing(ops, now_us), self._aon)
        return result

    def _executing(self, ops: Sequence[Op | MeterOp], now_us: int) -> Asking:
        """The exchanges of :meth:`execute` (a window op's values, a meter op's reply)."""
        windowed = [op for op in ops if type(op) is Op]
        metered = [op for op in ops if type(op) is MeterOp]
        if len(windowed) + len(metered) != len(ops):
            raise TypeError(f"not an operation of this backend: {ops!r}")
        values = (yield from self._running(windowed)) if windowed else []
        replies = (yield from self._metering(metered, now_us)) if metered else []
        if not metered:
            return values
        w, m = iter(values), iter(replies)
        return [next(w) if type(op) is Op else next(m) for op in ops]

    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        if len(self.nodes) == 1:  # the common case: one node, no placement
            if not ops:
                return []
            sent, command = self._command(ops)
            return self._parsed(command, self._on(self._node(""), _exchange, sent, MN))
        result: list[list[int]] = self._drive(self._running(ops))
        return result

    def _running(self, ops: Sequence[Op]) -> Asking:
        """:meth:`run_many`'s exchanges: each node's ops in one."""
        results: list[list[int] | None] = [None] * len(ops)

        def run(node: _Node, indexes: list[int]) -> Asking:
            sent, command = self._command([ops[i] for i in indexes])
            values = self._parsed(command, (yield _Ask(node, sent, MN)))
            for i, v in zip(indexes, values):
                results[i] = v

        yield from self._by_node([op.namespace for op in ops], run)
        return results

    def _command(self, ops: Sequence[Op]) -> tuple[bytes, CheckCommand]:
        """Every op of one node in one write
        (:func:`~.memcached_protocol.shape`: the command of the ops' shape, kept, with
        their namespaces filled in; nothing is kept per subject), and what parses its reply."""
        key = tuple(map(_SHAPE, ops))
        command = self._shapes.get(key, _NO_SHAPE)
        if command is _NO_SHAPE:
            command = shape(self.key_prefix, ops, self.encoded)
            if len(self._shapes) >= SHAPE_MEMO:
                self._shapes.clear()
            self._shapes[key] = command
        if command is None:  # an expiry read as a time: made for this check
            command = check_command(self.key_prefix, ops, self.encoded)
            return command.command, command
        return command.sending(list(map(_NAMESPACE, ops))), command

    def _parsed(self, command: CheckCommand, reply: bytes) -> list[list[int]]:
        """Each op's values from the reply to ``command``."""
        try:
            return command.parse(reply)
        except ReplyError as exc:  # the data of these subjects, not the node: not marked down
            raise self._failed(exc, None) from exc

    # -- leaky buckets ------------------------------------------------------------------------

    def meter_many(self, ops: Sequence[MeterOp], now_us: int) -> list[MeterReply]:
        result: list[MeterReply] = self._drive(self._metering(ops, now_us))
        return result

    def _metering(self, ops: Sequence[MeterOp], now_us: int) -> Asking:
        """:meth:`meter_many`'s exchanges."""
        replies: list[MeterReply] = [MeterReply(None)] * len(ops)
        yield from self._by_node(
            [op.namespace for op in ops],
            lambda node, indexes: self._meter_node(node, ops, indexes, now_us, replies),
        )
        return replies

    def _meter_node(
        self,
        node: _Node,
        ops: Sequence[MeterOp],
        indexes: list[int],
        now_us: int,
        replies: list[MeterReply],
    ) -> Asking:
        taking = [i for i in indexes if ops[i].take_back is not None]
        if taking:
            yield from self._take_back(node, [ops[i] for i in taking], now_us)
        metering = [i for i in indexes if ops[i].take_back is None]
        if metering:
            yield from self._meter(node, ops, metering, now_us, replies)

    def _key(self, op: MeterOp) -> bytes:
        return (self.key_prefix + op.namespace + gcra.SUFFIX).encode()

    def _store(self, op: MeterOp, tat: int, now_us: int, cas: int | None) -> bytes:
        """``ms`` of a TAT: only over the item with CAS id ``cas`` (None: only if absent)."""
        ttl = gcra.ttl_seconds(op.meter, tat, now_us)
        return meta_set(self._key(op), gcra.encode(op.meter, tat), ttl, cas)

    def _meter(
        self,
        node: _Node,
        ops: Sequence[MeterOp],
        pending: list[int],
        now_us: int,
        replies: list[MeterReply],
    ) -> Asking:
        """Read, decide and compare-and-set the ops ``pending`` of one node, in rounds: an
        op whose store lost the race (another request stored first) reads and decides again.
        """
        for _ in range(CAS_ATTEMPTS):
            reads = yield _Ask(
                node, meta_gets(self._key(ops[i]) for i in pending), None, len(pending)
            )
            stores, command = self._decide(ops, pending, reads, now_us, replies)
            if not stores:
                return
            answered = yield _Ask(node, b"".join(command), None, len(stores))
            pending = self._store_all(stores, answered, replies)
            if not pending:
                return
        # Still losing the race: refused (replies[i] stored nothing), never admitted on a guess.

    def _decide(
        self,
        ops: Sequence[MeterOp],
        pending: list[int],
        reads: list[tuple[bytes, bytes]],
        now_us: int,
        replies: list[MeterReply],
    ) -> tuple[list[tuple[int, int]], list[bytes]]:
        """From the TATs ``reads`` of the ops ``pending`` with their CAS ids, note what each
        read in ``replies``; return (op, new TAT) of each op admitted, and its ``ms``."""
        stores: list[tuple[int, int]] = []
        command = []
        for i, (head, value) in zip(pending, reads, strict=True):
            op = ops[i]
            try:
                read = gcra.decode(op.meter, found_value(head, value))
            except (ReplyError, ValueError) as exc:  # ValueError: a TAT that is not one
                raise self._failed(exc, None) from exc
            replies[i] = MeterReply(read)
            written = self._meter_decision(op, read, now_us)
            if written is not None:
                stores.append((i, written))
                cas = cas_of(head) if read is not None else None
                command.append(self._store(op, written, now_us, cas))
        return stores, command

    def _store_all(
        self,
        stores: list[tuple[int, int]],
        answered: list[tuple[bytes, bytes]],
        replies: list[MeterReply],
    ) -> list[int]:
        """From the answers to the ``ms`` of ``stores``, note in ``replies`` the TATs that
        landed, and return the ops whose store lost the race."""
        lost = []
        for (i, written), (head, _) in zip(stores, answered, strict=True):
            try:
                landed = stored(head)
            except ReplyError as exc:
                raise self._failed(exc, None) from exc
            if landed:
                replies[i] = MeterReply(replies[i].read, written, cas_of(head))
            else:
                lost.append(i)
        return lost

    def _take_back(self, node: _Node, ops: Sequence[MeterOp], now_us: int) -> Asking:
        """Take back admitted requests whose TAT nobody has changed since (by CAS id)."""
        command = []
        for op in ops:
            taken = op.take_back
            assert taken is not None
            assert taken.written is not None
            assert taken.token is not None
            restored = gcra.take_back(op.meter, taken.written, op.cost)
            if restored > op.meter.ticks(now_us):
                command.append(self._store(op, restored, now_us, taken.token))
            else:  # the bucket would be empty: forget it
                command.append(meta_delete(self._key(op), taken.token))
        # EX or NF: another request moved the TAT meanwhile; it stays counted (safe side).
        yield _Ask(node, b"".join(command), None, len(command))

    # -- the rest of the contract -------------------------------------------------------------

    def close(self) -> None:
        for node in self.nodes:
            node.client.close()

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        node = self._node(namespace)
        base = (self.key_prefix + namespace).encode()
        self._call(node, quiet_deletes(base, suffixes), MN)
