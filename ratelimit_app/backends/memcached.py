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
from collections.abc import Callable, Sequence
from typing import Any, cast

from pymemcache.client.base import PooledClient

from ratelimit_app.algorithms import gcra
from ratelimit_app.backends import base
from ratelimit_app.backends.base import (
    Backend,
    IdlePool,
    MeterOp,
    MeterReply,
    Op,
    Server,
    cache_settings,
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


class _Node(Server):
    """One memcached server: a pymemcache client on its idle connections, and whether it is
    marked down."""

    __slots__ = ("client",)

    def __init__(self, server: str, options: dict[str, Any]) -> None:
        super().__init__(server)
        self.client = PooledClient(_address(server), **options)
        self.client.client_pool = IdlePool(self.client._create_client, options["max_pool_size"])


class MemcachedBackend(Backend):
    inline_ok = True
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

    def _by_node(self, namespaces: Sequence[str], run: Callable[[_Node, list[int]], None]) -> None:
        """``run(node, indexes)`` for the subjects (``namespaces[i]``) of each node.

        A node that fails is marked down; the next choice is another node, which takes over
        its subjects at once (their earlier counts stay behind on the dead node). A failure
        that is not the node's (a lost write, a corrupt value) is raised as it is.
        """
        if len(self.nodes) == 1:  # the common case: no placement, nothing to fail over to
            if namespaces:
                run(self._node(""), list(range(len(namespaces))))
            return
        pending = list(range(len(namespaces)))
        for attempt in range(len(self.nodes)):
            by_node: dict[_Node, list[int]] = {}
            for i in pending:
                by_node.setdefault(self._node(namespaces[i]), []).append(i)
            failed: list[int] = []
            for node, indexes in by_node.items():
                try:
                    run(node, indexes)
                except BackendError:
                    if attempt == len(self.nodes) - 1 or node.alive(time.monotonic()):
                        raise
                    failed += indexes
            if not failed:
                return
            pending = failed

    def _call(self, node: _Node, command: bytes, end: bytes, count: int = 1) -> bytes:
        """Send ``command`` on a pooled connection and read the reply up to ``end``."""
        reply: bytes = self._on(node, _exchange, command, end, count)  # no cast(): a call
        return reply

    def _meta(self, node: _Node, command: bytes, count: int) -> list[tuple[bytes, bytes]]:
        """Send ``count`` meta commands on a pooled connection; their (head, value) replies."""
        return cast(list[tuple[bytes, bytes]], self._on(node, _meta_exchange, command, count))

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

    # -- sliding windows ----------------------------------------------------------------------

    def execute(self, ops: Sequence[Op | MeterOp], now_us: int) -> list[Any]:
        # The common case first: sliding windows on one node, straight to the node.
        if len(self.nodes) != 1 or not ops:
            return super().execute(ops, now_us)
        for op in ops:
            if type(op) is not Op:
                return super().execute(ops, now_us)
        return self._run_node(self._node(""), ops)  # type: ignore[arg-type]

    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        if len(self.nodes) == 1:  # the common case: one node, no placement
            return self._run_node(self._node(""), ops) if ops else []
        results: list[list[int] | None] = [None] * len(ops)

        def run(node: _Node, indexes: list[int]) -> None:
            for i, values in zip(
                indexes, self._run_node(node, [ops[i] for i in indexes]), strict=True
            ):
                results[i] = values

        self._by_node([op.namespace for op in ops], run)
        return results  # type: ignore[return-value]

    def _run_node(self, node: _Node, ops: Sequence[Op]) -> list[list[int]]:
        """Every op of one node in one write and one reply
        (:func:`~.memcached_protocol.shape`: the command of the ops' shape, kept, with
        their namespaces filled in; nothing is kept per subject)."""
        key = tuple(map(_SHAPE, ops))
        command = self._shapes.get(key, _NO_SHAPE)
        if command is _NO_SHAPE:
            command = shape(self.key_prefix, ops, self.encoded)
            if len(self._shapes) >= SHAPE_MEMO:
                self._shapes.clear()
            self._shapes[key] = command
        if command is None:  # an expiry read as a time: made for this check
            command = check_command(self.key_prefix, ops, self.encoded)
            sent = command.command
        else:
            sent = command.sending(list(map(_NAMESPACE, ops)))
        reply: bytes = self._on(node, _exchange, sent, MN)
        try:
            return command.parse(reply)
        except ReplyError as exc:  # the data of these subjects, not the node: not marked down
            raise self._failed(exc, None) from exc

    # -- leaky buckets ------------------------------------------------------------------------

    def meter_many(self, ops: Sequence[MeterOp], now_us: int) -> list[MeterReply]:
        replies: list[MeterReply] = [MeterReply(None)] * len(ops)
        self._by_node(
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
    ) -> None:
        taking = [i for i in indexes if ops[i].take_back is not None]
        if taking:
            self._take_back(node, [ops[i] for i in taking], now_us)
        metering = [i for i in indexes if ops[i].take_back is None]
        if metering:
            self._meter(node, ops, metering, now_us, replies)

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
    ) -> None:
        """Read, decide and compare-and-set the ops ``pending`` of one node, in rounds: an
        op whose store lost the race (another request stored first) reads and decides again.
        """
        for _ in range(CAS_ATTEMPTS):
            stores, command = self._decide(node, ops, pending, now_us, replies)
            if not stores:
                return
            pending = self._store_all(node, stores, command, replies)
            if not pending:
                return
        # Still losing the race: refused (replies[i] stored nothing), never admitted on a guess.

    def _decide(
        self,
        node: _Node,
        ops: Sequence[MeterOp],
        pending: list[int],
        now_us: int,
        replies: list[MeterReply],
    ) -> tuple[list[tuple[int, int]], list[bytes]]:
        """Read the TATs of the ops ``pending`` with their CAS ids, and note what each read
        in ``replies``; return (op, new TAT) of each op admitted, and its ``ms``."""
        reads = self._meta(node, meta_gets(self._key(ops[i]) for i in pending), len(pending))
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
        node: _Node,
        stores: list[tuple[int, int]],
        command: list[bytes],
        replies: list[MeterReply],
    ) -> list[int]:
        """Send the ``ms`` of ``stores``; note in ``replies`` the TATs that landed, and
        return the ops whose store lost the race."""
        lost = []
        answered = self._meta(node, b"".join(command), len(stores))
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

    def _take_back(self, node: _Node, ops: Sequence[MeterOp], now_us: int) -> None:
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
        self._meta(node, b"".join(command), len(command))

    # -- the rest of the contract -------------------------------------------------------------

    def close(self) -> None:
        for node in self.nodes:
            node.client.close()

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        node = self._node(namespace)
        base = (self.key_prefix + namespace).encode()
        self._call(node, quiet_deletes(base, suffixes), MN)
