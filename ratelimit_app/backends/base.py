"""The counter backend interface and what every backend shares.

A backend runs a :class:`~ratelimit_app.algorithms.windows.Plan` for one subject in one round trip:
increment the plan's write buckets (when counting), then read its buckets, and return the
values in the order of ``plan.reads``. Any failure raises :class:`BackendError`; a backend
never returns zeros it did not read.

Leaky buckets (:mod:`ratelimit_app.algorithms.gcra`) are metered by :meth:`Backend.meter_many`:
read a
subject's TAT, decide, and store the new one only if nothing else changed it meanwhile. The
default implementation, on any Django cache, is atomic within one process only (for
development); memcached and Redis override it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import caches

from ratelimit_app.algorithms import gcra
from ratelimit_app.algorithms.windows import Plan
from ratelimit_app.conf import conf
from ratelimit_app.exceptions import BackendError

logger = logging.getLogger("ratelimit_app")

#: Seconds a connect, a read or a write to memcached or Redis may take before the check fails
#: (fails open or closed): what a dead or slow server adds to a request at most.
SOCKET_TIMEOUT = 0.1
#: Seconds a server that failed is skipped (:meth:`Server.mark_down`), so that each process
#: pays about one timeout per this long for a dead server; also the ``Retry-After`` of the
#: fail-closed answer.
DEAD_RETRY = 5.0
#: Plans whose byte form a backend keeps (:meth:`Backend.encoded`).
ENCODINGS = 1024


class Op(NamedTuple):
    """One subject's part of a round trip: count (``increment``), take back (``undo``: the
    increments of that plan, a refused hit) and read ``plan``'s buckets. An increment and a
    take-back add and subtract ``amount`` (a request's cost) in each write bucket."""

    namespace: str
    plan: Plan
    increment: bool = False
    undo: Plan | None = None
    amount: int = 1


class MeterReply(NamedTuple):
    """What a leaky-bucket op found and did: the TAT it ``read`` (ticks; None: nothing
    stored), the TAT it ``written`` (None: the request was not admitted, or only looked), and
    the backend's ``token`` for taking it back (memcached: the item's CAS id)."""

    read: int | None
    written: int | None = None
    token: Any = None


class MeterOp(NamedTuple):
    """One subject's leaky bucket in a round trip: admit (``increment``) when one more
    request of ``cost`` emissions fits, or only look. With ``take_back`` (the reply of this
    request's admitting op), take that request back instead, if nothing has changed the TAT
    since (else it stays counted: taking back a request another one's TAT depends on could
    be lenient). With ``force`` (a charge after the view: :func:`ratelimit_app.engine.charge`),
    add ``cost`` whether it fits or not."""

    namespace: str
    meter: gcra.Meter
    increment: bool = False
    take_back: MeterReply | None = None
    cost: int = 1
    force: bool = False


#: The default meter's read-decide-write is atomic within a process, not across processes.
_meter_lock = threading.Lock()


class Encoded:
    """A plan's key suffixes as bytes, and where each one sits in ``plan.reads``.

    Plans are memoised and shared by every subject (:mod:`ratelimit_app.algorithms.windows`), so
    their
    byte forms are computed once, and a check's per-request work does not grow with the
    number of buckets it reads.
    """

    __slots__ = ("index", "plan", "proofs", "reads", "write_index", "writes")

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.reads = [s.encode() for s in plan.reads]
        self.writes = [(s.encode(), ttl) for s, ttl in plan.writes]
        self.index = {s: i for i, s in enumerate(self.reads)}
        #: For each write, the position of the same bucket in the reads (or -1).
        self.write_index = [self.index.get(s, -1) for s, _ in self.writes]
        #: (position in the reads, position in the writes) of each written bucket a check
        #: also reads (the current coarse bucket of each rate): what :meth:`merge` compares.
        self.proofs: list[tuple[int, int]] = []
        self.refresh_proofs()

    def refresh_proofs(self) -> None:
        """Derive :attr:`proofs` from :attr:`write_index` (after a backend reorders it)."""
        self.proofs = [(i, j) for j, i in enumerate(self.write_index) if i >= 0]

    def merge(self, values: list[int], written: Sequence[int | bytes | str]) -> None:
        """Raise each written bucket's read value to what its increment returned
        (``written``: one reply per write, in the order of :attr:`writes`).

        The increment's reply proves the write: a read that found less (an eviction, a
        replica) must not make the check more lenient; a read that found more (others' hits
        in between) is kept, so concurrency may refuse a hit that fit, never admit one that
        did not.
        """
        if len(written) != len(self.writes):
            raise ValueError(f"{len(written)} write replies for {len(self.writes)} writes")
        for i, j in self.proofs:
            proof = int(written[j])
            if values[i] < proof:
                values[i] = proof


def cache_settings(alias: str) -> tuple[Any, dict[str, Any]]:
    """The ``LOCATION`` and ``OPTIONS`` of ``settings.CACHES[alias]`` (``""`` and ``{}`` when
    absent), for a backend that talks to the cache's servers itself."""
    config = settings.CACHES[alias]
    return config.get("LOCATION", ""), dict(cast(dict[str, Any], config.get("OPTIONS") or {}))


class Server:
    """A server a backend talks to, and until when it is marked down.

    A server that fails (a refused connection, a timeout, a reply that is no answer) is
    marked down for :data:`DEAD_RETRY` seconds: meanwhile the checks that need it fail
    at once (or, with several memcached servers, their subjects move to the others) instead
    of each waiting for a timeout. The first check after that asks it again. The memcached
    backend has one per node, the Redis backends one for their server or cluster.
    """

    __slots__ = ("dead_until", "name")

    def __init__(self, name: str) -> None:
        #: How errors name it (never a URL: one may hold a password).
        self.name = name
        #: ``time.monotonic()`` until which it is skipped; 0.0 when it is not marked down.
        self.dead_until = 0.0

    def alive(self, now: float) -> bool:
        """Whether it may be asked at ``now`` (``time.monotonic()``)."""
        return self.dead_until <= now

    def mark_down(self) -> None:
        """Skip it for :data:`DEAD_RETRY` seconds from now."""
        self.dead_until = time.monotonic() + DEAD_RETRY


class Backend(ABC):
    """Counts bucket hits for subjects. One instance per cache alias and process, built as
    ``cls(alias, cache)`` by :func:`ratelimit_app.backends.build`.

    A backend implements :meth:`run_many` and :meth:`delete`; it may override
    :meth:`meter_many`, :meth:`exchange`, :meth:`close`, :attr:`inline_ok` and
    :attr:`encoding`. ``docs/backends.rst`` ("Your own backend") states the whole contract
    for third parties; :class:`Server` and :meth:`_check_alive` / :meth:`_failed` /
    :meth:`_succeeded` serve a backend that talks to servers itself.
    """

    #: True when :meth:`execute` does no I/O at all (it counts in this process): the async
    #: path then calls it on the event loop (:meth:`aexecute`).
    inline_ok = False
    #: How this backend encodes a plan (see :meth:`encoded`).
    encoding: type[Encoded] = Encoded

    def __init__(self, alias: str, cache: Any) -> None:
        self.alias = alias
        #: The cache's ``KEY_PREFIX`` and ``VERSION``, as Django's key function writes them.
        self.cache_prefix = str(cache.make_key(""))
        #: ``RATELIMIT_CACHE_PREFIX``.
        self.rl_prefix = conf.CACHE_PREFIX
        #: What every key starts with: a bucket's key is key_prefix + namespace + suffix.
        self.key_prefix = self.cache_prefix + self.rl_prefix
        #: Each plan's byte form, by the plan (a plan hashes by identity, and an entry keeps
        #: its plan alive); at most :data:`ENCODINGS` entries, then it starts over.
        self._encodings: dict[Plan, Encoded] = {}

    @property
    def servers(self) -> Sequence[Server]:
        """The servers it talks to, for the messages that must say which one failed: none
        for a backend that counts in the process or through a Django cache."""
        return ()

    def encoded(self, plan: Plan) -> Encoded:
        """The byte form of ``plan``, kept by the plan (plans are compiled once and shared)."""
        entry = self._encodings.get(plan)
        if entry is None:
            if len(self._encodings) >= ENCODINGS:
                self._encodings.clear()
            entry = self._encodings[plan] = self.encoding(plan)
        return entry

    @abstractmethod
    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        """Run every op (several subjects: the rules of one request) in one round trip where
        the backend can; return each op's values in the order of its ``plan.reads``.

        Each op first takes back its ``undo`` plan's increments, then increments its plan's
        write buckets (when ``increment``), then reads. Raise BackendError on any failure.
        """

    def run(
        self, namespace: str, plan: Plan, increment: bool, undo: Plan | None = None
    ) -> list[int]:
        """:meth:`run_many` for one subject."""
        return self.run_many((Op(namespace, plan, increment, undo),))[0]

    def meter_many(self, ops: Sequence[MeterOp], now_us: int) -> list[MeterReply]:
        """Meter every op's leaky bucket at ``now_us`` (the client's clock, microseconds);
        one reply per op. Raise BackendError on any failure.

        This default runs on any Django cache (``get`` and ``set``), under a process-wide
        lock: exact in one process, racy across processes (for development).
        """
        cache = caches[self.alias]  # Django's cache objects are per thread.
        replies = []
        with _meter_lock:
            for op in ops:
                key = self.rl_prefix + op.namespace + gcra.SUFFIX  # make_key adds prefixes
                try:
                    read = gcra.decode(op.meter, cache.get(key))
                    written = self._meter_decision(op, read, now_us)
                    if op.take_back is not None:
                        if read is not None and read == op.take_back.written:
                            restored = gcra.take_back(op.meter, read, op.cost)
                            ttl = gcra.ttl_seconds(op.meter, restored, now_us)
                            cache.set(key, gcra.encode(op.meter, restored).decode(), ttl)
                    elif written is not None:
                        ttl = gcra.ttl_seconds(op.meter, written, now_us)
                        cache.set(key, gcra.encode(op.meter, written).decode(), ttl)
                except Exception as exc:  # includes a TAT that is not one
                    raise BackendError(f"{self.alias}: {exc}") from exc
                replies.append(MeterReply(read, written))
        return replies

    @staticmethod
    def _meter_decision(op: MeterOp, read: int | None, now_us: int) -> int | None:
        """The TAT ``op`` stores when it read ``read`` (None: it stores nothing)."""
        if op.take_back is not None or not op.increment:
            return None
        if op.force:
            return gcra.charged(op.meter, read, now_us, op.cost)
        if gcra.fits(op.meter, read, now_us, op.cost):
            return gcra.advance(op.meter, read, now_us, op.cost)
        return None

    def execute(self, ops: Sequence[Op | MeterOp], now_us: int) -> list[Any]:
        """Run ``ops`` of every kind in one :meth:`exchange`: one reply per op, in order
        (a window :class:`Op`'s values, a :class:`MeterOp`'s :class:`MeterReply`). The
        engine reaches a backend through this alone; a new kind of op is a branch here and
        its encoding in each backend."""
        windowed = [op for op in ops if isinstance(op, Op)]
        if len(windowed) == len(ops):  # the common case: sliding windows only
            return self.exchange(windowed, [], now_us)[0]
        metered = [op for op in ops if isinstance(op, MeterOp)]
        if len(windowed) + len(metered) != len(ops):
            raise TypeError(f"not an operation of this backend: {ops!r}")
        values, replies = self.exchange(windowed, metered, now_us)
        w, m = iter(values), iter(replies)
        return [next(w) if isinstance(op, Op) else next(m) for op in ops]

    async def aexecute(self, ops: Sequence[Op | MeterOp], now_us: int) -> list[Any]:
        """:meth:`execute` for the async path (:func:`ratelimit_app.engine.trips.arun`),
        never blocking the event loop: called on the loop when it does no I/O
        (:attr:`inline_ok`), else in a thread of the loop's executor. memcached and Redis
        override it with native asyncio connections."""
        if self.inline_ok:
            return self.execute(ops, now_us)
        return await sync_to_async(self.execute, thread_sensitive=False)(ops, now_us)

    def exchange(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        """:meth:`run_many` and :meth:`meter_many` (the rules of a request of both
        algorithms) in as few round trips as the backend can: here one call each."""
        return (
            self.run_many(ops) if ops else [],
            self.meter_many(meters, now_us) if meters else [],
        )

    @abstractmethod
    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        """Forget the given buckets of a subject."""

    def close(self) -> None:  # noqa: B027  (optional hook: most backends hold nothing)
        """Release connections (settings changed, or the process is forking)."""

    # -- servers marked down (see Server) ----------------------------------------------------

    def _check_alive(self, server: Server) -> None:
        """Raise BackendError at once while ``server`` is marked down."""
        if server.dead_until and time.monotonic() < server.dead_until:
            raise BackendError(f"{self.alias}: {server.name} marked down, retrying later")

    def _failed(self, exc: BaseException, server: Server | None) -> BackendError:
        """``exc`` logged, as the BackendError to raise; ``server`` (None: a failure of the
        data, not of a server) is marked down."""
        where = ""
        if server is not None:
            server.mark_down()
            where = f" ({server.name})"
        logger.warning("ratelimit: backend %r%s failed: %s", self.alias, where, exc)
        return BackendError(f"{self.alias}: {exc}")

    def _succeeded(self, server: Server) -> None:
        """``server`` answered: no longer marked down."""
        if server.dead_until:
            server.dead_until = 0.0


#: What gives the sans-IO logic its replies: each thing it asks for (a Trip, an exchange)
#: turned into the reply it is sent, synchronously or awaited.
Ask = TypeVar("Ask")
Answer = TypeVar("Answer")


def drive(
    asking: Generator[Ask, Any, Answer],
    call: Callable[[Ask], Any],
    catch: type[BaseException] | tuple[type[BaseException], ...] = BackendError,
) -> Answer:
    """Run ``asking``, a generator of what it needs done (the engine's round trips, a
    backend's exchanges), on this thread: each thing it yields is ``call``-ed and the reply
    sent back, or the exception of ``catch`` raised, thrown into it; its return value."""
    send = asking.send
    try:
        ask = send(None)
        while True:
            try:
                reply = call(ask)
            except catch as exc:
                ask = asking.throw(exc)
            else:
                ask = send(reply)
    except StopIteration as stop:
        return stop.value


async def adrive(
    asking: Generator[Ask, Any, Answer],
    call: Callable[[Ask], Awaitable[Any]],
    catch: type[BaseException] | tuple[type[BaseException], ...] = BackendError,
) -> Answer:
    """:func:`drive` on the event loop: each reply awaited (``call`` is async)."""
    send = asking.send
    try:
        ask = send(None)
        while True:
            try:
                reply = await call(ask)
            except catch as exc:
                ask = asking.throw(exc)
            else:
                ask = send(reply)
    except StopIteration as stop:
        return stop.value


class IdlePool:
    """A server's idle connections, shared by the threads of a process (memcached's
    clients, Redis's connections): as pymemcache's pool (``get``, ``release``,
    ``destroy``, ``get_and_release``, ``clear``) but without its lock and bookkeeping:
    ``list.pop`` and ``list.append`` are atomic, so taking a connection and giving it back
    costs two list operations on every check. At most ``max_idle`` are kept; a thread that
    finds none opens one (pymemcache's pool raises instead when that many are in use).

    A forked child forgets the idle connections it inherited (gunicorn ``--preload`` after
    a check in the parent): sharing a socket with its parent, it could read the parent's
    replies as its own.
    """

    __slots__ = ("__weakref__", "create", "idle", "max_idle")

    def __init__(self, create: Callable[[], Any], max_idle: int) -> None:
        self.create, self.max_idle = create, max_idle
        self.idle: list[Any] = []
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(
                after_in_child=functools.partial(_forget_inherited, weakref.ref(self))
            )

    def get(self) -> Any:
        try:
            return self.idle.pop()
        except IndexError:
            return self.create()

    def release(self, client: Any) -> None:
        if len(self.idle) < self.max_idle:
            self.idle.append(client)
        else:
            client.close()

    @staticmethod
    def destroy(client: Any) -> None:
        client.close()

    @contextlib.contextmanager
    def get_and_release(self, destroy_on_fail: bool = False) -> Iterator[Any]:
        client = self.get()
        try:
            yield client
        except Exception:
            if destroy_on_fail:
                self.destroy(client)
            else:
                self.release(client)
            raise
        self.release(client)

    def clear(self) -> None:
        while True:
            try:
                client = self.idle.pop()
            except IndexError:
                return
            client.close()


def _forget_inherited(ref: weakref.ref[IdlePool]) -> None:
    # In the child: drop (without closing: the parent still talks on them) what it inherited.
    pool = ref()
    if pool is not None:
        pool.idle = []
