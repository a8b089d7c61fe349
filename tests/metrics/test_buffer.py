"""The in-process buffer: validation, threads, the bound, fork safety. No database."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pytest
from django.test.utils import override_settings

import metrics_app
from metrics_app import buffer
from metrics_app.buffer import aggregator, flusher
from metrics_app.signals import buffer_full
from metrics_app.testing import FrozenClock


def buffered() -> dict[tuple[str, int], int]:
    return buffer.current().aggregator.live_counts()


def test_record_counts_by_event_minute(clock: FrozenClock) -> None:
    metrics_app.record("a")
    metrics_app.record("a", 2)
    metrics_app.record("a", at=datetime(2024, 1, 1, 0, 0, 59, tzinfo=UTC))
    metrics_app.record("b", at=clock.t - 61)
    minute = int(clock.t // 60)
    assert buffered() == {
        ("a", minute): 3,
        ("a", int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() // 60)): 1,
        ("b", minute - 2): 1,
    }


@pytest.mark.parametrize("name", ["", "x" * 201, None, b"bytes"])
def test_bad_names_raise_naming_the_limit(name: Any) -> None:
    with pytest.raises(ValueError, match="1 to 200 characters"):
        metrics_app.record(name)


def test_name_of_200_characters_is_fine() -> None:
    metrics_app.record("x" * 200)
    assert len(buffered()) == 1


def test_bad_count_and_naive_datetime() -> None:
    with pytest.raises(ValueError, match="non-negative int"):
        metrics_app.record("a", -1)
    with pytest.raises(ValueError, match="up to 2\\*\\*48"):
        metrics_app.record("a", 2**48 + 1)
    with pytest.raises(ValueError, match="aware"):
        metrics_app.record("a", at=datetime(2024, 1, 1))


def test_record_is_thread_safe(clock: FrozenClock) -> None:
    def work() -> None:
        for _ in range(20_000):
            metrics_app.record("hot")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(buffered().values()) == 160_000


def test_bound_drops_new_keys_loudly(
    clock: FrozenClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        sent.append(kwargs)

    buffer_full.connect(receiver)
    monkeypatch.setattr(aggregator, "MAX_BUFFERED_KEYS", 3)
    try:
        for i in range(5):
            metrics_app.record(f"s{i}")
        metrics_app.record("s0", 10)  # existing keys still count at the bound
    finally:
        buffer_full.disconnect(receiver)
    counts = buffered()
    assert sorted(name for name, _ in counts) == ["s0", "s1", "s2"]
    assert counts["s0", int(clock.t // 60)] == 11
    assert buffer.stats()["dropped_events"] == 2
    assert len(sent) == 1  # once per flush interval, not per call
    assert sent[0]["name"] == "s3"
    assert (sent[0]["bound"], sent[0]["max_keys"]) == ("MAX_BUFFERED_KEYS", 3)


def test_drops_are_logged_once_a_flush_naming_each_bound(
    clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A flood of drops at both bounds is one ERROR line, at the flush, not one per drop
    or per bound; the next flush says nothing more unless more was dropped."""
    held = aggregator.Aggregator(max_keys=0, max_client_keys=0)
    flush = flusher.Flusher(held)
    with caplog.at_level("ERROR", logger="metrics_app"):
        for i in range(1_000):
            held.add(f"page:{i}", 1, 2, client_chosen=True)
            held.add(f"code:{i}", 1, 1)
        assert caplog.records == []  # nothing yet: the flush says it
        assert flush.flush() == 0
        flush.flush()
    assert len(caplog.records) == 1
    line = caplog.records[0].getMessage()
    assert "dropped 3,000 events in 2,000 new (series, minute) keys" in line
    assert "MAX_CLIENT_KEYS=0 met, e.g. 'page:0'" in line
    assert "MAX_BUFFERED_KEYS=0 met, e.g. 'code:0'" in line
    assert held.stats()["dropped_events"] == 0


@pytest.mark.parametrize("client_chosen", [False, True], ids=["code", "client"])
def test_the_default_bound_holds_a_flush_interval_of_a_crowd(client_chosen: bool) -> None:
    """100,000 series in a flush interval that straddles a minute's end (200,000 keys),
    while the batch before is still being written: nothing is dropped at the default
    bounds, short URLs (client-chosen) or names the code chose, and a key costs under 200
    bytes (the bound's 60 MB at most)."""
    import gc
    import tracemalloc

    held = aggregator.Aggregator()
    minute = 29_000_000
    for i in range(100_000):  # the batch being written when the next interval begins
        held.add(f"shorturl:{i:x}", int(str(minute - 1)), 1, client_chosen)
    held.seal()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for at in (minute, minute + 1):  # every series on both sides of the minute's end
            for i in range(100_000):
                held.add(f"shorturl:{i:x}", int(str(at)), 1, client_chosen)
        size = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    stats = held.stats()
    assert stats["dropped_events"] == 0
    assert stats["buffered_keys"] == 300_000 and len(held.live_counts()) == 200_000
    assert size / 200_000 < 200
    for i in range(50_000):  # the names the code chooses fill the rest, and no more
        held.add(f"code:{i}", minute, 1)
    held.add("code:one-more", minute, 1)
    assert held.stats()["dropped_events"] == 1 and held.stats()["buffered_keys"] == 350_000


def test_forked_child_starts_empty_and_parent_keeps_its_counts() -> None:
    metrics_app.record("before-fork", 5)
    parent_id = buffer.current().aggregator.process_id
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (child)
        try:
            ok = buffered() == {} and buffer.current().aggregator.process_id != parent_id
            metrics_app.record("child")
            ok = ok and list(buffered()) == [("child", next(iter(buffered()))[1])]
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    os.close(read)
    assert status == 0
    assert sum(buffered().values()) == 5


def test_flusher_thread_starts_lazily_on_first_record() -> None:
    with mock.patch.object(flusher, "FLUSH_INTERVAL", 3600):
        buffer.reset()
        assert buffer.current().flusher.thread is None
        metrics_app.record("a")
        thread = buffer.current().flusher.thread
        assert thread is not None
        assert thread.daemon
        assert thread.is_alive()
    buffer.reset()
    assert not thread.is_alive()


@contextmanager
def redis_buffer_down() -> Iterator[None]:
    """``METRICS_BUFFER = "redis:buffer"`` on a port where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "buffer": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{port}/0",
        },
    }
    with override_settings(CACHES=dead, METRICS_BUFFER="redis:buffer"):
        yield


def test_redis_buffer_down_drops_the_count_not_the_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = buffer.stats()["dropped_events"]
    with redis_buffer_down():
        metrics_app.record("shorturl:abc", 3)  # no exception: a view counting visits stays up
        metrics_app.record("shorturl:abc")
    assert buffer.stats()["dropped_events"] == before + 4
    assert caplog.text.count("the Redis buffer failed") == 1  # logged once, not per call


def test_reset_starts_a_buffer_as_fresh_as_a_forked_childs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """reset() and a fork make the same new buffer: nothing of the old one carries over.

    Here, the once-a-minute limit on logging Redis failures: a buffer that has just logged
    one must not silence the first failure of the next test's buffer.
    """
    with redis_buffer_down():
        metrics_app.record("shorturl:abc")
        buffer.reset()
        metrics_app.record("shorturl:abc")
    assert caplog.text.count("the Redis buffer failed") == 2


@pytest.mark.django_db
def test_a_count_no_database_can_hold_is_refused_and_later_batches_still_flush(
    clock: FrozenClock,
) -> None:
    """A count past 64 bits would fail its batch on every flush, and batches are written
    oldest first: refused when recorded, it never reaches a batch."""
    with pytest.raises(ValueError, match="count"):
        metrics_app.record("huge", 2**63)
    metrics_app.record("huge", 2**48)
    metrics_app.record("after", 3)
    metrics_app.flush()
    assert metrics_app.query.total("huge") == 2**48
    assert metrics_app.query.total("after") == 3
