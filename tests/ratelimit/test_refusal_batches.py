"""Due refusals are confirmed in batches: a botnet costs a few looks per cap, not one per
subject (ratelimit_app.engine.refusals.recall.recall_many,
ratelimit_app.engine.refusals.memory.Memory.soon)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from ratelimit_app.algorithms import windows
from ratelimit_app.backends import get_backend
from ratelimit_app.engine.refusals import memory as refusals
from ratelimit_app.engine.refusals import remembered as memory
from ratelimit_app.engine.refusals.recall import LOOK_BATCH
from ratelimit_app.identity.keys import namespace
from ratelimit_app.operators.operations import target
from ratelimit_app.testing import frozen_clock
from tests.ratelimit.conftest import RoundTrips, rules

T0 = 1_800_000_000.0
#: The refusal memory's cap in these tests (the constant is 5 s).
CAP = 2.0

pytestmark = pytest.mark.usefixtures("rules_site")


@pytest.fixture(autouse=True)
def short_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "REFUSAL_MEMORY", CAP)


RULE = {"name": "botnet", "path": "/rules/named/", "key": "ip", "rate": "1/h"}


def refuse(client: Client, addresses: list[str], again: bool = True) -> None:
    """Each address: admitted once, then refused (a counted check: remembered), and with
    ``again`` refused once more from memory (a botnet's subjects come back within the cap:
    their refusals are hot, and a look confirms them together)."""
    for ip in addresses:
        assert client.get("/rules/named/", REMOTE_ADDR=ip).status_code == 200
        assert client.get("/rules/named/", REMOTE_ADDR=ip).status_code == 429
    for ip in addresses if again else ():
        assert client.get("/rules/named/", REMOTE_ADDR=ip).status_code == 429


def look_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of checks of each round trip of the backend in force, from now on."""
    sizes: list[int] = []
    backend = get_backend()
    execute = backend.execute

    def sizing(ops: Any, now_us: int) -> Any:
        sizes.append(len(ops))
        return execute(ops, now_us)

    monkeypatch.setattr(backend, "execute", sizing)
    return sizes


def statuses(client: Client, addresses: list[str]) -> list[int]:
    return [client.get("/rules/named/", REMOTE_ADDR=ip).status_code for ip in addresses]


def test_one_look_confirms_every_due_refusal(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Client()
    addresses = [f"198.51.100.{i}" for i in range(1, 41)]  # locmem keeps 300 keys
    with rules(RULE), frozen_clock(T0) as clock:
        refuse(client, addresses)
        clock.advance(CAP + 1)  # every cap has run out; no wait has
        trips = RoundTrips(monkeypatch)
        assert statuses(client, addresses) == [429] * len(addresses)
        # The first request's look confirmed all forty, writing nothing.
        assert (trips.count, trips.writing) == (1, 0)
        clock.advance(CAP / 2)
        assert statuses(client, addresses) == [429] * len(addresses)
        assert trips.count == 1  # remembered again for a whole cap from the look


def test_refusals_due_soon_join_the_look(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Client()
    early = [f"198.51.100.{i}" for i in range(1, 11)]
    late = [f"198.51.100.{i}" for i in range(11, 21)]
    with rules(RULE), frozen_clock(T0) as clock:
        refuse(client, early)
        clock.advance(0.6 * CAP)
        refuse(client, late)  # their caps run out 0.6 cap later
        clock.advance(0.6 * CAP)  # the early ones are due; the late ones within half a cap
        trips = RoundTrips(monkeypatch)
        assert statuses(client, early) == [429] * len(early)
        assert trips.count == 1
        clock.advance(0.7 * CAP)  # the late ones' first caps have run out (0.1 cap ago)
        assert statuses(client, late) == [429] * len(late)
        assert trips.count == 1  # confirmed by the early ones' look, with a new cap


def test_a_look_forgets_a_batched_refusal_that_has_room(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subject reset behind this process's back (another process's reset) is forgotten
    by the look another subject's due refusal makes, and then counted and admitted."""
    client = Client()
    first, second = "198.51.100.1", "198.51.100.2"
    with rules(RULE), frozen_clock(T0) as clock:
        refuse(client, [first, second])
        found = target("botnet", second)
        assert found is not None
        get_backend().delete(
            namespace(found.scope, "ip", second),
            sorted(windows.stored_suffixes(found.rates, clock(), 60)),
        )
        clock.advance(CAP + 1)
        trips = RoundTrips(monkeypatch)
        assert statuses(client, [first]) == [429]  # its look also looked at the second
        assert trips.count == 1
        assert statuses(client, [second]) == [200]  # forgotten: counted, and admitted
        assert (trips.count, trips.writing) == (2, 1)


def test_soon_lists_the_refusals_due_before_the_horizon_soonest_first() -> None:
    memory: refusals.Memory[str] = refusals.Memory()
    memory.remember("due", 0, 5, "D", ends=100)  # the cap ran out at 5
    memory.remember("soon", 3, 8, "S", ends=100)
    memory.remember("later", 6, 11, "L", ends=100)
    memory.remember("ending", 0, 5, "E", ends=6)  # its wait ends before the look
    memory.remember("mine", 0, 5, "M", ends=100)
    memory.remember("cold", 0, 5, "C", ends=100)  # never answered from memory: not hot
    for key, at in (("due", 4), ("soon", 4), ("later", 6), ("ending", 4), ("mine", 4)):
        assert memory.recall(key, at) is not None
    found = memory.soon(6, 3, 10, besides=["mine"])
    assert found == [("due", 6, 94, "D"), ("soon", 3, 94, "S")]
    assert memory.soon(6, 3, 1) == [("due", 6, 94, "D")]
    assert memory.soon(6, 3, 0) == []


def test_a_look_is_bounded(backend_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most LOOK_BATCH checks a look (a memcached multi-get, a Redis transaction)."""
    with rules(RULE), frozen_clock(T0) as clock:
        monkeypatch.setattr("ratelimit_app.engine.refusals.recall.LOOK_BATCH", 7)
        client = Client()
        addresses = [f"198.51.100.{i}" for i in range(1, 21)]
        refuse(client, addresses)
        clock.advance(CAP + 1)
        sizes = look_sizes(monkeypatch)
        assert statuses(client, addresses) == [429] * len(addresses)
    assert sizes == [7, 7, 6]
    assert LOOK_BATCH == 256


def test_a_refusal_remembered_again_is_listed_once_at_its_new_time() -> None:
    """The due index drops what is stale: a refusal remembered again (cold until answered
    from memory again), forgotten, or whose subject's entry was pushed out."""
    memory: refusals.Memory[str] = refusals.Memory(size=3)
    memory.remember("a", 0, 5, "A", ends=100)
    memory.remember("b", 0, 5, "B", ends=100)
    assert memory.recall("a", 1) and memory.recall("b", 1)
    memory.remember("a", 2, 7, "A2", ends=100)  # confirmed again: cold
    assert memory.soon(6, 3, 10) == [("b", 6, 94, "B")]
    assert memory.recall("a", 3)  # hot again, at its new time
    memory.forget(["b"])
    assert memory.soon(6, 3, 10) == [("a", 4, 94, "A2")]
    for key in ("c", "d", "e"):  # "a" is the least recently used: pushed out
        memory.remember(key, 6, 11, key.upper(), ends=100)
    assert "a" not in memory.entries
    assert memory.soon(6, 3, 10) == []


def test_the_due_index_stays_bounded_by_the_memory() -> None:
    """Refusals remembered again and again leave stale items in the due index; it is made
    again from the memory before it holds more than twice the memory (and 1,024)."""
    memory: refusals.Memory[int] = refusals.Memory(size=100)
    for n in range(20_000):
        key = n % 100
        memory.remember(key, n, n + 5, n, ends=n + 1_000)
        assert memory.recall(key, n + 1) is not None
        assert len(memory._due) <= 2 * len(memory.entries) + 1024 + 1
    assert len(memory.soon(20_010, 0, 1_000)) == 100  # every one due, listed once


def test_a_crowd_that_comes_back_after_the_cap_is_looked_at_one_by_one(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Subjects refused once and back only after the cap (a crowd of one-off addresses)
    are cold: each due refusal is confirmed by a look at its own subject (one round trip
    that writes nothing, where a counted check of a refused subject makes two), never with
    a batch of other cold subjects that may not come back."""
    client = Client()
    addresses = [f"198.51.100.{i}" for i in range(1, 21)]
    with rules(RULE), frozen_clock(T0) as clock:
        refuse(client, addresses, again=False)
        clock.advance(CAP + 1)
        sizes = look_sizes(monkeypatch)
        trips = RoundTrips(monkeypatch)
        assert statuses(client, addresses) == [429] * len(addresses)
        assert (trips.count, trips.writing) == (len(addresses), 0)
    assert sizes == [1] * len(addresses)
