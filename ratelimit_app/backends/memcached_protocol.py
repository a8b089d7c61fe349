"""The memcached protocol as the limiter speaks it: commands built and replies parsed,
bytes in and bytes out, so it is tested without a server (:mod:`.memcached` holds the
nodes, their connections and the failover).

**A check** (:func:`check_command`, :meth:`CheckCommand.parse`) is one write for all the subjects
of a request on one node: per subject, quiet decrements that take back a refused hit
(``ma <key> MD q``: only a miss answers, ``NF``), then increments (``ma <key> N<ttl> J1 v``:
created with the TTL on a miss, answering ``VA`` and the new value), and after all of them
a quiet read of every other bucket the subjects read, marked with its place (``mg <key> v
q O<i>``: a miss answers nothing, a hit ``VA <length> O<i>`` and the count), then ``mn``,
whose ``MN`` ends the one reply to wait for. A bucket a subject writes is read from its
increment's answer: its count with this hit and every hit counted before it (a later hit on
that bucket sees this one in its own answer, so of two concurrent hits the later sees the
earlier, as with a read). memcached answers a connection's commands in order, so the reads
see the increments. The ``VA`` replies prove that each write landed: a bucket is never read
as zero after a failed write. Every request whose checks have the same plans, counts and
costs sends the same command but for its subjects' namespaces (:func:`shape`).
A request of cost ``a`` adds and takes back ``a`` in one command a bucket all the same
(``ma <key> N<ttl> J<a> D<a> v``, ``ma <key> MD D<a> q``).

**A leaky bucket** (:func:`meta_gets`, :func:`meta_set`, :func:`meta_delete`,
:func:`parse_meta`) is compare-and-set with the meta commands: ``mg <key> v c`` reads a TAT
and its CAS id, ``ms <key> C<cas>`` stores only over that item (``ME``: only if there is
none), ``md <key> C<cas>`` deletes only that item. A pipeline of them ends with ``mn``,
whose ``MN`` marks the end of the replies.
"""

from __future__ import annotations

import operator
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ratelimit_app.algorithms.windows import Plan, picker
from ratelimit_app.backends.base import Encoded, Op
from ratelimit_app.exceptions import BackendError

#: memcached reads a TTL over 30 days as a Unix timestamp.
MAX_RELATIVE_TTL = 30 * 86400
#: Amounts (request costs) whose increments a plan's encoding keeps; it starts over when full.
AMOUNT_MEMO = 16
#: The end of a pipeline ended by ``mn``.
MN = b"MN\r\n"

#: The bytes a count's data line may hold: digits and the padding of a decrement.
_COUNT_BYTES = b"0123456789 "
#: The CAS id in the flags of a meta reply (asked for with ``c``).
_CAS = re.compile(rb" c(\d+)")
#: Meta replies that carry no value: stored (``HD``), miss (``EN``), not stored (``NS``),
#: changed since the CAS id was read (``EX``), not found (``NF``).
_NO_VALUE = (b"HD", b"EN", b"NS", b"EX", b"NF")


class ReplyError(BackendError):
    """A reply that does not answer the commands sent: a lost write, a value that is not a
    count or not a TAT, a line that is no reply to them."""


def expiry(ttl: int, clock: Callable[[], float] = time.time) -> int:
    """``ttl`` seconds as memcached reads an expiry: as it is up to 30 days, else as the
    Unix time (of ``clock``) that many seconds from now."""
    return ttl + int(clock()) if ttl > MAX_RELATIVE_TTL else ttl


def _tail(suffix: bytes, ttl: int, amount: int) -> bytes:
    """An ``ma`` increment after its key: raise the bucket by ``amount``, or create it at
    ``amount`` with the TTL ``ttl`` on a miss (``J``: the value it is created with)."""
    if amount == 1:
        return b"%s N%d J1 v\r\n" % (suffix, ttl)
    return b"%s N%d J%d D%d v\r\n" % (suffix, ttl, amount, amount)


class MemcachedEncoded(Encoded):
    """A plan's byte form, plus the tails of its ``ma`` increments (``<suffix> N<ttl> J1
    v``) of each amount sent so far, when every TTL is relative (30 days or less), so a
    check only puts its key in front of each."""

    __slots__ = ("write_tails",)

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        #: The tails by amount (a request's cost); None: an expiry memcached reads as a
        #: time, made per check.
        self.write_tails: dict[int, list[bytes]] | None = {
            1: [_tail(suffix, ttl, 1) for suffix, ttl in self.writes]
        }
        if any(ttl > MAX_RELATIVE_TTL for _, ttl in self.writes):
            self.write_tails = None

    def increments(
        self, base: bytes, clock: Callable[[], float] = time.time, amount: int = 1
    ) -> bytes:
        """The ``ma`` increments by ``amount`` of every write bucket for the key base
        ``base``."""
        memo = self.write_tails
        tails = None if memo is None else memo.get(amount)
        if tails is None:
            tails = [_tail(s, expiry(t, clock), amount) for s, t in self.writes]
            if memo is not None:
                if len(memo) >= AMOUNT_MEMO:  # a cost from a callable may take any value
                    memo.clear()
                memo[amount] = tails
        head = b"ma " + base
        return head + head.join(tails)

    def decrements(self, base: bytes, amount: int = 1) -> bytes:
        """Quiet ``ma`` decrements by ``amount`` of every write bucket (taking back a hit
        this plan counted; memcached stops at 0): only a miss answers, ``NF``."""
        mode = b"MD q" if amount == 1 else b"MD D%d q" % amount
        return b"".join(b"ma %s%s %s\r\n" % (base, s, mode) for s, _ in self.writes)


class CheckCommand:
    """The command of one check (every op's take-backs and increments, then a meta read of
    every other bucket of every op, then ``mn``) and how to read its reply.

    Made by :func:`check_command` for given subjects, or by :func:`shape` for any subjects
    (their namespaces left as slots): every request whose ops have the same plans, counts
    and amounts sends the same command but for its subjects' namespaces (:meth:`sending`),
    so a backend keeps one per shape, never one per subject. Its reply is read by position
    (each read answers in the order asked), so nothing of it depends on the subjects.
    """

    __slots__ = ("args", "command", "increments", "keys", "picks", "pieces", "reusable")

    def __init__(self) -> None:
        #: The bytes to send (without the final line break).
        self.command = b""
        #: Every key read (``mg``), in order.
        self.keys: list[bytes] = []
        #: ``VA`` replies expected for the increments: one per increment.
        self.increments = 0
        #: Each op's values in the order of its plan's reads, picked (in C) from the
        #: increments' answers followed by the reads' values.
        self.picks: list[Callable[[list[int]], Sequence[int]]] = []
        #: False when an expiry is a Unix time (over 30 days): made again per check.
        self.reusable = True
        #: A shape's command in runs, each the pieces one namespace joins (``ns.join``),
        #: and what picks each run's namespace out of the subjects' (None: not a shape).
        self.pieces: tuple[list[str], ...] = ()
        self.args: Callable[[Sequence[str]], Sequence[str]] | None = None

    def sending(self, namespaces: Sequence[str]) -> bytes:
        """A shape's command for the subjects ``namespaces`` (one per op, in order): each
        run's pieces joined by its namespace, in C."""
        args = self.args
        assert args is not None
        return "".join(map(str.join, args(namespaces), self.pieces)).encode()

    def parse(self, reply: bytes) -> list[list[int]]:
        """Every op's values, in the order of its plan's reads. Raises :class:`ReplyError`.

        The reply: the misses of the quiet decrements (``NF``), a ``VA <length>`` line and
        the new value for each increment, in the order sent, then ``VA <length> O<place>``
        and the count of each read that found its bucket (a miss answers nothing: 0), in
        the order asked, and ``MN`` (:func:`_read`). Read by place: a reply short of one
        answer per increment (a lost write, an error line), or with a read's answer out of
        place, is an error, never some bucket's count. A bucket an op writes is read from
        its increment's answer.
        """
        values = _read(reply, self.increments, len(self.keys))
        picks = self.picks
        if len(picks) == 1:  # one subject (a decorator's check, get_usage)
            return [list(picks[0](values))]
        out = []
        for pick in picks:  # a loop, not a comprehension: on every request
            out.append(list(pick(values)))
        return out


def check_command(
    prefix: str,
    ops: Sequence[Op],
    encoded: Callable[[Plan], Any],
    clock: Callable[[], float] = time.time,
) -> CheckCommand:
    """The :class:`CheckCommand` of ``ops`` (one node's subjects), with each op's plan
    encoding ``encoded(plan)`` (a :class:`MemcachedEncoded`) and key base ``prefix`` and its
    namespace."""
    made = CheckCommand()
    writes: list[bytes] = []
    keys = made.keys
    places: list[list[int]] = []  # each op's reads: a key's position, or -1 - an increment's
    for op in ops:
        enc: MemcachedEncoded = encoded(op.plan)
        base = (prefix + op.namespace).encode()
        if op.undo is not None:
            writes.append(encoded(op.undo).decrements(base, op.amount))
        answered: dict[int, int] = {}
        if op.increment and enc.writes:
            writes.append(enc.increments(base, clock, op.amount))
            answered = {i: made.increments + j for i, j in enc.proofs}
            made.increments += len(enc.writes)
            made.reusable = made.reusable and enc.write_tails is not None
        place = []
        for i, suffix in enumerate(enc.reads):
            if i in answered:
                place.append(-1 - answered[i])
            else:
                place.append(len(keys))
                keys.append(base + suffix)
        places.append(place)
    reads = [b"mg %s v q O%d\r\n" % (key, i) for i, key in enumerate(keys)]
    made.command = b"".join(writes) + b"".join(reads) + b"mn"
    made.picks = [
        picker([p + made.increments if p >= 0 else -1 - p for p in place]) for place in places
    ]
    return made


#: What stands for the namespace of op ``i`` in a shape's command while it is made (no key
#: holds a control character), and what finds them.
_SLOT = "\x01%d\x01"
_SLOTS = re.compile("\x01(\\d+)\x01")


def shape(prefix: str, ops: Sequence[Op], encoded: Callable[[Plan], Any]) -> CheckCommand | None:
    """The command of every request whose ops are ``ops`` but for their namespaces: the
    :func:`check_command` of ``ops`` with a slot for each namespace, made into a template
    (:meth:`CheckCommand.sending`). None when an expiry is read as a time (made per
    check)."""
    slotted = [op._replace(namespace=_SLOT % i) for i, op in enumerate(ops)]
    made = check_command(prefix, slotted, encoded)
    if not made.reusable:
        return None
    segments = _SLOTS.split(made.command.decode())  # text, slot, text, slot, ..., text
    ids: list[int] = []
    runs: list[list[str]] = []
    for at in range(1, len(segments), 2):
        i, text = int(segments[at]), segments[at + 1]
        if ids and ids[-1] == i:
            runs[-1].append(text)
        else:  # a new run: its first piece is the text before its first slot
            ids.append(i)
            runs.append([segments[0] if at == 1 else "", text])
    if not runs:  # (no op)
        ids, runs = [0], [[segments[0]]]
    made.pieces = tuple(runs)
    if len(ids) == 1:
        only = ids[0]
        made.args = lambda namespaces: (namespaces[only],)
    else:
        made.args = operator.itemgetter(*ids)
    made.keys = [b""] * len(made.keys)  # (its keys hold slots: only their number counts)
    return made


def _read(reply: bytes, increments: int, reads: int) -> list[int]:
    """The values of a check's reply: each of the ``increments``' answers, then the count
    of each of the ``reads`` (0 for a bucket missing), in order.

    The reply: ``VA <length>`` and the value of each increment, in order, then ``VA <length>
    O<i>`` and the count of each read ``i`` that found its bucket (a miss answers nothing:
    ``q``), in order, and ``MN``. The misses of take-backs (``NF``: their bucket was gone)
    are dropped wherever they stand. Anything short of one answer per increment (a lost
    write, an error line), a read answered out of order or for no read asked, or a value
    that is not a count (anything but digits and the padding a decrement leaves, ``9 ``:
    int() would also take a sign or an underscore), is an error; all checked in C.
    """
    # (find, not ``in``: CPython's ``bytes in bytes`` first tries the left side as an int,
    # and formats a TypeError to learn it is not one, on every reply)
    if reply.find(b"NF") != -1:
        reply = b"\r\n".join([line for line in reply.split(b"\r\n") if line != b"NF"])
    lines = reply.split(b"\r\n")
    heads, data = lines[0:-2:2], lines[1:-2:2]
    found = len(heads) - increments  # reads that found their bucket
    joined = b"\n" + b"\n".join(heads)
    if (
        len(lines) % 2
        or found < 0
        or joined.count(b"\nVA ") != len(heads)
        or joined.count(b" O") != found  # (a read's answer among the increments': one lost)
        or lines[-2] != b"MN"
        or lines[-1]
    ):
        raise ReplyError(f"lost counter writes: {reply[:200]!r}")
    if b"".join(data).translate(None, _COUNT_BYTES):
        raise ReplyError(f"corrupt counter: {reply[:200]!r}")
    try:
        counts = list(map(int, data))
    except ValueError:  # an empty value
        raise ReplyError(f"corrupt counter: {reply[:200]!r}") from None
    if not found:  # nothing there but what was written (a new or quiet subject)
        return counts + [0] * reads if reads else counts
    return _placed(reply, heads[increments:], counts, increments, reads)


def _placed(
    reply: bytes, heads: list[bytes], counts: list[int], increments: int, reads: int
) -> list[int]:
    """The increments' answers, then each read's count in its place (0 where ``heads``,
    the reads that found their bucket, mark none), from ``counts`` in the order of the
    reply. Raises :class:`ReplyError` for a mark out of order or of no read asked."""
    found = len(heads)
    tokens = b" ".join(heads).split(b" ")
    marks = b" ".join(tokens[2::3])
    try:
        if len(tokens) != 3 * found or not marks.startswith(b"O"):
            raise ValueError
        places = list(map(int, marks[1:].split(b" O")))
    except ValueError:
        raise ReplyError(f"lost counter writes: {reply[:200]!r}") from None
    if len(places) == reads and places == list(range(reads)):  # every bucket there
        return counts
    if sorted(set(places)) != places or places[-1] >= reads or places[0] < 0:
        raise ReplyError(f"reads answered out of order: {reply[:200]!r}")
    placed = dict(zip(places, counts[increments:]))
    return counts[:increments] + list(map(placed.get, range(reads), [0] * reads))


def quiet_deletes(base: bytes, suffixes: Iterable[str]) -> bytes:
    """Delete the buckets ``suffixes`` of the key base ``base``, quietly, then ``mn``: the
    reply is ``MN`` alone unless something failed."""
    return b"".join(b"md %s%s q\r\n" % (base, s.encode()) for s in suffixes) + b"mn"


def meta_gets(keys: Iterable[bytes]) -> bytes:
    """Read each key's value and CAS id (``mg <key> v c``)."""
    return b"".join(b"mg %s v c\r\n" % key for key in keys)


def meta_set(
    key: bytes, value: bytes, ttl: int, cas: int | None, clock: Callable[[], float] = time.time
) -> bytes:
    """Store ``value`` for ``ttl`` seconds only over the item with CAS id ``cas`` (None:
    only if there is none), and answer the new CAS id."""
    mode = b"ME" if cas is None else b"C%d" % cas
    return b"ms %s %d T%d %s c\r\n%s\r\n" % (key, len(value), expiry(ttl, clock), mode, value)


def meta_delete(key: bytes, cas: int) -> bytes:
    """Delete the item only if its CAS id is still ``cas``."""
    return b"md %s C%d\r\n" % (key, cas)


def parse_meta(buf: bytes, count: int) -> list[tuple[bytes, bytes]] | None:
    """The replies to ``count`` meta commands and the ``mn`` after them, each as (head
    line, value; ``b""`` when it carries none), or None while ``buf`` holds only part of
    them. Raises :class:`ReplyError` for a line that is no meta reply (``CLIENT_ERROR``...).

    A value is read by its length, never searched for an end marker, so a stored value can
    never cut a reply short.
    """
    pos = 0
    replies: list[tuple[bytes, bytes]] = []
    while True:
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        head = buf[pos:end]
        if head == b"MN" and len(replies) == count:
            return replies
        if head.startswith(b"VA "):
            try:
                size = int(head.split(b" ", 2)[1])
            except ValueError:
                raise ReplyError(f"unexpected memcached reply {head[:80]!r}") from None
            if len(buf) < end + 2 + size + 2:
                return None
            replies.append((head, buf[end + 2 : end + 2 + size]))
            pos = end + 2 + size + 2
        elif head[:2] in _NO_VALUE and len(replies) < count:
            replies.append((head, b""))
            pos = end + 2
        else:
            raise ReplyError(f"unexpected memcached reply {head[:80]!r}")


def found_value(head: bytes, value: bytes) -> bytes | None:
    """What an ``mg`` reply found: its value, or None on a miss. Raises
    :class:`ReplyError` for any other reply."""
    if head.startswith(b"VA"):
        return value
    if head.startswith(b"EN"):
        return None
    raise ReplyError(f"unexpected reply {head[:80]!r}")


def stored(head: bytes) -> bool:
    """Whether an ``ms`` reply stored the value: ``HD`` yes; ``NS``, ``EX`` or ``NF`` no
    (another client changed or removed the item since its CAS id was read). Raises
    :class:`ReplyError` for any other reply."""
    if head.startswith(b"HD"):
        return True
    if head.startswith((b"NS", b"EX", b"NF")):
        return False
    raise ReplyError(f"unexpected reply {head[:80]!r}")


def cas_of(head: bytes) -> int | None:
    """The CAS id a meta reply carries (asked for with the ``c`` flag), if any."""
    found = _CAS.search(head)
    return int(found[1]) if found else None
