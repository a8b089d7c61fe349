"""``manage.py metrics_flush`` says what it flushed, and when it matters.

With the memory buffer each process flushes its own counts, so the command's "Flushed 0"
after a web process had flushed read as "nothing was recorded". It now says that the web
processes' counts reach the database within 10 seconds without it, and that
it matters with the Redis buffer, which it drains (tested on a real Redis).
"""

from __future__ import annotations

from io import StringIO
from unittest import mock

import pytest
from django.core.management import call_command
from django.test.utils import override_settings

import metrics_app
from metrics_app import query
from metrics_app.buffer import flusher
from metrics_app.buffer import shared as redis_buffer
from metrics_app.testing import FrozenClock

pytestmark = pytest.mark.django_db


def flush_command(**options: int) -> list[str]:
    out = StringIO()
    call_command("metrics_flush", stdout=out, **options)
    return out.getvalue().splitlines()


def test_with_the_memory_buffer_it_says_the_processes_flush_their_own() -> None:
    with mock.patch.object(flusher, "FLUSH_INTERVAL", 10.0):  # outside manual_flush()
        summary, why = flush_command()
    assert summary == "Flushed 0 (series, minute) keys."
    assert "Only this command's own buffer" in why
    assert "flushes its own buffer every 10 seconds and when it exits" in why
    assert "within 10 seconds without this command" in why
    assert 'matters with the Redis buffer (METRICS_BUFFER = "redis")' in why
    (_, why) = flush_command()  # under manual_flush(), as the tests run
    assert "until it calls metrics_app.flush() or exits" in why
    assert flush_command(verbosity=0) == ["Flushed 0 (series, minute) keys."]


def test_with_the_redis_buffer_it_drains_what_every_process_shares(
    redis_server: str, clock: FrozenClock
) -> None:
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server}}
    with (
        override_settings(CACHES=caches, METRICS_BUFFER="redis"),
        mock.patch.object(redis_buffer, "REDIS_KEY", "metrics:flush-command"),
    ):
        metrics_app.record("flush:a", 2)  # HINCRBY: what any process records is in Redis
        metrics_app.record("flush:b", 3)
        summary, why = flush_command()
        assert summary == "Flushed 2 (series, minute) keys."
        assert "From the Redis buffer every process shares" in why
        assert flush_command()[0] == "Flushed 0 (series, minute) keys."
    assert (query.total("flush:a"), query.total("flush:b")) == (2, 3)
