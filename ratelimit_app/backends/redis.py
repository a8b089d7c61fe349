"""Redis through django-redis: the checks of a request in one atomic round trip.

A check is one transaction of plain commands (``MULTI`` ... ``EXEC``: ``HINCRBY``,
``EXPIRE``, ``HMGET``...) whose replies hiredis parses off the socket
(:meth:`RedisBackend._transaction`); a check that also takes a refused hit back runs the Lua
script :data:`SCRIPT`, which increments the write buckets (setting their TTL on creation)
and reads every bucket of the window in one atomic call. Keys of one subject share a hash
tag (``{...}``), one Redis Cluster slot per subject: :class:`RedisClusterBackend` (redis-py's
cluster client; django-redis has none) runs one script call per slot. Connections come from
django-redis's connection factory with bounded socket timeouts. Bucket indexes come from the
client's clock (:func:`ratelimit_app.clock.now`), never the server's.

Leaky buckets (:mod:`ratelimit_app.gcra`) have a script of their own, :data:`METER_SCRIPT`:
every leaky-bucket rule of a request in one atomic call. A request with rules of both
algorithms sends both scripts in one pipelined round trip (each atomic on its own).

The scripts are Lua files beside this module (``lua/``, package data), read once at import;
each file's header comment says what it takes and answers.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from importlib import resources
from typing import Any, cast

from redis.crc import key_slot
from redis.exceptions import NoScriptError, ResponseError

from ratelimit_app import gcra, windows
from ratelimit_app.backends.base import (
    Backend,
    Encoded,
    MeterOp,
    MeterReply,
    Op,
    Server,
    cache_settings,
)
from ratelimit_app.conf import conf
from ratelimit_app.exceptions import BackendError
from ratelimit_app.windows import Plan

try:  # in the redis extra: parses replies in C
    import hiredis
except ImportError:  # pragma: no cover
    hiredis = None  # type: ignore[assignment]


def _lua(name: str) -> str:
    """The Lua source ``lua/<name>.lua`` shipped beside this module (package data); its
    header comment says what the script takes and answers."""
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


#: A Lua fragment, not a script: ``drop_stale(base, spec)``, the stale fields of a subject's
#: hashes dropped (lua/drop_stale.lua). Shared by :data:`SCRIPT` and :data:`TRIM_SCRIPT`.
DROP_STALE = _lua("drop_stale")
#: One check of one or more subjects (the rules of a request): take back, increment and
#: read every bucket, trimming stale fields, atomically (lua/window.lua).
SCRIPT = DROP_STALE + _lua("window")
#: Every leaky bucket of a request, atomically (lua/meter.lua); a stored TAT lives until
#: its bucket is empty plus :data:`ratelimit_app.gcra.TTL_MARGIN` seconds and a millisecond.
METER_SCRIPT = _lua("meter").replace(
    "local margin = MARGIN_MS", f"local margin = {gcra.TTL_MARGIN * 1000 + 1}"
)
#: Drops the stale fields of a subject's hashes, for the checks sent as a transaction (see
#: :meth:`RedisBackend._transaction`), which cannot decide on a reply inside the round trip
#: (lua/trim.lua).
TRIM_SCRIPT = DROP_STALE + _lua("trim")

#: A transaction's first and last commands.
MULTI = b"*1\r\n$5\r\nMULTI\r\n"
EXEC = b"*1\r\n$4\r\nEXEC\r\n"

#: A command's part: bytes as they are, or a key: ``(KEY, name)`` is the subject's key base
#: followed by ``name`` (see :func:`_template`).
KEY = object()
Part = bytes | tuple[object, bytes]


def _template(commands: Sequence[Sequence[Part]], base_len: int) -> list[bytes]:
    """``commands`` in the Redis protocol, cut where a subject's key base goes: the packed
    bytes for a base ``b`` of ``base_len`` bytes are ``b.join(parts)``. So a check packs its
    commands with one join, whatever their number."""
    parts: list[bytes] = []
    current = bytearray()
    for command in commands:
        current += b"*%d\r\n" % len(command)
        for part in command:
            if isinstance(part, tuple):
                name = part[1]
                current += b"$%d\r\n" % (base_len + len(name))
                parts.append(bytes(current))
                current = bytearray(name + b"\r\n")
            else:
                current += b"$%d\r\n%s\r\n" % (len(part), part)
    parts.append(bytes(current))
    return parts


def _meter_args(m: gcra.Meter) -> list[bytes]:
    """A meter's part of :data:`METER_SCRIPT`'s ARGV, less the mode and the take-back."""
    n = m.rate.count or 1  # a count of 0 never admits: the script only reads
    q, rem = divmod(m.interval, n)
    tau_a, tau_r = divmod(m.tau, n)
    return [b"%d" % m.rate.count, b"%d" % q, b"%d" % rem, b"%d" % tau_a, b"%d" % tau_r]


def _pack(command: list[bytes]) -> bytes:
    """A command in the Redis protocol (RESP): every part is bytes already, so this does
    less than redis-py's packers, which check and encode each part."""
    return b"*%d\r\n%s" % (
        len(command),
        b"".join([b"$%d\r\n%s\r\n" % (len(part), part) for part in command]),
    )


def _split(suffix: bytes) -> tuple[bytes, bytes] | None:
    """A uniform bucket's hash and field, else None (a key of its own):
    ``b":60/60:123"`` -> ``(b":60/60", b"123")``, ``b":60/60x10:12"`` -> ``(b":60/60", b"x12")``.
    """
    if suffix.startswith(b":h") or suffix == gcra.SUFFIX.encode():
        return None
    level, _, index = suffix.rpartition(b":")
    window, x, _coarse = level.partition(b"x")
    return window, x + index


def _stale_before(hash_name: bytes, field: int, coarse: bool) -> int:
    """The first fine (or, ``coarse``, coarse) field of ``hash_name`` that a trim at a write of
    ``field`` keeps (see ARGV[7] in lua/window.lua).

    A check at the time of that write reads fields of this level from about one window
    back: ``field - G`` fine buckets, less up to one coarse bucket (``C``) subtracted at the
    old edge; coarse buckets from ``field - G/C - 1``. Two more windows are kept, so a
    client whose clock runs ahead by up to two windows cannot drop fields that others still
    count. ``b":60/60"``: 60 per window, coarse 10: fine ``field - 190``, coarse
    ``field - 19``.
    """
    g = int(hash_name.rpartition(b"/")[2])
    if coarse:
        return field - 3 * (g // windows.coarse_factor(g)) - 1
    return field - 3 * g - windows.coarse_factor(g)


class RedisEncoded(Encoded):
    """The plan as the script's arguments, and where its reply puts each value.

    Everything here is computed once per plan (plans are memoised objects shared by every
    subject): a check only adds its subject's key base.
    """

    __slots__ = (
        "_templates",
        "hash_reads",
        "hash_writes",
        "key_reads",
        "key_writes",
        "replied",
        "slots",
        "top_writes",
        "trims",
        "tx_commands",
        "tx_reads_from",
        "tx_tops",
        "undo_hash",
        "undo_keys",
    )

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        top: list[tuple[int, bytes]] = []
        other: list[tuple[int, bytes]] = []
        keyed: list[tuple[int, bytes]] = []
        undo_hash, undo_keys = [], []
        hashed: list[tuple[int, bytes, bytes, int]] = []  # (write, hash, field, ttl)
        for n, (suffix, ttl) in enumerate(self.writes):
            split = _split(suffix)
            if split is None:
                keyed.append((n, b"%s %d" % (suffix, ttl)))
                undo_keys.append(suffix)
            else:
                hashed.append((n, *split, ttl))
                undo_hash.append(b"%s %s" % split)
        # Every write into one hash carries the longest TTL of them (see lua/window.lua).
        ttls: dict[bytes, int] = {}
        for _, name, _, ttl in hashed:
            ttls[name] = max(ttl, ttls.get(name, 0))
        stale: dict[bytes, list[int]] = {}
        for _, name, field, _ in hashed:
            coarse = field.startswith(b"x")
            index = int(field[1:] if coarse else field)
            stale.setdefault(name, [0, 0])[coarse] = _stale_before(name, index, coarse)
        tops: list[tuple[int, bytes, bytes, int]] = []  # (write, hash, field, most)
        for n, name, field, _ in hashed:
            g = int(name.rpartition(b"/")[2])
            if field.startswith(b"x") or windows.coarse_factor(g) == 1:  # coarsest level
                # At most the fields from the stale ones to these when none is stale.
                fine_index = max(int(f) for _, h, f, _ in hashed if h == name and f[:1] != b"x")
                most = fine_index - stale[name][0] + 1
                if field.startswith(b"x"):
                    most += int(field[1:]) - stale[name][1] + 1
                top.append((n, b"%s %s %d %d" % (name, field, ttls[name], most)))
                tops.append((n, name, field, most))
            else:
                other.append((n, b"%s %s %d" % (name, field, ttls[name])))
        # The script answers the increments in the order of its arguments: reorder
        # write_index to match.
        self.write_index = [self.write_index[n] for n, _ in top + other + keyed]
        self.refresh_proofs()
        self.top_writes = b" ".join(w for _, w in top)
        self.hash_writes = b" ".join(w for _, w in other)
        self.key_writes = b" ".join(w for _, w in keyed)
        self.undo_hash = b" ".join(undo_hash)
        self.undo_keys = b" ".join(undo_keys)
        self.trims = b" ".join(b"%s %d %d" % (name, f, c) for name, (f, c) in stale.items())
        # Reads: the range first..last of each level of each hash (one HMGET a hash), then
        # the keys (one MGET). The reply holds ``replied`` values in that order; slots[i] is
        # where it holds the value of reads[i].
        fields: dict[tuple[bytes, bytes], list[tuple[int, int]]] = {}
        keys: list[tuple[int, bytes]] = []
        for i, suffix in enumerate(self.reads):
            split = _split(suffix)
            if split is None:
                keys.append((i, suffix))
            else:
                name, field = split
                prefix = b"x" if field.startswith(b"x") else b"."
                index = int(field[1:] if prefix == b"x" else field)
                fields.setdefault((name, prefix), []).append((i, index))
        self.slots = [0] * len(self.reads)
        ranges, at = [], 0
        # One hash's ranges next to each other: the script reads them in one HMGET.
        for (name, prefix), found in sorted(fields.items(), key=lambda item: item[0][0]):
            first, last = min(f for _, f in found), max(f for _, f in found)
            ranges.append(b"%s %s %d %d" % (name, prefix, first, last))
            for i, index in found:
                self.slots[i] = at + index - first
            at += last - first + 1
        for i, _ in keys:
            self.slots[i] = at
            at += 1
        self.replied = at
        self.hash_reads = b" ".join(ranges)
        self.key_reads = b" ".join(suffix for _, suffix in keys)

        # The same check as a transaction (MULTI ... EXEC; see RedisBackend._transaction):
        # the increments in the script's order, an EXPIRE of every written hash and key, an
        # HLEN of every hash whose coarsest level is written, one HMGET a hash read, one
        # MGET of the keys read. EXEC answers one reply per command, in that order.
        order = [n for n, _ in top + other + keyed]
        writes_at = {n: i for i, n in enumerate(order)}
        counted: list[list[Part]] = []
        for n in order:
            suffix, ttl = self.writes[n]
            split = _split(suffix)
            if split is None:
                counted.append([b"INCR", (KEY, suffix)])
            else:
                counted.append([b"HINCRBY", (KEY, split[0]), split[1], b"1"])
        expiring: dict[bytes, int] = dict(ttls)
        for suffix, ttl in self.writes:
            if _split(suffix) is None:
                expiring[suffix] = ttl
        counted += [[b"EXPIRE", (KEY, name), b"%d" % ttl] for name, ttl in expiring.items()]
        #: (EXEC reply of the increment, of the HLEN, most fields, the trim's words) of
        #: each hash whose coarsest level is written: trimmed when the increment created
        #: its bucket and the hash holds more than ``most`` fields (as lua/window.lua does).
        self.tx_tops = [
            (
                writes_at[n],
                len(counted) + k,
                most,
                b"%s %d %d" % (name, stale[name][0], stale[name][1]),
            )
            for k, (n, name, _field, most) in enumerate(tops)
        ]
        counted += [[b"HLEN", (KEY, name)] for _, name, _, _ in tops]
        reading: list[list[Part]] = []
        by_hash: dict[bytes, list[bytes]] = {}
        for (name, prefix), found in sorted(fields.items(), key=lambda item: item[0][0]):
            first, last = min(f for _, f in found), max(f for _, f in found)
            mark = b"" if prefix == b"." else prefix
            names = by_hash.setdefault(name, [])
            names += [b"%s%d" % (mark, f) for f in range(first, last + 1)]
        reading += [[b"HMGET", (KEY, name), *names] for name, names in by_hash.items()]
        if keys:
            reading.append([b"MGET", *[(KEY, suffix) for _, suffix in keys]])
        #: The commands of a counted check and of a look, and where their reads start.
        self.tx_commands = (reading, counted + reading)
        self.tx_reads_from = (0, len(counted))
        self._templates: dict[tuple[bool, int], list[bytes]] = {}

    def transaction(self, increment: bool, base_len: int) -> list[bytes]:
        """This check's commands as a template for a key base of ``base_len`` bytes."""
        found = self._templates.get((increment, base_len))
        if found is None:
            found = _template(self.tx_commands[increment], base_len)
            self._templates[increment, base_len] = found
        return found


class RedisBackend(Backend):
    """Redis through django-redis's connection factory: the checks of a request in one
    round trip on this thread's own connection."""

    inline_ok = True
    encoding = RedisEncoded
    #: Count and read as one transaction of plain commands (:meth:`_transaction`) rather
    #: than the script: as atomic, and a third of the server's time (the script's calls
    #: into Redis cost it microseconds each). The script stays for take-backs.
    transactions = True

    def __init__(self, alias: str, cache: Any) -> None:
        """Built as every backend is, ``cls(alias, cache)``: the server (``LOCATION``; a
        list, or several comma-separated: the first, the primary) and the client's options
        come from ``CACHES[alias]`` (:func:`~.base.cache_settings`)."""
        super().__init__(alias, cache)
        location, options = cache_settings(alias)
        url = location if isinstance(location, str) else next(iter(location), "")
        self.url = str(url).split(",")[0].strip()
        if not self.url:
            raise BackendError(f"{alias}: no Redis server in LOCATION")
        # Without a timeout a server that stops answering would hang every request:
        # RATELIMIT_SOCKET_TIMEOUT applies unless the cache's OPTIONS set SOCKET_TIMEOUT /
        # SOCKET_CONNECT_TIMEOUT.
        options.setdefault("SOCKET_TIMEOUT", conf.SOCKET_TIMEOUT)
        options.setdefault("SOCKET_CONNECT_TIMEOUT", conf.SOCKET_TIMEOUT)
        self.options = options
        #: Marked down for RATELIMIT_DEAD_RETRY seconds when a check fails. Named "server"
        #: in errors: the URL may hold a password.
        self.server = Server("server")
        #: Each thread's connection for :meth:`_call`, and all of them, for :meth:`close`.
        self._local = threading.local()
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._open_client()

    def _open_client(self) -> None:
        """Build the client (redis-py connects on its first command): the one step of the
        constructor a subclass that talks through another client replaces.

        django-redis's own connection factory (the cache's OPTIONS: password, parser, pool
        class...), on a pool of our own: django-redis shares one pool per URL, whose
        timeouts whoever came first decided.
        """
        from django_redis.pool import get_connection_factory

        factory = get_connection_factory(self.options)
        pool = factory.get_connection_pool(factory.make_connection_params(self.url))
        self._use(
            factory.redis_client_cls(connection_pool=pool, **factory.redis_client_cls_kwargs)
        )

    def _use(self, client: Any) -> None:
        """Talk to the server through ``client``, with the scripts registered on it."""
        self.client = client
        self.script = client.register_script(SCRIPT)
        self.meter_script = client.register_script(METER_SCRIPT)
        self.trim_script = client.register_script(TRIM_SCRIPT)

    def _close_client(self) -> None:
        """Close the client's connections (the pool is ours: see :meth:`_open_client`)."""
        self.client.connection_pool.disconnect()

    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        return self._exchange(ops, (), 0)[0]

    def meter_many(self, ops: Sequence[MeterOp], now_us: int) -> list[MeterReply]:
        return self._exchange((), ops, now_us)[1]

    def exchange(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        """Both scripts pipelined into one round trip (one alone when the other has no work)."""
        if not meters:
            return self.run_many(ops), []
        if not ops:
            return [], self.meter_many(meters, now_us)
        return self._exchange(ops, meters, now_us)

    def _exchange(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        self._check_alive(self.server)
        if self.transactions and not meters and all(op.undo is None for op in ops):
            try:
                found = self._transaction(ops)
            except Exception as exc:  # includes a counter that is not a number
                raise self._failed(exc, self.server) from exc
            self._succeeded(self.server)
            return found, []
        # One script call per group of subjects (:meth:`_groups`: all of them on one server,
        # one hash slot each on a cluster).
        window_groups = [
            (group, [ops[i] for i in group])
            for group in (self._groups([op.namespace for op in ops]) if ops else [])
        ]
        meter_groups = [
            (group, [meters[i] for i in group])
            for group in (self._groups([m.namespace for m in meters]) if meters else [])
        ]
        calls: list[tuple[Any, list[bytes], list[bytes]]] = []
        for _, chosen_ops in window_groups:
            calls.append((self.script, *self._window_args(chosen_ops)))
        for _, chosen_meters in meter_groups:
            calls.append((self.meter_script, *self._meter_args(chosen_meters, now_us)))
        values: list[list[int]] = [[] for _ in ops]
        metered: list[MeterReply] = [MeterReply(None)] * len(meters)
        try:
            replies = iter(self._evaluate(calls))
            for group, chosen_ops in window_groups:
                found = self._window_values(chosen_ops, next(replies))
                for i, v in zip(group, found, strict=True):
                    values[i] = v
            for group, chosen_meters in meter_groups:
                answered = self._meter_replies(chosen_meters, next(replies))
                for i, reply in zip(group, answered, strict=True):
                    metered[i] = reply
        except Exception as exc:  # includes a counter that is not a number
            raise self._failed(exc, self.server) from exc
        self._succeeded(self.server)
        return values, metered

    def _groups(self, namespaces: Sequence[str]) -> list[list[int]]:
        """The subjects (indexes into ``namespaces``) each script call carries: all of them,
        in one call, on a single server."""
        return [list(range(len(namespaces)))]

    def _evaluate(self, calls: list[tuple[Any, list[bytes], list[bytes]]]) -> list[Any]:
        """Run the scripts: one alone on this thread's connection (:meth:`_call`), several
        as EVALSHAs in one pipeline (a script the server lacks is then run again alone)."""
        if len(calls) == 1:
            return [self._run_script(*calls[0])]
        pipe = self.client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies = pipe.execute(raise_on_error=False)
        for n, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):  # not run: safe to run again
                replies[n] = self._run_script(*calls[n])
            elif isinstance(reply, Exception):
                raise reply
        return replies

    def _run_script(self, script: Any, keys: list[bytes], args: list[bytes]) -> Any:
        """EVALSHA, or EVAL (which also loads the script) when the server lacks it (a
        restart, SCRIPT FLUSH): NOSCRIPT means nothing ran, so running it is safe."""
        count = b"%d" % len(keys)
        try:
            return self._call([b"EVALSHA", script.sha.encode(), count, *keys, *args])
        except NoScriptError:
            return self._call([b"EVAL", script.script.encode(), count, *keys, *args])

    def _connection(self) -> Any:
        """This thread's own connection (see :meth:`_call`)."""
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            pool = self.client.connection_pool
            conn = pool.connection_class(**pool.connection_kwargs)
            local.conn, local.pid, local.reader = conn, os.getpid(), None
            self._connections.add(conn)
        return conn

    def _call(self, command: list[bytes]) -> Any:
        """One command on this thread's own connection, and its reply.

        The checks' scripts bypass redis-py's client and pool: on every command they take a
        lock, poll the socket for stray data and record metrics, about a third of a check on
        loopback. Each thread (and process: a forked child opens its own) keeps one
        connection, built by the pool's connection class with the pool's options (timeouts,
        password, parser); it connects on first use and again after a failure. No retries:
        a check's script is not idempotent, and a failure fails open or closed at once.
        """
        conn = self._connection()
        try:
            conn.send_packed_command([_pack(command)])
            return conn.read_response()
        except ResponseError:
            raise  # the server answered: the connection is in step
        except BaseException:
            # A reply may still be on its way: never read it as the next command's.
            conn.disconnect()
            raise

    def _transaction(self, ops: Sequence[Op]) -> list[list[int]]:
        """Count and read every op's buckets in one ``MULTI ... EXEC`` (atomic, as the
        script is), each op's values in the order of its plan's reads.

        A transaction cannot decide on a reply: every written hash gets its ``EXPIRE`` (the
        same TTL for every write into it, so a later one never shortens an earlier one's
        reach), and the hashes to trim (a coarse bucket created in a hash that holds more
        fields than three windows need: once per coarse bucket of a busy subject) are
        trimmed by :data:`TRIM_SCRIPT` in a second round trip.
        """
        prefix = self.key_prefix.encode()
        encoded: list[tuple[RedisEncoded, bytes, bool]] = []
        chunks = [MULTI]
        total = 0
        for op in ops:
            enc = cast(RedisEncoded, self.encoded(op.plan))
            base = prefix + op.namespace.encode()
            chunks.append(base.join(enc.transaction(op.increment, len(base))))
            total += len(enc.tx_commands[op.increment])
            encoded.append((enc, base, op.increment))
        chunks.append(EXEC)
        replies = self._call_many(b"".join(chunks), total + 2)
        answered = replies[-1]
        if isinstance(answered, Exception):
            raise answered
        if not isinstance(answered, list) or len(answered) != total:
            raise BackendError(f"{answered!r:.80}: not the transaction's {total} replies")
        results: list[list[int]] = []
        trims: list[tuple[bytes, bytes]] = []
        at = 0
        for enc, base, increment in encoded:
            mine = answered[at : at + len(enc.tx_commands[increment])]
            at += len(mine)
            for reply in mine:
                if isinstance(reply, Exception):  # e.g. HINCRBY of a field that is no number
                    raise reply
            found: list[Any] = []
            for reply in mine[enc.tx_reads_from[increment] :]:
                found += reply
            values = [int(found[slot] or 0) for slot in enc.slots]  # IndexError if short
            if increment:
                enc.merge(values, mine[: len(enc.writes)])
                stale = b" ".join(
                    words
                    for created, length, most, words in enc.tx_tops
                    if mine[created] == 1 and mine[length] > most
                )
                if stale:
                    trims.append((base, stale))
            results.append(values)
        for base, stale in trims:
            self._run_script(self.trim_script, [base], [base, stale])
        return results

    def _call_many(self, packed: bytes, count: int) -> list[Any]:
        """Send ``packed`` on this thread's connection (:meth:`_call`) and read ``count``
        replies, parsed by hiredis straight off the socket (redis-py's reading costs a few
        microseconds a reply, and a transaction has one a command); an error reply is an
        exception among them, not raised."""
        conn = self._connection()
        local = self._local
        try:
            conn.connect()
            sock = conn._sock
            reader = getattr(local, "reader", None)
            if reader is None:
                reader = local.reader = hiredis.Reader() if hiredis else None
            if reader is None:  # no hiredis: redis-py parses, one reply at a time
                conn.send_packed_command([packed])
                return [self._read_one(conn) for _ in range(count)]
            sock.sendall(packed)
            replies: list[Any] = []
            while len(replies) < count:
                reply = reader.gets()
                if reply is False:
                    data = sock.recv(65536)
                    if not data:
                        raise ConnectionError("Redis closed the connection")
                    reader.feed(data)
                else:
                    replies.append(reply)
            return replies
        except BaseException:
            # A reply may still be on its way: never read it as the next command's.
            conn.disconnect()
            local.reader = None
            raise

    @staticmethod
    def _read_one(conn: Any) -> Any:
        try:
            return conn.read_response()
        except ResponseError as exc:
            return exc

    def _window_args(self, ops: Sequence[Op]) -> tuple[list[bytes], list[bytes]]:
        keys: list[bytes] = []
        args: list[bytes] = []
        prefix = self.key_prefix
        for op in ops:
            enc = cast(RedisEncoded, self.encoded(op.plan))
            base = (prefix + op.namespace).encode()
            keys.append(base + enc.reads[-1])
            if op.undo is None:
                undo_hash = undo_keys = b""
            else:
                taken = cast(RedisEncoded, self.encoded(op.undo))
                undo_hash, undo_keys = taken.undo_hash, taken.undo_keys
            if op.increment:
                args += (base, undo_hash, undo_keys, enc.top_writes, enc.hash_writes)
                args += (enc.key_writes, enc.trims, enc.hash_reads, enc.key_reads)
            else:
                args += (base, undo_hash, undo_keys, b"", b"", b"", b"")
                args += (enc.hash_reads, enc.key_reads)
        return keys, args

    def _window_values(self, ops: Sequence[Op], reply: bytes) -> list[list[int]]:
        """Each op's values (in the order of its plan's reads) from the script's reply, the
        written buckets' taken from their increments (:meth:`Encoded.merge`)."""
        tokens = reply.split()
        results = []
        at = 0
        for op in ops:
            enc = cast(RedisEncoded, self.encoded(op.plan))
            if op.increment:
                written = tokens[at : at + len(enc.writes)]
                at += len(written)
            found = tokens[at : at + enc.replied]
            at += enc.replied
            values = [int(found[slot]) for slot in enc.slots]  # IndexError if short
            if op.increment:
                enc.merge(values, written)
            results.append(values)
        if at != len(tokens):
            raise BackendError(f"{len(tokens)} values in the reply, {at} expected")
        return results

    def _meter_args(self, ops: Sequence[MeterOp], now_us: int) -> tuple[list[bytes], list[bytes]]:
        keys, args = [], [b"%d" % now_us]
        for op in ops:
            keys.append((self.key_prefix + op.namespace + gcra.SUFFIX).encode())
            args += _meter_args(op.meter)
            if op.take_back is not None:
                written = op.take_back.written
                taken = b"" if written is None else gcra.encode(op.meter, written)
                args += [b"u", taken]
            else:
                args += [b"c" if op.increment else b"l", b""]
        return keys, args

    @staticmethod
    def _meter_replies(ops: Sequence[MeterOp], reply: Any) -> list[MeterReply]:
        return [
            MeterReply(
                gcra.decode(op.meter, reply[2 * n] or None),
                gcra.decode(op.meter, reply[2 * n + 1] or None),
            )
            for n, op in enumerate(ops)
        ]

    def close(self) -> None:
        for conn in list(self._connections):
            conn.disconnect()
        self._close_client()

    def physical_key(self, namespace: str, suffix: str) -> tuple[str, str | None]:
        """The Redis key (and hash field) that holds one bucket."""
        base = self.key_prefix + namespace
        split = _split(suffix.encode())
        if split is None:
            return base + suffix, None
        return base + split[0].decode(), split[1].decode()

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        self._check_alive(self.server)
        keys: set[str] = set()
        fields: dict[str, list[str]] = {}
        for suffix in suffixes:
            key, field = self.physical_key(namespace, suffix)
            if field is None:
                keys.add(key)
            else:
                fields.setdefault(key, []).append(field)
        try:
            pipe = self.client.pipeline(transaction=False)
            for key in sorted(keys):  # one key a command: a cluster's pipeline takes no more
                pipe.delete(key)
            for key, names in fields.items():
                pipe.hdel(key, *names)
            pipe.execute()
        except Exception as exc:
            raise self._failed(exc, self.server) from exc


class RedisClusterBackend(RedisBackend):
    """Redis Cluster, through redis-py's ``RedisCluster`` (django-redis has no cluster client).

    Select it with ``RATELIMIT_BACKEND = "ratelimit_app.backends.redis.RedisClusterBackend"``;
    ``LOCATION`` of the ``RATELIMIT_USE_CACHE`` alias names one node of the cluster
    (``redis://host:port``; a list: the first), from which the client learns the others.
    The scripts and the key layout are :class:`RedisBackend`'s: every key of a subject carries
    its hash tag, so a subject's buckets live in one slot, and the subjects of a request are
    checked by one script call per slot (a cluster refuses a call whose keys span slots).
    A request whose rules count two subjects on two slots makes two round trips.

    The client connects (and learns the cluster's slots) on first use, not when the backend
    is built: a cluster that cannot be reached fails that check, and the next ones fail at
    once for ``RATELIMIT_DEAD_RETRY`` seconds, like any backend that failed. redis-py's
    cluster client retries a failed node and refreshes its slot map, so a check can take
    longer than one socket timeout: async views run it in a thread, off the event loop.
    """

    inline_ok = False
    #: redis-py's cluster client routes each script call to its slot's node.
    transactions = False

    def _open_client(self) -> None:
        """Nothing to open yet: the cluster client reads the slot map from a node when it
        is built, so :meth:`_connect` builds it on first use."""
        self.timeouts = {
            "socket_timeout": self.options["SOCKET_TIMEOUT"],
            "socket_connect_timeout": self.options["SOCKET_CONNECT_TIMEOUT"],
        }
        self.connected = False
        self._connect_lock = threading.Lock()

    def _connect(self) -> None:
        """Build the cluster client on first use (it reads the slot map from a node)."""
        if self.connected:
            return
        self._check_alive(self.server)
        with self._connect_lock:
            if self.connected:
                return
            from redis.cluster import RedisCluster

            try:
                client = RedisCluster.from_url(self.url, **self.timeouts)
            except Exception as exc:
                raise self._failed(exc, self.server) from exc
            self._use(client)
            self.connected = True

    def _exchange(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        self._connect()
        return super()._exchange(ops, meters, now_us)

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        self._connect()
        super().delete(namespace, suffixes)

    def _groups(self, namespaces: Sequence[str]) -> list[list[int]]:
        """One group per hash slot (a namespace is its subject's hash tag), in first-seen
        order."""
        by_slot: dict[int, list[int]] = {}
        for i, ns in enumerate(namespaces):
            by_slot.setdefault(key_slot(ns.encode()), []).append(i)
        return list(by_slot.values())

    def _evaluate(self, calls: list[tuple[Any, list[bytes], list[bytes]]]) -> list[Any]:
        """Each call on its own, routed to the node of its slot by redis-py."""
        return [script(keys=keys, args=args) for script, keys, args in calls]

    def _close_client(self) -> None:
        if self.connected:
            self.client.close()
