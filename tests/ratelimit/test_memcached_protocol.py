"""memcached at the protocol level: what the limiter leaves on the server, read back raw.

memcached keeps a value's length when a decrement drops a digit: ``10`` decremented is
stored as ``"9 "``, ``100`` as ``"99 "`` (``decr`` and meta arithmetic ``ma ... MD`` alike;
the ``ma`` reply itself carries the bare number). The limiter takes a refused hit back with a
quiet decrement, so a bucket that stood at 10 when a hit was refused holds ``"9 "`` from
then on, and every later check reads that value through its meta read (``mg <key> v``).

A check's reads are answered in the order asked, each a count or a miss (``EN``, read as 0)
(:meth:`CheckCommand.parse <ratelimit_app.backends.memcached_protocol.CheckCommand.parse>`):
**flat** when every bucket the request reads is there, **sparse** when some are missing.
Both are driven here through ``check_many`` on a real memcached, with the raw reply shown to
hold the padding, and the limiter's counts, limits and admissions checked after it. (Before
a fix, a parser took ``"9 "`` for a corrupt counter: every check of the subject raised until
the bucket expired, so its rule failed open, switched off by the client's own refused hit,
or closed, 429s nobody earned.)

Also here: the ``NF`` of a take-back whose bucket is gone, wherever it stands in a round
trip's replies, and a leaky bucket's TAT, which is never padded (it is stored whole, with
``ms``, never changed by arithmetic).
"""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import RequestFactory, override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_app import ALL
from ratelimit_app.algorithms import gcra, windows
from ratelimit_app.algorithms.gcra import LEAKY_BUCKET
from ratelimit_app.algorithms.rates import parse
from ratelimit_app.backends import get_backend, memcached, memcached_protocol, reset_backends
from ratelimit_app.backends.base import Op
from ratelimit_app.core import get_usage, scope
from ratelimit_app.engine import Check, Result, check_many
from ratelimit_app.identity.keys import namespace
from ratelimit_app.testing import frozen_clock

#: A minute boundary: with 60 fine buckets a window, fine buckets are seconds and coarse
#: buckets ten seconds.
T0 = 1_800_000_000.0
#: The last checks: three seconds into a coarse bucket, so the window's old edge is a coarse
#: bucket minus the fine buckets before the window (buckets read only to be subtracted).
T_FINAL = T0 + 3.5
LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
#: ``RATELIMIT_CACHE_PREFIX`` in this module (not the default), and the cache's own prefix
#: (``KEY_PREFIX`` "" and ``VERSION`` 1). Keys read back raw are built from these literals,
#: never from the backend's idea of its prefix, so a prefix the backend ignored fails here.
PREFIX = "rl-raw:"
CACHE_PREFIX = ":1:"


@pytest.fixture(autouse=True)
def custom_prefix(module_prefix: None) -> None:
    """This module's counters under :data:`PREFIX`."""


@pytest.fixture
def on_memcached(memcached_server: str) -> Iterator[str]:
    config = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": memcached_server,
    }
    with override_settings(CACHES={"default": LOCMEM, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        try:
            yield memcached_server
        finally:
            reset_backends()


def raw_get(address: str, keys: list[str]) -> dict[str, bytes]:
    """``get`` of ``keys`` on a socket of our own: each key found and its value, as stored."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"get " + " ".join(keys).encode() + b"\r\n")
        reply = b""
        while not reply.endswith(b"END\r\n"):
            chunk = sock.recv(65536)
            assert chunk, f"memcached closed the connection: {reply!r}"
            reply += chunk
    found = {}
    lines = reply.split(b"\r\n")
    i = 0
    while lines[i] != b"END":
        _, key, _, length = lines[i].split(b" ")
        assert len(lines[i + 1]) == int(length)
        found[key.decode()] = lines[i + 1]
        i += 2
    return found


def server_key(ns: str, suffix: str) -> str:
    return CACHE_PREFIX + PREFIX + ns + suffix


def one_hit_in_every_bucket_read(final: windows.Plan, now: float) -> list[float]:
    """Times of earlier hits, one in each bucket that ``final`` reads and that ``now`` is not
    in, so that a check with ``final`` finds every bucket it reads (the flat parser)."""
    c = windows.coarse_factor(60)
    times = []
    for suffix in final.reads:
        level, _, index = suffix.rpartition(":")
        size = c if level.endswith(f"x{c}") else 1  # in seconds: a minute's 60 buckets
        start = int(index) * size
        if start <= now < start + size:
            continue  # the current bucket: the last checks write it
        # The newest second of the bucket: inside the window even for the coarse bucket at
        # its old edge.
        times.append(start + size - 0.5)
    return sorted(times)


@pytest.mark.parametrize("parser", ["sparse", "flat"])
def test_a_hit_taken_back_across_a_digit_is_read_as_a_count(
    on_memcached: str, parser: str
) -> None:
    """Two rules of one request, a strict one (subject A) and a loose one (subject B). At
    ``T_FINAL`` nine requests are admitted, the tenth is refused by the strict rule and taken
    back from both (the middleware's blocking rules do so): both current buckets go from 10
    to 9 and are stored as ``"9 "``. Then the strict rule still limits (it does not fail
    open) and the loose one still admits (it does not fail closed)."""
    probe = windows.plan(parse("1/m"), T_FINAL)  # every rate of a minute reads these buckets
    earlier = one_hit_in_every_bucket_read(probe, T_FINAL) if parser == "flat" else []
    # Earlier hits inside the window of the last checks (the rest are read to be subtracted).
    in_window = sum(1 for t in earlier if math.floor(t) >= math.floor(T_FINAL) - 60)
    strict = parse(f"{in_window + 9}/m")  # the 10th hit at T_FINAL is one too many
    loose = parse(f"{in_window + 20}/m")
    a = Check(scope("padded-a", ALL, strict), ("ip", "192.0.2.1"), strict, True)
    b = Check(scope("padded-b", ALL, loose), ("ip", "192.0.2.2"), loose, True)

    def request(*checks: Check) -> list[Result]:
        return check_many(checks, take_back=everything)

    with frozen_clock(T0) as clock:
        for t in earlier:
            clock.set(t)
            assert [r.limited for r in request(a, b)] == [False, False]
        clock.set(T_FINAL)
        for _ in range(9):
            assert [r.limited for r in request(a, b)] == [False, False]
        refused = request(a, b)
        assert [r.limited for r in refused] == [True, False]
        assert refused[0].usages[0].count == in_window + 10

        plan = windows.plan(strict, T_FINAL)
        (fine, _), (coarse, _) = plan.writes
        assert plan.reads == probe.reads
        # A check reads the current coarse bucket whole (no earlier hit is in it), the fine
        # one only in the detail read of a refusal.
        assert coarse in plan.reads and fine not in plan.reads
        ns_a, ns_b = (namespace(c.scope, *c.subject) for c in (a, b))
        stored = raw_get(on_memcached, [server_key(ns, fine) for ns in (ns_a, ns_b)])
        # What memcached stores after taking 10 back to 9: the padding the parser must read.
        assert list(stored.values()) == [b"9 ", b"9 "]
        found = raw_get(on_memcached, [server_key(ns_a, s) for s in plan.reads])
        if parser == "flat":
            assert len(found) == len(plan.reads)  # every bucket there: the flat parser
        else:
            assert len(found) < len(plan.reads)  # misses: the sparse parser
        assert server_key(ns_a, coarse) in found

        # The strict rule reads its padded buckets: full, so limited (not an error, which
        # would fail open), and the reads hold 9 where the take-back left "9 ".
        assert raw_get(on_memcached, [server_key(ns_a, coarse)]) == {
            server_key(ns_a, coarse): b"9 "
        }
        values = get_backend().run(ns_a, plan, False)
        assert values[plan.reads.index(coarse)] == 9
        (look,) = check_many([a._replace(increment=False)])
        usage = look.usages[0]
        assert (usage.count, usage.remaining, usage.limited) == (in_window + 9, 0, True)
        assert usage.retry_after > 0
        (again,) = request(a)
        assert again.limited and again.usages[0].count == in_window + 10
        assert raw_get(on_memcached, [server_key(ns_a, fine)]) == {server_key(ns_a, fine): b"9 "}

        # The loose rule reads its padded bucket and admits (not an error, which would
        # fail closed: a 429 nobody earned), and the increment of "9 " is 10.
        (admitted,) = request(b)
        usage = admitted.usages[0]
        assert (usage.count, usage.remaining, usage.limited) == (in_window + 10, 10, False)
        assert raw_get(on_memcached, [server_key(ns_b, fine)]) == {server_key(ns_b, fine): b"10"}


@pytest.mark.parametrize("fail_open", [True, False], ids=["fail-open", "fail-closed"])
def test_get_usage_reads_a_padded_count_whichever_way_it_fails(
    on_memcached: str, fail_open: bool
) -> None:
    """The symptom as a view sees it: after a refused hit taken back across a digit, the
    next ``get_usage`` reports the count, not the failure (``None`` when failing open, the
    failure dict, ``limit`` 0, when failing closed)."""
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.3")
    group = f"padded-usage-{fail_open}"

    def usage(increment: bool) -> Any:
        return get_usage(
            request, group=group, key="ip", rate="9/m", increment=increment, fail_open=fail_open
        )

    with frozen_clock(T_FINAL):
        assert [usage(True)["should_limit"] for _ in range(10)] == [False] * 9 + [True]
        ns = namespace(scope(group, ALL, parse("9/m")), "ip", "192.0.2.3")
        fine = windows.plan(parse("9/m"), T_FINAL).writes[0][0]
        assert raw_get(on_memcached, [server_key(ns, fine)]) == {server_key(ns, fine): b"9 "}
        looked = usage(False)
        assert looked is not None
        assert (looked["count"], looked["limit"], looked["should_limit"]) == (9, 9, True)
        counted = usage(True)
        assert (counted["count"], counted["limit"], counted["should_limit"]) == (10, 9, True)


def test_a_cost_taken_back_across_a_digit_is_read_as_a_count(on_memcached: str) -> None:
    """``12 - 5`` is stored ``"7 "`` (the value keeps its length); a take-back beyond the
    count stops at ``"0 "``; both read as counts, and are raised again."""
    backend = get_backend()
    plan = windows.plan(parse("20/m"), T_FINAL)
    ns = namespace("padded-cost", "ip", "192.0.2.9")
    (fine, _), _coarse = plan.writes
    backend.run_many([Op(ns, plan, True, amount=12)])
    backend.run_many([Op(ns, plan, False, undo=plan, amount=5)])
    assert raw_get(on_memcached, [server_key(ns, fine)]) == {server_key(ns, fine): b"7 "}
    assert windows.evaluate(plan, backend.run(ns, plan, False), T_FINAL)[0].count == 7
    backend.run_many([Op(ns, plan, False, undo=plan, amount=30)])
    assert raw_get(on_memcached, [server_key(ns, fine)]) == {server_key(ns, fine): b"0 "}
    values = backend.run_many([Op(ns, plan, True, amount=3)])[0]
    assert windows.evaluate(plan, values, T_FINAL)[0].count == 3


def test_a_take_back_that_misses_after_a_counting_subject(on_memcached: str) -> None:
    """A take-back whose bucket is gone (memcached answers ``NF``) sent after another
    subject's increments in one round trip: the ``NF`` sits among the ``VA`` replies, and
    the increments are still read as written (not as lost writes)."""
    backend = get_backend()
    plan = windows.plan(parse("5/m"), T_FINAL)
    counting, gone = namespace("nf-a", "ip", "192.0.2.4"), namespace("nf-b", "ip", "192.0.2.5")
    values = backend.run_many([Op(counting, plan, True), Op(gone, plan, False, undo=plan)])
    counts = [windows.evaluate(plan, v, T_FINAL)[0].count for v in values]
    assert counts == [1, 0]
    assert windows.evaluate(plan, backend.run(counting, plan, False), T_FINAL)[0].count == 1


def test_a_leaky_bucket_tat_is_never_padded(on_memcached: str) -> None:
    """A TAT is stored whole (``ms``), when admitted and when taken back, never changed by
    arithmetic, so :func:`ratelimit_app.algorithms.gcra.decode` (digits only) needs no change.

    At 11 a minute a TAT's remainder in ticks goes 5, 10, ...: the take-back of a second
    request (refused by another rule) stores ``...:5`` over ``...:10``, a shorter value, with
    no padding."""
    bucket, never = parse("11/m"), parse("0/m")
    meter = Check(scope("tat-meter", ALL, bucket), ("ip", "192.0.2.6"), bucket, True, LEAKY_BUCKET)
    other = Check(scope("tat-never", ALL, never), ("ip", "192.0.2.6"), never, True)
    m = gcra.meter(bucket)
    now_ticks = m.ticks(gcra.micros(T_FINAL))
    key = server_key(namespace(meter.scope, *meter.subject), gcra.SUFFIX)
    with frozen_clock(T_FINAL):
        assert not check_many([meter])[0].limited
        stored = raw_get(on_memcached, [key])[key]
        assert stored == gcra.encode(m, now_ticks + m.interval) and stored.endswith(b":5")
        both = check_many([meter, other], take_back=everything)
        assert [r.limited for r in both] == [False, True]
        assert both[0].meter is not None
        assert gcra.encode(m, both[0].meter.tat or 0).endswith(b":10")  # then taken back
        assert raw_get(on_memcached, [key])[key] == stored
        assert re.fullmatch(rb"\d+:\d+", stored)
        (look,) = check_many([meter._replace(increment=False)])
        assert look.usages[0].count == 1


def everything(checks: Any, results: Any) -> set[int]:
    """Take back every hit of a request one of its rules refused (blocking rules)."""
    return set(range(len(checks))) if any(r.limited for r in results) else set()


# -- Without a server: the commands and replies of ratelimit_app.backends.memcached_protocol --
#
# The replies below are written out as memcached sends them (the tests above read the same
# shapes from a real server); these pin the parsing of every shape, including the ones a
# live server makes only at a boundary (a padded count, a take-back's NF between two
# subjects' increments, a reply cut by the network).

P = memcached_protocol
BASE_A, BASE_B = b"p:{a}", b"p:{a}x"  # one key base the prefix of the other's


def encoded(plan: windows.Plan) -> P.MemcachedEncoded:
    return P.MemcachedEncoded(plan)


def values_of(ops: list[Op], found: dict[bytes, bytes], writes: bytes = b"") -> list[list[int]]:
    """The values of ``ops`` (key bases ``p:`` and their namespaces) from the reply of
    ``writes`` (the increments' and take-backs' replies) and reads that find ``found``."""
    made = P.check_command("p:", ops, encoded)
    return made.parse(writes + reads_reply(made, found))


def reads_reply(made: P.CheckCommand, found: dict[bytes, bytes]) -> bytes:
    """The replies of a check's reads, in the order asked (``VA``, the read's mark and the
    data line, as stored, for a key in ``found``; nothing for any other), then ``MN``."""
    replies = [
        b"VA %d O%d\r\n%s\r\n" % (len(data), i, data)
        for i, key in enumerate(made.keys)
        if (data := found.get(key)) is not None
    ]
    return b"".join(replies) + b"MN\r\n"


def va(*values: int) -> bytes:
    """The replies of ``ma ... v`` increments that answered ``values``."""
    return b"".join(b"VA %d\r\n%d\r\n" % (len(b"%d" % v), v) for v in values)


def test_a_check_is_take_backs_and_increments_then_the_reads() -> None:
    plan = windows.plan(parse("5/m;100/h"), T0)
    ops = [Op("{a}", plan, True), Op("{b}", plan, False, undo=plan)]
    made = P.check_command("p:", ops, encoded)
    *writes_and_reads, end = made.command.split(b"\r\n")
    increments = [b"ma p:{a}%s N%d J1 v" % (s.encode(), t) for s, t in plan.writes]
    decrements = [b"ma p:{b}%s MD q" % s.encode() for s, _ in plan.writes]
    # A bucket {a} writes is read from its increment's answer, not asked for again.
    written = {s for s, _ in plan.writes}
    assert written & set(plan.reads)
    keys = [b"p:{a}" + s.encode() for s in plan.reads if s not in written] + [
        b"p:{b}" + s.encode() for s in plan.reads
    ]
    reads = [b"mg %s v q O%d" % (key, i) for i, key in enumerate(keys)]
    assert writes_and_reads == increments + decrements + reads
    assert end == b"mn"
    assert made.keys == keys
    assert made.increments == len(plan.writes) and made.reusable


def test_a_cost_is_the_amount_of_each_increment_and_take_back() -> None:
    """A request of cost 5: each bucket is created at 5 (``J5``) or raised by 5 (``D5``),
    and taken back by 5 (``MD D5``), one command a bucket as for a cost of 1."""
    plan = windows.plan(parse("50/m;100/h"), T0)
    ops = [Op("{a}", plan, True, amount=5), Op("{b}", plan, False, undo=plan, amount=5)]
    lines = P.check_command("p:", ops, encoded).command.split(b"\r\n")
    increments = [b"ma p:{a}%s N%d J5 D5 v" % (s.encode(), t) for s, t in plan.writes]
    decrements = [b"ma p:{b}%s MD D5 q" % s.encode() for s, _ in plan.writes]
    assert [line for line in lines if line.startswith(b"ma ")] == increments + decrements
    far = windows.plan(parse("5/45d"), T0)  # made per check: the expiry is a time
    made = P.check_command("p:", [Op("{a}", far, True, amount=3)], encoded, lambda: T0)
    suffix, ttl = far.writes[0]
    assert made.command.startswith(b"ma p:{a}%s N%d J3 D3 v" % (suffix.encode(), T0 + ttl))


def test_the_increments_of_each_amount_are_kept_and_start_over_when_full() -> None:
    """A cost from a callable may take any value: the tails kept per amount are bounded."""
    enc = encoded(windows.plan(parse("50/m"), T0))
    for amount in range(1, 3 * P.AMOUNT_MEMO):
        made = enc.increments(b"k", amount=amount)
        assert made.count(b" J%d " % amount) == len(enc.writes)
        assert enc.write_tails is not None and len(enc.write_tails) <= P.AMOUNT_MEMO
    assert enc.increments(b"k", amount=1) == encoded(enc.plan).increments(b"k")


def test_a_written_bucket_reads_its_increment_s_answer() -> None:
    """Each bucket an op writes and reads is read from its own increment's answer (in the
    order of the writes), every other one from the ``get``, each in its place of the
    plan's reads."""
    plan = windows.plan(parse("5/m;100/h"), T0)
    enc = encoded(plan)
    answers = list(range(101, 101 + len(enc.writes)))
    stored = {BASE_A + s: b"%d" % (i + 1) for i, s in enumerate(enc.reads)}
    stored = {k: v for k, v in stored.items() if k[len(BASE_A) :] not in dict(enc.writes)}
    (values,) = values_of([Op("{a}", plan, True)], stored, va(*answers))
    for i, j in enc.proofs:
        assert values[i] == answers[j]
    others = [i for i in range(len(enc.reads)) if i not in dict(enc.proofs)]
    assert [values[i] for i in others] == [i + 1 for i in others]


def test_an_op_that_reads_only_what_it_writes_sends_no_read() -> None:
    """A counter read back from its own increment (the rules' change marker): nothing is
    read besides, and the reply is the increment's answer and ``MN``."""
    plan = windows.Plan(writes=((":g", 60),), reads=(":g",), rates=())
    made = P.check_command("p:", [Op("{a}", plan, True)], encoded)
    assert made.command == b"ma p:{a}:g N60 J1 v\r\nmn"
    assert made.parse(va(7) + b"MN\r\n") == [[7]]


def test_an_expiry_over_30_days_is_sent_as_a_unix_time() -> None:
    plan = windows.plan(parse("5/45d"), T0)
    assert all(ttl > P.MAX_RELATIVE_TTL for _, ttl in plan.writes)
    made = P.check_command("p:", [Op("{a}", plan, True)], encoded, clock=lambda: T0)
    assert not made.reusable  # made again per check, from its clock
    lines = [line for line in made.command.split(b"\r\n") if line.startswith(b"ma ")]
    sent = [int(line.split(b" N")[1].split()[0]) for line in lines]
    assert sent == [int(T0) + ttl for _, ttl in plan.writes]
    assert P.expiry(60, clock=lambda: T0) == 60
    assert P.expiry(P.MAX_RELATIVE_TTL, clock=lambda: T0) == P.MAX_RELATIVE_TTL
    assert P.expiry(P.MAX_RELATIVE_TTL + 1, clock=lambda: T0) == int(T0) + P.MAX_RELATIVE_TTL + 1


def test_a_backend_keeps_a_command_per_shape_never_per_subject(
    on_memcached: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check command is kept per shape (the ops' plans, counts and amounts), with slots for
    the namespaces: a thousand subjects leave one entry, and each sends byte for byte the
    command made anew for it. One with an expiry read as a time is made per check, from the
    clock of that check; the memo starts over when full."""
    backend: Any = get_backend()
    plan, far = windows.plan(parse("5/m;100/h"), T0), windows.plan(parse("5/45d"), T0)
    for i in range(1000):
        ops = [Op(f"{{a{i}}}", plan, True), Op(f"{{b{i}}}", plan, False, undo=plan)]
        backend.run_many(ops)
    assert len(backend._shapes) == 1
    (kept,) = backend._shapes.values()
    made = P.check_command(backend.key_prefix, ops, backend.encoded)
    assert kept.sending([op.namespace for op in ops]) == made.command
    backend.run_many([Op("{c}", far, True)])
    assert list(backend._shapes.values())[-1] is None  # made per check: its shape says so
    monkeypatch.setattr(memcached, "SHAPE_MEMO", 1)
    backend.run_many([Op("{d}", plan, True)])
    assert len(backend._shapes) == 1  # full: started over


def test_a_shape_keeps_a_percent_sign_of_its_prefix_and_the_order_of_its_subjects() -> None:
    """The template is filled in by ``%``: a prefix holding one is sent as it is, and each
    namespace lands in its own op's keys."""
    plan = windows.plan(parse("5/m;100/h"), T0)
    ops = [Op("{a}", plan, True), Op("{b}", plan, True, amount=2), Op("{c}", plan, False)]
    kept = P.shape("p%s:", ops, encoded)
    assert kept is not None
    other = [op._replace(namespace=ns) for op, ns in zip(ops, ["{x}", "{y}", "{z}"], strict=True)]
    sent = kept.sending(["{x}", "{y}", "{z}"])
    again = P.check_command("p%s:", other, encoded)
    assert sent == again.command
    counts = {b"p%s:{z}" + s.encode(): b"%d" % (i + 1) for i, s in enumerate(plan.reads)}
    answers = va(*range(1, 1 + 2 * len(plan.writes)))
    parsed = kept.parse(answers + reads_reply(again, counts))
    assert parsed == again.parse(answers + reads_reply(again, counts))
    assert parsed[2] == list(range(1, len(plan.reads) + 1))  # {z} looks: reads each bucket


def test_a_backend_keeps_the_command_of_each_cost_apart(on_memcached: str) -> None:
    """The memo is keyed by the ops' shapes, amounts included: requests of two costs on
    the same buckets never send each other's command."""
    backend: Any = get_backend()
    plan = windows.plan(parse("50/m"), T0)
    ns = namespace("kept-costs", "ip", "192.0.2.8")
    one, three = (Op(ns, plan, True, amount=a) for a in (1, 3))
    assert [sum(backend.run_many([op])[0]) for op in (one, three, one, three)] == [1, 4, 5, 8]
    kept = [backend._shapes[(op[1:],)].sending([ns]) for op in (one, three)]
    assert kept == [
        P.check_command(backend.key_prefix, [op], encoded).command for op in (one, three)
    ]
    assert kept[0] != kept[1]


@pytest.mark.parametrize("every_bucket", [True, False], ids=["flat", "sparse"])
def test_a_padded_count_is_a_count(every_bucket: bool) -> None:
    plan = windows.plan(parse("5/m"), T0)
    enc = encoded(plan)
    stored = {BASE_A + s: b"1" for s in enc.reads} if every_bucket else {}
    stored[BASE_A + enc.reads[0]] = b"9 "
    stored[BASE_A + enc.reads[-1]] = b"99 "
    (values,) = values_of([Op("{a}", plan)], stored)
    assert values[0] == 9 and values[-1] == 99
    assert sum(values) == 9 + 99 + (len(values) - 2 if every_bucket else 0)


@pytest.mark.parametrize("every_bucket", [True, False], ids=["flat", "sparse"])
@pytest.mark.parametrize("data", [b"-1", b"1_0", b"x", b"+5", b"1 1"])
def test_a_value_that_is_no_count_is_an_error(every_bucket: bool, data: bytes) -> None:
    plan = windows.plan(parse("5/m"), T0)
    enc = encoded(plan)
    stored = {BASE_A + s: b"1" for s in enc.reads} if every_bucket else {}
    stored[BASE_A + enc.reads[1]] = data
    with pytest.raises(P.ReplyError, match="corrupt counter"):
        values_of([Op("{a}", plan)], stored)


def test_a_missing_increment_reply_is_a_lost_write() -> None:
    plan = windows.plan(parse("5/m"), T0)
    enc = encoded(plan)
    op = Op("{a}", plan, True)
    made = P.check_command("p:", [op], encoded)
    answered = [1] * len(enc.writes)
    assert made.parse(va(*answered) + reads_reply(made, {}))
    for reply in (
        va(*answered[1:]) + reads_reply(made, {}),  # one increment did not answer
        # ... and a read's answer stands where its answer would be
        va(*answered[1:]) + reads_reply(made, {BASE_A + enc.reads[-1]: b"1"}),
        b"NS\r\n" + va(*answered[1:]) + reads_reply(made, {}),  # one did not store
        b"SERVER_ERROR out of memory\r\n" + reads_reply(made, {}),
    ):
        with pytest.raises(P.ReplyError, match="lost counter writes"):
            made.parse(reply)


def test_an_increment_reply_raises_a_read_that_found_less() -> None:
    """The ``VA`` reply proves the write; a read that missed the bucket (evicted in between)
    reads what the increment answered, never less."""
    plan = windows.plan(parse("5/m"), T0)
    enc = encoded(plan)
    (i, _), *_ = enc.proofs
    answered = [3] * len(enc.writes)
    (values,) = values_of([Op("{a}", plan, True)], {}, va(*answered))
    assert values[i] == 3 and sum(values) == 3 * len(enc.proofs)


def test_a_take_backs_miss_wherever_it_stands() -> None:
    """``NF`` answers a quiet decrement whose bucket is gone: before, between or after
    the increments of other subjects, alone or several in a row, it shifts none of their
    replies."""
    plan = windows.plan(parse("5/m"), T0)
    enc = encoded(plan)
    ops = [Op("{a}", plan, True), Op("{a}x", plan, False, undo=plan)]
    n = len(enc.writes)
    for replies in (
        b"NF\r\n" + va(*[2] * n),
        b"NF\r\n" * 3 + va(*[2] * n),
        va(*[2] * n) + b"NF\r\n" * n,
        va(2) + b"NF\r\n" + va(*[2] * (n - 1)),
    ):
        a, b = values_of(ops, {}, replies)
        assert sum(a) == 2 * len(enc.proofs) and sum(b) == 0


def test_subjects_whose_bases_share_a_prefix_read_each_their_own() -> None:
    plan = windows.plan(parse("5/m;100/h"), T0)
    enc = encoded(plan)
    stored = {
        BASE_A + enc.reads[0]: b"1",
        BASE_B + enc.reads[0]: b"7",
        BASE_B + enc.reads[-1]: b"5",
    }
    a, b = values_of([Op("{a}", plan), Op("{a}x", plan)], stored)
    assert (a[0], sum(a)) == (1, 1)
    assert (b[0], b[-1], sum(b)) == (7, 5, 12)


def test_a_run_of_misses_reads_zero_each() -> None:
    """Misses (which answer nothing) in a row, at the start, between hits and before ``MN``:
    each reads 0 in its own place, and the hits around them keep theirs."""
    plan = windows.plan(parse("5/m;100/h"), T0)
    enc = encoded(plan)
    made = P.check_command("p:", [Op("{a}", plan)], encoded)
    for hits in ({0}, {len(enc.reads) - 1}, {0, 3, 4}, set(), set(range(len(enc.reads)))):
        stored = {BASE_A + s: b"%d" % (i + 1) for i, s in enumerate(enc.reads) if i in hits}
        (values,) = made.parse(reads_reply(made, stored))
        assert values == [i + 1 if i in hits else 0 for i in range(len(enc.reads))]


@pytest.mark.parametrize(
    "change", ["one-more", "no-such-read", "out-of-order", "twice", "error-line", "no-mn"]
)
def test_a_reply_out_of_step_is_an_error(change: str) -> None:
    """A reply with an answer more than the check asked for, a read's answer for a read
    not asked or out of order (a connection out of step with its commands), or an error
    line in place of an answer, is refused, never read as some bucket's count."""
    plan = windows.plan(parse("5/m;100/h"), T0)
    enc = encoded(plan)
    made = P.check_command("p:", [Op("{a}", plan)], encoded)
    hit = b"VA 1 O0\r\n2\r\n"
    reply = reads_reply(made, {BASE_A + enc.reads[0]: b"2"})
    assert reply == hit + P.MN
    reply = {
        "one-more": b"VA 1\r\n3\r\n" + reply,
        "no-such-read": b"VA 1 O%d\r\n2\r\n" % len(enc.reads) + P.MN,
        "out-of-order": b"VA 1 O3\r\n2\r\n" + hit + P.MN,
        "twice": hit + hit + P.MN,
        "error-line": b"CLIENT_ERROR bad command line format\r\n" + P.MN,
        "no-mn": hit + b"EN\r\n",
    }[change]
    with pytest.raises(P.ReplyError):
        made.parse(reply)


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 10**6), min_size=2, max_size=2),
    increments=st.lists(st.booleans(), min_size=2, max_size=2),
    there=st.lists(st.sampled_from(["every", "some", "none"]), min_size=2, max_size=2),
    pads=st.integers(0, 2),
    data=st.data(),
)
def test_every_reply_shape_reads_what_was_stored(
    counts: list[int],
    increments: list[bool],
    there: list[str],
    pads: int,
    data: st.DataObject,
) -> None:
    """Two subjects (one key base the prefix of the other), counting or looking, with every
    bucket there, some or none, counts padded or not: each op reads exactly what is stored,
    and a bucket it writes what its increment answered."""
    plan = windows.plan(parse("5/m;100/h"), T0)
    enc = encoded(plan)
    stored: dict[bytes, bytes] = {}
    expected = []
    writes = b""
    for base, count, increment, which in zip(
        (BASE_A, BASE_B), counts, increments, there, strict=True
    ):
        values = []
        answered = data.draw(st.integers(1, 10**6))
        proofs = dict(enc.proofs) if increment else {}
        for i, suffix in enumerate(enc.reads):
            if i in proofs:  # not asked for: its increment answers
                values.append(answered)
                continue
            found = which == "every" or (which == "some" and data.draw(st.booleans()))
            if found:
                stored[base + suffix] = b"%d" % count + b" " * pads
            values.append(count if found else 0)
        if increment:
            writes += va(*[answered] * len(enc.writes))
        expected.append(values)
    ops = [Op("{a}", plan, increments[0]), Op("{a}x", plan, increments[1])]
    assert values_of(ops, stored, writes) == expected


# -- meta commands: leaky buckets --


def test_meta_commands() -> None:
    assert P.meta_gets([b"k1", b"k2"]) == b"mg k1 v c\r\nmg k2 v c\r\n"
    assert P.meta_set(b"k", b"12:3", 5, None) == b"ms k 4 T5 ME c\r\n12:3\r\n"
    assert P.meta_set(b"k", b"12:3", 5, 77) == b"ms k 4 T5 C77 c\r\n12:3\r\n"
    far = P.MAX_RELATIVE_TTL + 1
    assert P.meta_set(b"k", b"1:0", far, 7, clock=lambda: T0) == (
        b"ms k 3 T%d C7 c\r\n1:0\r\n" % (int(T0) + far)
    )
    assert P.meta_delete(b"k", 77) == b"md k C77\r\n"
    assert P.quiet_deletes(b"p:{a}", [":1", ":2"]) == b"md p:{a}:1 q\r\nmd p:{a}:2 q\r\nmn"


def test_meta_replies() -> None:
    assert P.cas_of(b"VA 4 c123") == 123 and P.cas_of(b"HD c9") == 9 and P.cas_of(b"EN") is None
    assert P.found_value(b"VA 4 c1", b"12:3") == b"12:3"
    assert P.found_value(b"EN", b"") is None
    assert [P.stored(h) for h in (b"HD c5", b"NS", b"EX", b"NF")] == [True, False, False, False]
    for head in (b"CLIENT_ERROR bad command line format", b"SERVER_ERROR out of memory"):
        with pytest.raises(P.ReplyError, match="unexpected reply"):
            P.found_value(head, b"")
        with pytest.raises(P.ReplyError, match="unexpected reply"):
            P.stored(head)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=1, max_size=4),
    cut=st.integers(0, 10**6),
)
def test_meta_replies_are_read_by_length(values: list[bytes | None], cut: int) -> None:
    """A value is read by its length, so one that holds ``\\r\\nMN\\r\\n`` cannot end the
    reply early, and a reply cut anywhere (the network delivers it in pieces) is incomplete,
    never wrong."""
    values = [v if v is None else v + b"\r\nMN\r\n" for v in values]
    reply = b"".join(
        b"EN\r\n" if v is None else b"VA %d c1\r\n%s\r\n" % (len(v), v) for v in values
    )
    reply += b"MN\r\n"
    expected = [(b"EN", b"") if v is None else (b"VA %d c1" % len(v), v) for v in values]
    assert P.parse_meta(reply, len(values)) == expected
    assert P.parse_meta(reply[: cut % len(reply)], len(values)) is None


def test_a_line_that_is_no_meta_reply_is_an_error() -> None:
    for reply, count in (
        (b"CLIENT_ERROR bad data chunk\r\nMN\r\n", 1),
        (b"MN\r\n", 1),  # the end before the one reply
        (b"HD\r\nHD\r\nMN\r\n", 1),  # a reply too many
        (b"VA x\r\n", 1),
    ):
        with pytest.raises(P.ReplyError, match="unexpected memcached reply"):
            P.parse_meta(reply, count)
