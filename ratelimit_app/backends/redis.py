"""Redis through django-redis: the checks of a request in one atomic round trip.

A check is one transaction of plain commands (``MULTI`` ... ``EXEC``: ``HINCRBY``,
``EXPIRE``, ``HLEN``, ``HMGET``, ``MGET``), packed from per-plan templates and parsed by
hiredis off the socket: as atomic as a script and a third of the server's time, since each
call a script makes into Redis costs it microseconds. Lua runs only what must decide on a
value inside the round trip, each script a file of ``lua/`` (package data) whose header
says what it takes: taking back a refused hit (inside the transaction), trimming a busy
subject's hashes (after it, once per coarse bucket) and the leaky buckets of
:mod:`ratelimit_app.algorithms.gcra` (pipelined after it).

Keys of one subject share a hash tag (``{...}``), one Redis Cluster slot per subject:
:class:`RedisClusterBackend` (redis-py's cluster client; django-redis has none) sends one
transaction per slot. Bucket indexes come from the client's clock, never the server's.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Awaitable, Callable, Generator, Sequence
from functools import partial
from importlib import resources
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async
from redis.crc import key_slot
from redis.exceptions import NoScriptError, ResponseError

from ratelimit_app.algorithms import gcra, rates, windows
from ratelimit_app.algorithms.windows import Plan
from ratelimit_app.backends import aio
from ratelimit_app.backends import base as backend_base
from ratelimit_app.backends.base import (
    Backend,
    Encoded,
    IdlePool,
    MeterOp,
    MeterReply,
    Op,
    Server,
    adrive,
    cache_settings,
    drive,
)
from ratelimit_app.exceptions import BackendError

try:  # in the redis extra: parses replies in C
    import hiredis
except ImportError:  # pragma: no cover
    hiredis = None  # type: ignore[assignment]


def _lua(name: str) -> str:
    """The Lua source ``lua/<name>.lua`` shipped beside this module (package data)."""
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


#: Refused hits taken back inside a check's transaction (lua/take_back.lua).
TAKE_BACK_SCRIPT = _lua("take_back")
#: A subject's stale hash fields dropped after a check's transaction (lua/trim.lua).
TRIM_SCRIPT = _lua("trim")
#: Every leaky bucket of a request, atomically (lua/meter.lua); a stored TAT lives until
#: its bucket is empty plus :data:`ratelimit_app.algorithms.gcra.TTL_MARGIN` seconds and a
#: millisecond.
#: Microseconds ahead of now a charge may put a TAT at most (:func:`gcra.charged`).
FORCED_MOST = rates.MAX_SECONDS * gcra.MICROS
METER_SCRIPT = (
    _lua("meter")
    .replace("local margin = MARGIN_MS", f"local margin = {gcra.TTL_MARGIN * 1000 + 1}")
    .replace("local most = MOST_US", f"local most = {FORCED_MOST}")
)

#: Amounts (request costs) whose commands a plan's encoding keeps; it starts over when full.
AMOUNT_MEMO = 16
#: A transaction's first and last commands.
MULTI = b"*1\r\n$5\r\nMULTI\r\n"
EXEC = b"*1\r\n$4\r\nEXEC\r\n"

#: A command's part: bytes as they are, or a key: ``(KEY, name)`` is the subject's key base
#: followed by ``name`` (see :func:`_template`).
KEY = object()
Part = bytes | tuple[object, bytes]
Command = list[Part]
#: The take-back's place among a plan's command lists (:attr:`RedisEncoded.commands`),
#: after a look's and a counted check's (0 and 1: ``Op.increment`` indexes them).
TAKE_BACK = 2
#: One op of a transaction: its plan's encoding, its take-back plan's (None: none), its key
#: base, whether it counts and the amount it adds or takes back.
Job = tuple["RedisEncoded", "RedisEncoded | None", bytes, bool, int]
#: A subject's hashes to trim after a transaction: its key base and lua/trim.lua's ARGV[1].
Trim = tuple[bytes, bytes]
#: The backend's logic is written as a generator of exchanges: each yields one pipeline
#: (the packed commands and how many replies they make) and is sent its replies (an error
#: reply among them as an exception, not raised), by a sync or an asyncio driver.
Asking = Generator[tuple[bytes, int], Any, Any]
Item = TypeVar("Item", Op, MeterOp)
Answer = TypeVar("Answer")


def _template(commands: Sequence[Command], base_len: int) -> list[bytes]:
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


def _resolved(command: Command, base: bytes) -> list[Any]:
    """``command`` with the key base ``base`` put in, as redis-py's clients take it."""
    name = cast(bytes, command[0]).decode()
    return [name, *[base + p[1] if isinstance(p, tuple) else p for p in command[1:]]]


def _pack(command: list[bytes]) -> bytes:
    """A command in the Redis protocol (RESP): every part is bytes already, so this does
    less than redis-py's packers, which check and encode each part."""
    return b"*%d\r\n%s" % (
        len(command),
        b"".join([b"$%d\r\n%s\r\n" % (len(part), part) for part in command]),
    )


def _script_call(
    script: Any, keys: list[bytes], args: list[bytes], by_sha: bool = True
) -> list[bytes]:
    """The EVALSHA (or, not ``by_sha``, EVAL) of a script registered with redis-py."""
    head = [b"EVALSHA", script.sha.encode()] if by_sha else [b"EVAL", script.script.encode()]
    return [*head, b"%d" % len(keys), *keys, *args]


def _split(suffix: bytes) -> tuple[bytes, bytes] | None:
    """A uniform bucket's hash and field, else None (a key of its own: a hierarchical
    bucket, a quota's period, a leaky bucket's TAT):
    ``b":60/60:123"`` -> ``(b":60/60", b"123")``, ``b":60/60x10:12"`` -> ``(b":60/60", b"x12")``.
    """
    if suffix.startswith((b":h", b":q")) or suffix == gcra.SUFFIX.encode():
        return None
    level, _, index = suffix.rpartition(b":")
    window, x, _coarse = level.partition(b"x")
    return window, x + index


def _stale_before(hash_name: bytes, field: int, coarse: bool) -> int:
    """The first fine (or, ``coarse``, coarse) field of ``hash_name`` that a trim at a write of
    ``field`` keeps.

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


def _stale_fields(fields: list[tuple[int, bytes, bytes]]) -> dict[bytes, tuple[int, int]]:
    """For each written hash, the first fine and coarse fields a trim keeps."""
    stale: dict[bytes, list[int]] = {}
    for _, name, field in fields:
        coarse = field.startswith(b"x")
        index = int(field[1:] if coarse else field)
        stale.setdefault(name, [0, 0])[coarse] = _stale_before(name, index, coarse)
    return {name: (fine, coarse) for name, (fine, coarse) in stale.items()}


def _watched(
    fields: list[tuple[int, bytes, bytes]], stale: dict[bytes, tuple[int, int]]
) -> list[tuple[int, bytes, int]]:
    """(write, hash, most) of each write to the coarsest level of its window.

    ``most`` is what the hash holds when none of its fields is stale: the fields from the
    first ones a trim keeps to the ones written now. When the write creates its bucket (once
    per coarse bucket) and the hash then holds more, some are stale (never for a new
    subject): the hash is trimmed.
    """
    watched = []
    for n, name, field in fields:
        coarse = field.startswith(b"x")
        if coarse or windows.coarse_factor(int(name.rpartition(b"/")[2])) == 1:
            fine = max(int(f) for _, h, f in fields if h == name and not f.startswith(b"x"))
            most = fine - stale[name][0] + 1
            if coarse:
                most += int(field[1:]) - stale[name][1] + 1
            watched.append((n, name, most))
    return watched


def _count_commands(
    writes: Sequence[tuple[bytes, int]], amount: int = 1
) -> tuple[list[Command], list[tuple[int, int, int, bytes]]]:
    """The commands that count a plan's writes by ``amount`` (a request's cost), and what
    tells that a hash needs a trim.

    An increment a write (its reply proves the write), an EXPIRE of each written hash and
    key, then an HLEN of each hash :func:`_watched` names. Every write into one hash carries
    the longest TTL of its fields, so no EXPIRE shortens another's reach. The second list
    holds, per HLEN: the positions of its increment's reply and its own, its ``most`` and
    the words of lua/trim.lua for its hash.
    """
    commands: list[Command] = []
    expiring: dict[bytes, int] = {}
    fields: list[tuple[int, bytes, bytes]] = []  # (write, hash, field) of the hash writes
    by = b"%d" % amount
    for n, (suffix, ttl) in enumerate(writes):
        split = _split(suffix)
        if split is None:
            commands.append([b"INCRBY", (KEY, suffix), by])
            name = suffix
        else:
            commands.append([b"HINCRBY", (KEY, split[0]), split[1], by])
            name = split[0]
            fields.append((n, *split))
        expiring[name] = max(ttl, expiring.get(name, 0))
    commands += [[b"EXPIRE", (KEY, name), b"%d" % ttl] for name, ttl in expiring.items()]
    stale = _stale_fields(fields)
    tops = []
    for n, name, most in _watched(fields, stale):
        tops.append((n, len(commands), most, b"%s %d %d" % (name, *stale[name])))
        commands.append([b"HLEN", (KEY, name)])
    return commands, tops


def _read_levels(
    reads: Sequence[bytes],
) -> tuple[dict[bytes, dict[bytes, list[tuple[int, int]]]], list[tuple[int, bytes]]]:
    """A plan's reads by hash and level (``b"x"`` coarse, ``b""`` fine), each as (position
    in the reads, index), hashes in order of their names; and the keys read, with theirs."""
    levels: dict[bytes, dict[bytes, list[tuple[int, int]]]] = {}
    keys: list[tuple[int, bytes]] = []
    for i, suffix in enumerate(reads):
        split = _split(suffix)
        if split is None:
            keys.append((i, suffix))
        else:
            name, field = split
            mark = b"x" if field.startswith(b"x") else b""
            levels.setdefault(name, {}).setdefault(mark, []).append((i, int(field[len(mark) :])))
    return {name: levels[name] for name in sorted(levels)}, keys


def _read_commands(reads: Sequence[bytes]) -> tuple[list[Command], list[int]]:
    """The commands that read a plan's buckets, and where each read's value is in their
    replies put end to end.

    The fields a check reads at one level are consecutive: one HMGET a hash of each level's
    range, first to last, then one MGET of the keys.
    """
    levels, keys = _read_levels(reads)
    commands: list[Command] = []
    slots = [0] * len(reads)
    at = 0
    for name, by_level in levels.items():
        names: list[Part] = []
        for mark, found in by_level.items():
            first, last = min(f for _, f in found), max(f for _, f in found)
            names += [b"%s%d" % (mark, f) for f in range(first, last + 1)]
            for i, index in found:
                slots[i] = at + index - first
            at += last - first + 1
        commands.append([b"HMGET", (KEY, name), *names])
    for n, (i, _) in enumerate(keys):
        slots[i] = at + n
    if keys:
        commands.append([b"MGET", *[(KEY, suffix) for _, suffix in keys]])
    return commands, slots


def _take_back_command(writes: Sequence[tuple[bytes, int]], amount: int = 1) -> Command:
    """lua/take_back.lua run on a plan's writes: a refused hit of that plan (``amount``: its
    cost) taken back."""
    fields, keys = [], []
    for suffix, _ in writes:
        split = _split(suffix)
        if split is None:
            keys.append(suffix)
        else:
            fields.append(b"%s %s" % split)
    # EVAL, not EVALSHA: a transaction cannot run a script the server lacks again alone.
    script = TAKE_BACK_SCRIPT.encode()
    return [b"EVAL", script, b"1", (KEY, b""), b" ".join(fields), b" ".join(keys), b"%d" % amount]


class RedisEncoded(Encoded):
    """A plan as the commands of a transaction, and where their replies put each value.

    A uniform window's buckets are the fields of one hash (``base:W/G``; a fine bucket's
    field is its index, a coarse bucket's ``x`` and its index), so a check makes one HMGET a
    window; hierarchical buckets are keys of their own. Computed once per plan (plans are
    memoised and shared by every subject): a check only adds its subject's key base. A
    request's cost is the amount its increments and take-back add and subtract: the
    commands of each amount are made on first use, and as many of them whatever the amount.
    """

    __slots__ = ("_amounts", "_templates", "commands", "reads_from", "slots", "tops")

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        counted, self.tops = _count_commands(self.writes)
        reading, self.slots = _read_commands(self.reads)
        #: The commands of a look, of a counted check, of the take-back of a counted check,
        #: for an amount of 1 (:meth:`commands_for`: of any amount).
        self.commands = (reading, counted + reading, [_take_back_command(self.writes)])
        #: Where the reads' replies start, in a look's and in a counted check's.
        self.reads_from = (0, len(counted))
        self._amounts: dict[int, tuple[list[Command], ...]] = {1: self.commands}
        self._templates: dict[tuple[int, int, int], list[bytes]] = {}

    def commands_for(self, amount: int) -> tuple[list[Command], ...]:
        """:attr:`commands` whose increments and take-back add and subtract ``amount``."""
        found = self._amounts.get(amount)
        if found is None:
            if len(self._amounts) >= AMOUNT_MEMO:  # a cost from a callable: any value
                self._amounts = {1: self.commands}
                self._templates.clear()
            counted, _ = _count_commands(self.writes, amount)
            reading = self.commands[0]
            take_back = [_take_back_command(self.writes, amount)]
            found = self._amounts[amount] = (reading, counted + reading, take_back)
        return found

    def template(self, kind: int, base_len: int, amount: int = 1) -> list[bytes]:
        """The commands of ``kind`` (an ``Op.increment``, or :data:`TAKE_BACK`) by
        ``amount`` as a :func:`_template` for a key base of ``base_len`` bytes."""
        found = self._templates.get((kind, base_len, amount))
        if found is None:
            commands = self.commands_for(amount)[kind]
            found = self._templates[kind, base_len, amount] = _template(commands, base_len)
        return found


def _executed(reply: Any, count: int) -> list[Any]:
    """EXEC's reply: one reply for each of the ``count`` commands. An error among them
    (``EXECABORT``, a counter that is not a number...) is raised."""
    if isinstance(reply, Exception):
        raise reply
    if not isinstance(reply, list) or len(reply) != count:
        raise BackendError(f"{reply!r:.80}: not the transaction's {count} replies")
    for answer in reply:
        if isinstance(answer, Exception):
            raise answer
    return reply


def _slots(items: Sequence[Any]) -> list[list[int]]:
    """The indexes of ``items`` in each hash slot (a namespace is its subject's hash tag),
    in first-seen order."""
    by_slot: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        by_slot.setdefault(key_slot(item.namespace.encode()), []).append(i)
    return list(by_slot.values())


def _by_slot(items: Sequence[Item], run: Callable[[list[Item]], list[Answer]]) -> list[Answer]:
    """``run`` on the items of each hash slot, in first-seen order; the answers in the
    order of ``items``."""
    answers: list[Any] = [None] * len(items)
    for group in _slots(items):
        for i, answer in zip(group, run([items[i] for i in group]), strict=True):
            answers[i] = answer
    return answers


def _address(url: str) -> str:
    """Where a Redis URL points (``host:port``, or a socket's path), never its password:
    how messages name the server."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path or "server"
    host = parts.hostname
    if not host:
        return "server"
    host = f"[{host}]" if ":" in host else host
    try:
        return f"{host}:{parts.port or 6379}"
    except ValueError:  # no port number: the client refuses it on the first check
        return host


#: Idle connections a process keeps per Redis server, shared by its threads (memcached's
#: ``max_pool_size`` default): a server that runs each request's sync code on a thread of
#: its own (Django's runserver, its ASGI handler) reuses them instead of opening one a
#: request; a thread that finds none idle opens one, closed on return past this many.
IDLE_CONNECTIONS = 64


def _no_script(reply: Any) -> bool:
    """True for the error reply of a script the server lacks (``NOSCRIPT``: it ran nothing)."""
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, Exception) and str(reply).startswith("NOSCRIPT")
    )


def _answered(value: Any) -> Asking:
    """The exchanges of a client that does its own I/O (a cluster's): none, and ``value``."""
    return value
    yield  # (a generator that asks nothing)


class _Link:
    """One connection of the pool and its hiredis reader (None until a transaction is read
    through it, or after a failure)."""

    __slots__ = ("conn", "reader")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.reader: Any = None

    def close(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit, anything may be gone
            self.conn.disconnect()


async def _aread_many(sock: Any, reader: Any, packed: bytes, count: int) -> list[Any]:
    """Send ``packed`` and read ``count`` replies with the hiredis ``reader``, through the
    running event loop (:func:`.aio.exchange`); an error reply is an exception among them,
    not raised."""
    replies: list[Any] = []

    def read(chunk: bytes) -> list[Any] | None:
        if not chunk:
            raise ConnectionError("Redis closed the connection")
        reader.feed(chunk)
        while (reply := reader.gets()) is not False:
            replies.append(reply)
        return replies if len(replies) >= count else None

    found: list[Any] = await aio.exchange(sock, packed, read)
    return found


class RedisBackend(Backend):
    """Redis through django-redis's connection factory: the checks of a request in one
    round trip on a connection of the process's idle pool (:class:`~.base.IdlePool`)."""

    inline_ok = False  # (I/O: aexecute awaits it on asyncio streams)
    encoding = RedisEncoded

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
        # base.SOCKET_TIMEOUT applies unless the cache's OPTIONS set SOCKET_TIMEOUT /
        # SOCKET_CONNECT_TIMEOUT.
        options.setdefault("SOCKET_TIMEOUT", backend_base.SOCKET_TIMEOUT)
        options.setdefault("SOCKET_CONNECT_TIMEOUT", backend_base.SOCKET_TIMEOUT)
        self.options = options
        #: Marked down for base.DEAD_RETRY seconds when a check fails. Named by its
        #: address alone in errors: the URL may hold a password.
        self.server = Server(_address(self.url))
        self._prefix = self.key_prefix.encode()
        #: The idle connections :meth:`_call` takes one from and gives it back to, and all
        #: of them, idle or in use, for :meth:`close`.
        self._idle = IdlePool(self._link, IDLE_CONNECTIONS)
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._open_client()

    @property
    def servers(self) -> Sequence[Server]:
        return (self.server,)

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
        """Talk to the server through ``client``, with the scripts run by SHA registered."""
        self.client = client
        self.meter_script = client.register_script(METER_SCRIPT)
        self.trim_script = client.register_script(TRIM_SCRIPT)

    def _close_client(self) -> None:
        """Close the client's connections (the pool is ours: see :meth:`_open_client`)."""
        self.client.connection_pool.disconnect()

    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        return self._round_trip(ops, (), 0)[0]

    def meter_many(self, ops: Sequence[MeterOp], now_us: int) -> list[MeterReply]:
        return self._round_trip((), ops, now_us)[1]

    def exchange(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        """:meth:`run_many` and :meth:`meter_many` in one round trip: the checks'
        transaction, then the leaky buckets' script (each atomic on its own)."""
        if not meters:
            return self.run_many(ops), []
        if not ops:
            return [], self.meter_many(meters, now_us)
        return self._round_trip(ops, meters, now_us)

    def _round_trip(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        """:meth:`_trip`, on a connection of the pool (:meth:`_call_many`)."""
        result: tuple[list[list[int]], list[MeterReply]] = drive(
            self._trip(ops, meters, now_us), self._ask, Exception
        )
        return result

    def _ask(self, ask: tuple[bytes, int]) -> list[Any]:
        return self._call_many(*ask)

    def _aask(self, ask: tuple[bytes, int]) -> Awaitable[list[Any]]:
        return self._acall_many(*ask)

    async def aexecute(self, ops: Sequence[Op | MeterOp], now_us: int) -> list[Any]:
        """:meth:`execute` through the running event loop, on the pool's connections
        (replies parsed by hiredis, as on the sync path): the same pipeline, scripts and
        failure handling, from the same generator (:meth:`_trip`). Without hiredis, in a
        thread."""
        if hiredis is None:  # pragma: no cover  (in the redis extra)
            return await super().aexecute(ops, now_us)
        for op in ops:
            if type(op) is not Op:
                return await self._amixed(ops, now_us)
        values, _ = await adrive(self._trip(ops, (), now_us), self._aask, Exception)  # type: ignore[arg-type]
        return values

    async def _amixed(self, ops: Sequence[Op | MeterOp], now_us: int) -> list[Any]:
        """:meth:`aexecute` of windows and leaky buckets together."""
        windowed = [op for op in ops if isinstance(op, Op)]
        metered = [op for op in ops if isinstance(op, MeterOp)]
        if len(windowed) + len(metered) != len(ops):
            raise TypeError(f"not an operation of this backend: {ops!r}")
        asking = self._trip(windowed, metered, now_us)
        values, answered = await adrive(asking, self._aask, Exception)
        w, m = iter(values), iter(answered)
        return [next(w) if isinstance(op, Op) else next(m) for op in ops]

    def _trip(self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int) -> Asking:
        """:meth:`_exchanging`, then the trims it calls for; a failure marks the server
        down."""
        server = self.server
        if server.dead_until:  # (every check comes here: no call while it is up)
            self._check_alive(server)
        try:
            values, metered, trims = yield from self._exchanging(ops, meters, now_us)
            for base, stale in trims:
                yield from self._scripting(self.trim_script, [base], [stale])
        except Exception as exc:  # includes a counter that is not a number
            raise self._failed(exc, server) from exc
        if server.dead_until:
            self._succeeded(server)
        return values, metered

    def _exchanging(self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int) -> Asking:
        """One write of the transaction of ``ops`` and the script of ``meters``, one read
        of every reply; each op's values, each meter's reply and the hashes to trim."""
        chunks, jobs, count = self._packed(ops)
        meter_call = None
        if meters:
            meter_call = self._meter_args(meters, now_us)
            chunks.append(_pack(_script_call(self.meter_script, *meter_call)))
        replies = yield b"".join(chunks), (count + 2 if jobs else 0) + bool(meters)
        values: list[list[int]] = []
        trims: list[Trim] = []
        if jobs:
            values, trims = self._window_values(jobs, _executed(replies[count + 1], count))
        metered: list[MeterReply] = []
        if meter_call is not None:
            reply = replies[-1]
            if _no_script(reply):  # (a restart, SCRIPT FLUSH): it ran nothing; again, alone
                reply = yield from self._scripting(self.meter_script, *meter_call, by_sha=False)
            elif isinstance(reply, Exception):
                raise reply
            metered = self._meter_replies(meters, reply)
        return values, metered, trims

    def _job(self, op: Op) -> Job:
        """``op`` as a :data:`Job` of a transaction."""
        encoded: Callable[[Plan], Any] = self.encoded  # (a RedisEncoded; no cast() a call)
        undo = None if op.undo is None else encoded(op.undo)
        base = self._prefix + op.namespace.encode()
        return encoded(op.plan), undo, base, op.increment, op.amount

    def _packed(self, ops: Sequence[Op]) -> tuple[list[bytes], list[Job], int]:
        """The transaction of ``ops`` packed (none: nothing), each op's templates joined with
        its key base; each op as a :data:`Job`, and the number of commands but MULTI and EXEC."""
        if not ops:
            return [], [], 0
        chunks = [MULTI]
        jobs: list[Job] = []
        count = 0
        for op in ops:
            job = enc, undo, base, increment, amount = self._job(op)
            if undo is not None:
                chunks.append(base.join(undo.template(TAKE_BACK, len(base), amount)))
                count += 1
            chunks.append(base.join(enc.template(increment, len(base), amount)))
            count += len(enc.commands[increment])
            jobs.append(job)
        chunks.append(EXEC)
        return chunks, jobs, count

    @staticmethod
    def _window_values(jobs: list[Job], answered: list[Any]) -> tuple[list[list[int]], list[Trim]]:
        """Each op's values (in the order of its plan's reads) from the transaction's
        replies, each written bucket's raised to what its increment answered
        (:meth:`Encoded.merge`); and the hashes to trim, of each counted op whose increment
        created the coarsest bucket of a hash (answered its own amount: a take-back drops a
        field back at zero) that then held more than ``most`` fields."""
        results: list[list[int]] = []
        trims: list[Trim] = []
        at = 0
        for enc, undo, base, increment, amount in jobs:
            at += undo is not None  # a take-back answers first (0)
            end = at + len(enc.commands[increment])
            mine = answered[at:end]
            at = end
            found: list[Any] = []
            for reply in mine[enc.reads_from[increment] :]:
                found += reply
            values = [int(found[slot] or 0) for slot in enc.slots]  # IndexError if short
            if increment:
                enc.merge(values, mine[: len(enc.writes)])
                stale = b" ".join(
                    words
                    for created, length, most, words in enc.tops
                    if mine[created] == amount and mine[length] > most
                )
                if stale:
                    trims.append((base, stale))
            results.append(values)
        return results, trims

    def _scripting(
        self, script: Any, keys: list[bytes], args: list[bytes], by_sha: bool = True
    ) -> Asking:
        """EVALSHA, or EVAL (which also loads the script) when the server lacks it (a
        restart, SCRIPT FLUSH; ``by_sha`` False: known to lack it): NOSCRIPT means nothing
        ran, so running it is safe. Its reply; an error reply is raised."""
        (reply,) = yield _pack(_script_call(script, keys, args, by_sha=by_sha)), 1
        if by_sha and _no_script(reply):
            (reply,) = yield _pack(_script_call(script, keys, args, by_sha=False)), 1
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _acall_many(self, packed: bytes, count: int) -> list[Any]:
        """:meth:`_call_many` through the running event loop, on a connection of the same
        pool (:mod:`.aio`); one that failed or was cancelled mid-reply is closed."""
        idle = self._idle
        link = idle.get()
        try:
            conn = link.conn
            if conn._sock is None:  # connects (and logs in), in a thread
                await sync_to_async(conn.connect, thread_sensitive=False)()
            reader = link.reader
            if reader is None:
                reader = link.reader = hiredis.Reader()
            replies = await _aread_many(conn._sock, reader, packed, count)
        except BaseException:
            link.close()
            raise
        idle.release(link)
        return replies

    def _link(self) -> _Link:
        """A new connection for the pool (it connects on first use), built by the client's
        pool's connection class with its options."""
        pool = self.client.connection_pool
        conn = pool.connection_class(**pool.connection_kwargs)
        self._connections.add(conn)
        return _Link(conn)

    def _call(self, command: list[bytes]) -> Any:
        """One command on a connection of the pool, and its reply.

        redis-py's client and pool take a lock, poll the socket for stray data and record
        metrics on every command, about a third of a check on loopback. The process keeps
        its idle connections (:data:`IDLE_CONNECTIONS`; a forked child opens its own), built
        by the pool's connection class with the pool's options; a connection connects on
        first use, and one that failed is closed, never given back. No retries: a check is
        not idempotent; a failure fails open or closed.
        """
        idle = self._idle
        link = idle.get()
        try:
            link.conn.send_packed_command([_pack(command)])
            reply = link.conn.read_response()
        except ResponseError:
            idle.release(link)  # the server answered: the connection is in step
            raise
        except BaseException:
            # A reply may still be on its way: never read it as the next command's.
            link.close()
            raise
        idle.release(link)
        return reply

    def _call_many(self, packed: bytes, count: int) -> list[Any]:
        """Send ``packed`` on a connection of the pool (:meth:`_call`) and read ``count``
        replies, parsed by hiredis straight off the socket (redis-py's reading costs a few
        microseconds a reply, and a transaction has one a command); an error reply is an
        exception among them, not raised."""
        idle = self._idle
        link = idle.get()
        try:
            replies = self._read_many(link, packed, count)
        except BaseException:
            # A reply may still be on its way: never read it as the next command's.
            link.close()
            raise
        idle.release(link)
        return replies

    def _read_many(self, link: _Link, packed: bytes, count: int) -> list[Any]:
        conn = link.conn
        sock = conn._sock
        if sock is None:
            conn.connect()
            sock = conn._sock
        reader = link.reader
        if reader is None:
            reader = link.reader = hiredis.Reader() if hiredis else None
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

    @staticmethod
    def _read_one(conn: Any) -> Any:
        try:
            return conn.read_response()
        except ResponseError as exc:
            return exc

    def _meter_args(self, ops: Sequence[MeterOp], now_us: int) -> tuple[list[bytes], list[bytes]]:
        """lua/meter.lua's KEYS and ARGV for ``ops``: a request of cost ``c`` is ``c``
        emissions, ``c * T``. Only a cost that may fit is sent to count: it is at most the
        tolerance, so the script's numbers stay below 2**53."""
        keys, args = [], [b"%d" % now_us]
        for op in ops:
            m = op.meter
            keys.append((self.key_prefix + op.namespace + gcra.SUFFIX).encode())
            n = m.rate.count or 1  # a count of 0 never admits: the script only reads
            # A charge fills at most a drain of MAX_SECONDS (gcra.charged): no more is sent.
            q, rem = divmod(min(op.cost * m.interval, FORCED_MOST * n), n)
            tau_a, tau_r = divmod(m.tau, n)
            args += [b"%d" % m.rate.count, b"%d" % q, b"%d" % rem, b"%d" % tau_a, b"%d" % tau_r]
            if op.take_back is not None:
                written = op.take_back.written
                args += [b"u", b"" if written is None else gcra.encode(m, written)]
            elif op.force:
                args += [b"f", b""]
            else:  # a cost over the capacity never fits: a look
                counts = op.increment and op.cost <= m.capacity
                args += [b"c" if counts else b"l", b""]
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
        self._idle.idle = []  # (each one's connection is among those disconnected here)
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
    The commands and the key layout are :class:`RedisBackend`'s: every key of a subject
    carries its hash tag, so a subject's buckets live in one slot, and the subjects of a
    request are checked by one transaction (and one script call) per slot: a cluster refuses
    one whose keys span slots.

    The client connects (and learns the cluster's slots) on first use, not when the backend
    is built: a cluster that cannot be reached fails that check, and the next ones fail at
    once for ``base.DEAD_RETRY`` seconds, like any backend that failed. redis-py's
    cluster client retries a failed node and refreshes its slot map, so a check can take
    longer than one socket timeout. The async path (:meth:`aexecute`) sends each slot's
    commands itself, awaited, to the node the client's slot map names, and leaves a
    redirection to the client, in a thread.
    """

    inline_ok = False

    def _open_client(self) -> None:
        """Nothing to open yet: the cluster client reads the slot map from a node when it
        is built, so :meth:`_connect` builds it on first use."""
        self.timeouts = {
            "socket_timeout": self.options["SOCKET_TIMEOUT"],
            "socket_connect_timeout": self.options["SOCKET_CONNECT_TIMEOUT"],
        }
        self.connected = False
        self._connect_lock = threading.Lock()
        #: The async path's idle connections to each node, by its name (``host:port``).
        self._node_pools: dict[str, IdlePool] = {}

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

    def _round_trip(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        self._connect()
        return super()._round_trip(ops, meters, now_us)

    def _exchange(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply], list[Trim]]:
        """A transaction and a script call per slot, each routed to its node by redis-py."""
        trims: list[Trim] = []
        values = _by_slot(ops, partial(self._transaction, trims=trims))
        return values, _by_slot(meters, partial(self._meter, now_us=now_us)), trims

    def _transaction(self, chosen: list[Op], trims: list[Trim]) -> list[list[int]]:
        """One slot's transaction through redis-py's cluster pipeline."""
        jobs = [self._job(op) for op in chosen]
        pipe = self.client.pipeline(transaction=True)
        for enc, undo, base, increment, amount in jobs:
            if undo is not None:
                take_back = undo.commands_for(amount)[TAKE_BACK][0]
                pipe.execute_command(*_resolved(take_back, base))
            for command in enc.commands_for(amount)[increment]:
                pipe.execute_command(*_resolved(command, base))
        values, stale = self._window_values(jobs, pipe.execute())
        trims.extend(stale)
        return values

    def _meter(self, chosen: list[MeterOp], now_us: int) -> list[MeterReply]:
        """One slot's leaky buckets through redis-py's script call."""
        return self._meter_replies(chosen, self.meter_script(*self._meter_args(chosen, now_us)))

    def _exchanging(self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int) -> Asking:
        return _answered(self._exchange(ops, meters, now_us))

    def _scripting(
        self, script: Any, keys: list[bytes], args: list[bytes], by_sha: bool = True
    ) -> Asking:
        return _answered(script(keys=keys, args=args))

    async def aexecute(self, ops: Sequence[Op | MeterOp], now_us: int) -> list[Any]:
        """:meth:`execute` through the running event loop: each slot's transaction (and
        script call) on a pooled connection of the node the client's slot map names, as
        :meth:`_exchange` sends it; a slot whose node answers ``MOVED`` or ``ASK`` (the
        cluster is resharding) is run by redis-py's client in a thread, which follows the
        redirection and refreshes the map. Without hiredis, all of it in a thread."""
        if hiredis is None:  # pragma: no cover  (in the redis extra)
            return await Backend.aexecute(self, ops, now_us)
        if not self.connected:  # (reads the slot map from a node: in a thread, once)
            await sync_to_async(self._connect, thread_sensitive=False)()
        server = self.server
        if server.dead_until:
            self._check_alive(server)
        windowed = [op for op in ops if isinstance(op, Op)]
        metered = [op for op in ops if isinstance(op, MeterOp)]
        if len(windowed) + len(metered) != len(ops):
            raise TypeError(f"not an operation of this backend: {ops!r}")
        try:
            values, replies = await self._aslots(windowed, metered, now_us)
        except Exception as exc:
            raise self._failed(exc, server) from exc
        if server.dead_until:
            self._succeeded(server)
        w, m = iter(values), iter(replies)
        return [next(w) if isinstance(op, Op) else next(m) for op in ops]

    async def _aslots(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        """Each slot's transaction and script call, then the trims they call for."""
        trims: list[Trim] = []
        values: list[Any] = [None] * len(ops)
        for group in _slots(ops):
            chosen = [ops[i] for i in group]
            for i, v in zip(group, await self._atransaction(chosen, trims), strict=True):
                values[i] = v
        replies: list[Any] = [None] * len(meters)
        for group in _slots(meters):
            chosen_meters = [meters[i] for i in group]
            for i, r in zip(group, await self._ameter(chosen_meters, now_us), strict=True):
                replies[i] = r
        for base, stale in trims:
            await self._aslot(base, self._scripting_call(self.trim_script, [base], [stale]), 1)
        return values, replies

    async def _atransaction(self, chosen: list[Op], trims: list[Trim]) -> list[list[int]]:
        """One slot's transaction (:meth:`_packed`, as a single node's)."""
        chunks, jobs, count = self._packed(chosen)
        key = self._prefix + chosen[0].namespace.encode()
        replies = await self._aslot(key, b"".join(chunks), count + 2)
        if replies is None:  # redirected: redis-py's client follows it
            return await sync_to_async(self._transaction, thread_sensitive=False)(chosen, trims)
        values, stale = self._window_values(jobs, _executed(replies[count + 1], count))
        trims.extend(stale)
        return values

    async def _ameter(self, chosen: list[MeterOp], now_us: int) -> list[MeterReply]:
        """One slot's leaky buckets (lua/meter.lua, loaded by ``EVAL`` when it is missing)."""
        keys, args = self._meter_args(chosen, now_us)
        reply = await self._aslot(keys[0], self._scripting_call(self.meter_script, keys, args), 1)
        if reply is None:
            return await sync_to_async(self._meter, thread_sensitive=False)(chosen, now_us)
        return self._meter_replies(chosen, reply[0])

    def _scripting_call(self, script: Any, keys: list[bytes], args: list[bytes]) -> bytes:
        """EVAL of ``script``: the server lacks it at most once, and loads it (one command
        whatever it holds: no second trip for ``NOSCRIPT``)."""
        return _pack(_script_call(script, keys, args, by_sha=False))

    async def _aslot(self, key: bytes, packed: bytes, count: int) -> list[Any] | None:
        """``packed`` on a pooled connection of the node of ``key``'s slot, its ``count``
        replies (an error raised but a redirection: None)."""
        node = self.client.nodes_manager.get_node_from_slot(key_slot(key))
        pool = self._node_pools.get(node.name)
        if pool is None:
            pool = self._node_pools[node.name] = IdlePool(
                partial(self._node_link, node), IDLE_CONNECTIONS
            )
        link = pool.get()
        try:
            conn = link.conn
            if conn._sock is None:  # connects (and logs in), in a thread
                await sync_to_async(conn.connect, thread_sensitive=False)()
            if link.reader is None:
                link.reader = hiredis.Reader()
            replies = await _aread_many(conn._sock, link.reader, packed, count)
        except BaseException:
            link.close()
            raise
        pool.release(link)
        for reply in replies:
            if isinstance(reply, Exception):
                if str(reply).startswith(("MOVED", "ASK", "EXECABORT", "TRYAGAIN")):
                    return None
                raise reply
        return replies

    def _node_link(self, node: Any) -> _Link:
        pool = node.redis_connection.connection_pool
        conn = pool.connection_class(**pool.connection_kwargs)
        self._connections.add(conn)
        return _Link(conn)

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        self._connect()
        super().delete(namespace, suffixes)

    def _close_client(self) -> None:
        self._node_pools = {}
        if self.connected:
            self.client.close()
