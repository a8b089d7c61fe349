"""memcached through pymemcache: one pipelined round trip a check.

The checks of one request (its rules) go to a node in one write: a meta-arithmetic command
per bucket to increment (``ma <key> N<ttl> J1 v``: create with TTL on a miss, return the new
value), for every subject, then ONE ``get`` of every bucket their windows read. memcached
answers commands of one connection in order, so the read sees these hits, and it sends what
it has at the end of each get, so one get is one reply to wait for (a get per subject came
back in 1.6 pieces on average). The ``VA`` replies prove each write landed: a read that
finds nothing after a failed write is an error, never a zero.

All buckets of one subject live on one node (rendezvous hashing on the subject), so a check
stays one round trip with several servers; a node that fails is skipped for
``RATELIMIT_DEAD_RETRY`` seconds and its subjects move to the others (availability over
accuracy, as the seeds suggest). Sockets set TCP_NODELAY and ``RATELIMIT_SOCKET_TIMEOUT``.

Leaky buckets (:mod:`ratelimit_app.gcra`) are compare-and-set: one round trip reads every
TAT of the request with its CAS id (``mg <key> v c``), a second stores each admitted
request's new TAT only if the item is unchanged (``ms <key> C<cas>``, or ``ME``, add, for a
subject with no TAT yet). A request whose store lost the race reads and decides again, up to
:data:`CAS_ATTEMPTS` times; after that it is refused (never admitted on a guess).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, cast

from pymemcache.client.base import PooledClient

from ratelimit_app import gcra
from ratelimit_app.backends.base import (
    MEMCACHED_MAX_RELATIVE_TTL,
    Backend,
    Encoded,
    MeterOp,
    MeterReply,
    Op,
    cache_settings,
)
from ratelimit_app.conf import conf
from ratelimit_app.exceptions import BackendError
from ratelimit_app.windows import Plan


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
    cuts the multi-get of a busy subject, so the limiter reads on the client's socket itself.
    The reply is complete when it ends with ``end`` and holds ``count`` of them (one per
    subject of a pipelined check). A failure propagates, and the pool then drops the
    connection.
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


#: Read-decide-store rounds of a leaky-bucket check before it is refused.
CAS_ATTEMPTS = 8
#: Meta replies that end a reply line without a value (all but ``VA``).
_META_FLAGS = re.compile(rb" c(\d+)")


def _meta_exchange(client: Any, command: bytes, count: int) -> list[tuple[bytes, bytes]]:
    """Send ``count`` meta commands followed by ``mn``; return each reply's (head, value).

    Read by length, not by searching for an end marker, so a stored value can never cut a
    reply short. A reply line that is not a meta reply (``CLIENT_ERROR``...) raises.
    """
    if client.sock is None:
        client.version()  # connects, with the client's timeouts and TCP_NODELAY
    sock = client.sock
    sock.sendall(command + b"mn\r\n")
    buf, pos = b"", 0
    replies: list[tuple[bytes, bytes]] = []
    while True:
        end = buf.find(b"\r\n", pos)
        if end < 0:
            chunk = sock.recv(65536)
            if not chunk:
                raise BackendError("memcached closed the connection mid-reply")
            buf += chunk
            continue
        head = buf[pos:end]
        if head == b"MN" and len(replies) == count:
            return replies
        if head.startswith(b"VA "):
            size = int(head.split(b" ", 2)[1])
            while len(buf) < end + 2 + size + 2:
                chunk = sock.recv(65536)
                if not chunk:
                    raise BackendError("memcached closed the connection mid-reply")
                buf += chunk
            replies.append((head, buf[end + 2 : end + 2 + size]))
            pos = end + 2 + size + 2
        elif head[:2] in (b"HD", b"EN", b"NS", b"EX", b"NF") and len(replies) < count:
            replies.append((head, b""))
            pos = end + 2
        else:
            raise BackendError(f"unexpected memcached reply {head[:80]!r}")


def _cas(head: bytes) -> int | None:
    found = _META_FLAGS.search(head)
    return int(found[1]) if found else None


# A hit of the multi-get as (key, count): the key as sent, prefixes included. A count may
# end in spaces: memcached keeps a value's length when a decrement drops a digit, so "10"
# taken back is stored as "9 " and "100" as "99 " (an increment that needs the digit again
# stores "10"). Only the ``ma`` reply carries the bare number; ``get`` returns the padding.
_VALUE = re.compile(rb"VALUE (\S+) \d+ \d+\r\n(\d+) *\r\n")
#: What a quiet decrement answers: a miss (the bucket expired or was reset meanwhile).
_QUIET_MISS = b"NF"
#: The bytes a count's data line may hold: digits and the padding of a decrement.
_COUNT_BYTES = b"0123456789 "


class _Encoded(Encoded):
    """A plan's byte form, plus the tails of its ``ma`` increments (``<suffix> N<ttl> J1 v``)
    when every TTL is relative (30 days or less), so a request only prepends its key."""

    __slots__ = ("write_tails",)

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.write_tails: list[bytes] | None = [
            b"%s N%d J1 v\r\n" % (suffix, ttl) for suffix, ttl in self.writes
        ]
        if any(ttl > MEMCACHED_MAX_RELATIVE_TTL for _, ttl in self.writes):
            self.write_tails = None


class _Node:
    def __init__(self, server: str, options: dict[str, Any]) -> None:
        self.name = server
        self.client = PooledClient(_address(server), **options)
        self.dead_until = 0.0


class MemcachedBackend(Backend):
    inline_ok = True
    encoding = _Encoded

    def __init__(self, alias: str, cache: Any) -> None:
        super().__init__(alias, cache)
        location, options = cache_settings(alias)
        timeout = conf.SOCKET_TIMEOUT
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

    def _node(self, namespace: str) -> _Node:
        now = time.monotonic()
        if len(self.nodes) == 1:
            node = self.nodes[0]
            if node.dead_until > now:
                raise BackendError(f"{self.alias}: {node.name} marked down, retrying later")
            return node
        alive = [n for n in self.nodes if n.dead_until <= now]
        if not alive:
            raise BackendError(f"{self.alias}: every memcached server is marked down")
        return max(alive, key=lambda n: hashlib.blake2b(f"{n.name}|{namespace}".encode()).digest())

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
        # pymemcache's get_and_release(destroy_on_fail=True), without a generator-based
        # context manager on every request.
        pool = node.client.client_pool
        try:
            client = pool.get()
            try:
                reply = exchange(client, *args)
            except Exception:
                pool.destroy(client)
                raise
            pool.release(client)
            return reply
        except Exception as exc:
            node.dead_until = time.monotonic() + conf.DEAD_RETRY
            raise self._failed(exc) from exc

    def _writes(self, op: Op, enc: _Encoded, base: bytes) -> bytes:
        """One op's writes: quiet decrements (only a miss or an error answers), then
        increments that answer with the new value."""
        command = b"" if op.undo is None else self._decrements(base, op.undo)
        if op.increment and enc.writes:
            tails = enc.write_tails
            if tails is None:  # a TTL memcached reads as a timestamp: made per request
                wall = int(time.time())
                tails = [
                    b"%s N%d J1 v\r\n" % (s, t + wall if t > MEMCACHED_MAX_RELATIVE_TTL else t)
                    for s, t in enc.writes
                ]
            head = b"ma " + base
            command += head + head.join(tails)
        return command

    def _parse(
        self, ops: Sequence[Op], encs: Sequence[_Encoded], bases: Sequence[bytes], reply: bytes
    ) -> list[list[int]]:
        """Every op's values from the reply to :meth:`run_many`'s command (``bases``: each
        op's key prefix, its buckets' keys without their suffixes).

        The reply: the misses of the quiet decrements (``NF``), a ``VA <length>`` line and
        the new value for each increment, in the order sent, then ``VALUE <key> <flags>
        <length>`` and the count of each bucket found (with trailing spaces after a
        decrement that dropped a digit: ``9 ``), and ``END``. A busy subject's reply
        holds hundreds of buckets: they are mapped onto the plans in C, no Python loop.
        """
        start = reply.find(b"VALUE ")
        if start < 0:
            start = len(reply) - 5  # END
        lines = reply[:start].split(b"\r\n")
        if _QUIET_MISS in lines:
            # A miss answers a take-back where it stands among the replies (after an
            # earlier op's increments when one round trip holds both); a value line is a
            # number, never "NF".
            lines = [line for line in lines if line != _QUIET_MISS]
        heads, written = lines[0:-1:2], lines[1:-1:2]
        counted: list[int] = []  # increments per op
        sizes: list[int] = []  # buckets read per op
        for op, enc in zip(ops, encs, strict=True):
            counted.append(len(enc.writes) if op.increment else 0)
            sizes.append(len(enc.reads))
        if (
            len(heads) != sum(counted)
            or len(written) != len(heads)
            or not all(map(bytes.startswith, heads, repeat(b"VA ")))
        ):
            raise self._failed(BackendError(f"lost counter writes: {reply[:200]!r}"))
        # memcached answers a multi-get's hits in the order asked: when every bucket is
        # there (a busy subject), the counts are the data lines in order, no key to match.
        parts = reply[start:-5].split(b"\r\n")
        flat: list[int] | None = None
        if len(parts) == 2 * sum(sizes) + 1 and all(
            map(bytes.startswith, parts[0:-1:2], repeat(b"VALUE "))
        ):
            data = parts[1::2]
            # int() takes the padding of a decrement ("9 "; it strips whitespace), and also
            # a sign or an underscore: a value with anything but digits and spaces is no
            # count, here as in the sparse path below (one pass in C, not a loop).
            try:
                if b"".join(data).translate(None, _COUNT_BYTES):
                    raise ValueError
                flat = list(map(int, data))
            except ValueError:
                raise self._failed(BackendError(f"corrupt counter: {reply[:200]!r}")) from None
            hits: list[tuple[bytes, bytes]] = []
        else:
            hits = _VALUE.findall(reply, start)
            if len(hits) != reply.count(b"VALUE ", start):  # a value that is not a count
                raise self._failed(BackendError(f"corrupt counter: {reply[:200]!r}"))
        out: list[list[int]] = []
        at = pos = 0
        for enc, base, n, size in zip(encs, bases, counted, sizes, strict=True):
            if flat is not None:
                values = flat[pos : pos + size]
                pos += size
            else:
                # A young or quiet subject's reply is mostly misses: only the hits are
                # looked up and converted, the misses stay 0.
                values = [0] * size
                index, cut = enc.index, len(base)
                for key, count in hits:
                    if key.startswith(base):
                        i = index.get(key[cut:])
                        if i is not None:
                            values[i] = int(count)
            if n:
                enc.merge(values, written[at : at + n])
                at += n
            out.append(values)
        return out

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
        """Every op of one node in one write and one reply: all the writes first, then ONE
        multi-get of every op's buckets (memcached sends what it has at the end of each get:
        one get, one reply to wait for). memcached answers in order, so the read sees this
        request's increments."""
        prefix = self.cache_prefix + self.rl_prefix
        encs: list[_Encoded] = []
        bases: list[bytes] = []
        reads: list[bytes] = []
        writes: list[bytes] = []
        for op in ops:  # one pass: this runs on every request
            enc: _Encoded = self.encoded(op.plan)  # type: ignore[assignment]
            base = (prefix + op.namespace).encode()
            encs.append(enc)
            bases.append(base)
            reads.append(base + (b" " + base).join(enc.reads))
            writes.append(self._writes(op, enc, base))
        command = b"".join(writes) + b"get " + b" ".join(reads)
        return self._parse(ops, encs, bases, self._call(node, command, b"END\r\n"))

    def meter_many(self, ops: Sequence[MeterOp], now_us: int) -> list[MeterReply]:
        replies: list[MeterReply] = [MeterReply(None)] * len(ops)
        self._by_node(
            [op.namespace for op in ops],
            lambda node, indexes: self._meter_node(node, ops, indexes, now_us, replies),
        )
        return replies

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
                    if attempt == len(self.nodes) - 1 or node.dead_until <= time.monotonic():
                        raise
                    failed += indexes
            if not failed:
                return
            pending = failed

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
        return (self.cache_prefix + self.rl_prefix + op.namespace + gcra.SUFFIX).encode()

    def _store(self, op: MeterOp, tat: int, now_us: int, cas: int | None) -> bytes:
        """``ms`` of a TAT: only over the item with CAS id ``cas`` (None: only if absent)."""
        value = gcra.encode(op.meter, tat)
        ttl = gcra.ttl_seconds(op.meter, tat, now_us)
        if ttl > MEMCACHED_MAX_RELATIVE_TTL:
            ttl += int(time.time())
        mode = b"ME" if cas is None else b"C%d" % cas
        return b"ms %s %d T%d %s c\r\n%s\r\n" % (self._key(op), len(value), ttl, mode, value)

    def _meter(
        self,
        node: _Node,
        ops: Sequence[MeterOp],
        pending: list[int],
        now_us: int,
        replies: list[MeterReply],
    ) -> None:
        """Read, decide and compare-and-set the ops ``pending`` of one node, in rounds."""
        for _ in range(CAS_ATTEMPTS):
            reads = self._meta(
                node, b"".join(b"mg %s v c\r\n" % self._key(ops[i]) for i in pending), len(pending)
            )
            stores: list[tuple[int, int]] = []
            command = []
            for i, (head, value) in zip(pending, reads, strict=True):
                op = ops[i]
                if not head.startswith((b"VA", b"EN")):
                    raise self._failed(BackendError(f"unexpected reply {head[:80]!r}"))
                try:
                    read = gcra.decode(op.meter, value if head.startswith(b"VA") else None)
                except ValueError as exc:
                    raise self._failed(exc) from exc
                replies[i] = MeterReply(read)
                written = self._meter_decision(op, read, now_us)
                if written is not None:
                    stores.append((i, written))
                    cas = _cas(head) if head.startswith(b"VA") else None
                    command.append(self._store(op, written, now_us, cas))
            if not stores:
                return
            pending = []
            for (i, written), (head, _) in zip(
                stores, self._meta(node, b"".join(command), len(stores)), strict=True
            ):
                if head.startswith(b"HD"):
                    replies[i] = MeterReply(replies[i].read, written, _cas(head))
                elif head.startswith((b"NS", b"EX", b"NF")):  # lost the race: again
                    pending.append(i)
                else:
                    raise self._failed(BackendError(f"unexpected reply {head[:80]!r}"))
            if not pending:
                return
        # Still losing the race: refused (replies[i] stored nothing), never admitted on a guess.

    def _take_back(self, node: _Node, ops: Sequence[MeterOp], now_us: int) -> None:
        """Take back admitted requests whose TAT nobody has changed since (by CAS id)."""
        command = []
        for op in ops:
            taken = op.take_back
            assert taken is not None
            assert taken.written is not None
            assert taken.token is not None
            restored = gcra.take_back(op.meter, taken.written)
            if restored > op.meter.ticks(now_us):
                command.append(self._store(op, restored, now_us, taken.token))
            else:  # the bucket would be empty: forget it
                command.append(b"md %s C%d\r\n" % (self._key(op), taken.token))
        # EX or NF: another request moved the TAT meanwhile; it stays counted (safe side).
        self._meta(node, b"".join(command), len(command))

    def _decrements(self, base: bytes, plan: Plan) -> bytes:
        return b"".join(b"ma %s%s MD q\r\n" % (base, s) for s, _ in self.encoded(plan).writes)

    def close(self) -> None:
        for node in self.nodes:
            node.client.close()

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        node = self._node(namespace)
        base = (self.cache_prefix + self.rl_prefix + namespace).encode()
        command = b"".join(b"md %s%s q\r\n" % (base, s.encode()) for s in suffixes) + b"mn"
        self._call(node, command, b"MN\r\n")
