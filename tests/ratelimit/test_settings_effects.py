"""Settings tested for what they do, not only for their system checks: the keys the counters
land under, listed off the real servers (memcached's ``lru_crawler metadump all``, Redis's
``SCAN``) for the memcached backend, the Redis backend and the generic Django-cache backend
(Django's own ``RedisCache``). Expected keys are built from the settings' literal values,
never from what the backend says its prefix is, so a setting the code ignored fails here.

Also here: the PostgreSQL leg of ``make test`` (``pytest -m db_matrix --db=postgres``) runs a
meaningful number of tests, so losing the markers cannot turn it green with nothing run.
"""

from __future__ import annotations

import hashlib
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import unquote

import pytest
import redis
from django.test import override_settings

from ratelimit_app.algorithms import windows
from ratelimit_app.algorithms.gcra import LEAKY_BUCKET
from ratelimit_app.algorithms.rates import parse
from ratelimit_app.backends import reset_backends
from ratelimit_app.conf import conf
from ratelimit_app.identity.keys import namespace
from tests.ratelimit.checking import check

ROOT = Path(__file__).resolve().parents[2]

#: The cache's own ``KEY_PREFIX``: Django's key function writes it, then ``:<VERSION>:``.
KEY_PREFIX = "site7"
#: ``RATELIMIT_CACHE_PREFIX`` in these tests (the default is ``"rl:"``).
PREFIX = "tenant-b:"
#: What every counter key must start with: docs/backends.rst, the key of a counter is the
#: cache's ``KEY_PREFIX`` and ``VERSION``, then ``RATELIMIT_CACHE_PREFIX``.
EXPECTED = f"{KEY_PREFIX}:1:{PREFIX}"
#: Redis databases of these tests on the session's server, cleared before each test.
REDIS_DB = {"redis": 9, "django-cache": 10}
LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}


def memcached_command(address: str, command: bytes) -> bytes:
    """One command on a socket of our own; the reply up to ``END`` (or ``OK``)."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(command + b"\r\n")
        reply = b""
        while not reply.endswith((b"END\r\n", b"OK\r\n")) and b"ERROR" not in reply:
            chunk = sock.recv(65536)
            assert chunk, f"memcached closed the connection: {reply[-200:]!r}"
            reply += chunk
    return reply


def memcached_keys(address: str) -> list[str]:
    """Every live key on the server (``lru_crawler metadump all``; keys are URL-encoded)."""
    for _ in range(50):
        reply = memcached_command(address, b"lru_crawler metadump all")
        if not reply.startswith(b"BUSY"):  # another crawl still running: ask again
            break
        time.sleep(0.1)
    assert not reply.startswith((b"BUSY", b"ERROR", b"CLIENT_ERROR")), reply[:200]
    return [unquote(k.decode()) for k in re.findall(rb"^key=(\S+)", reply, re.MULTILINE)]


class Counters:
    """One backend on its real server: its ``CACHES`` entry, and the keys on the server."""

    def __init__(self, kind: str, config: dict[str, Any], list_keys: Callable[[], list[str]]):
        self.kind = kind
        self.config = config
        self.list_keys = list_keys


@pytest.fixture(params=["memcached", "redis", "django-cache"])
def counters(request: pytest.FixtureRequest) -> Iterator[Counters]:
    """The counters on an empty server (memcached flushed, a Redis database of their own)."""
    kind: str = request.param
    if kind == "memcached":
        address: str = request.getfixturevalue("memcached_server")
        backend = "django.core.cache.backends.memcached.PyMemcacheCache"
        config = {"BACKEND": backend, "LOCATION": address, "KEY_PREFIX": KEY_PREFIX}
        memcached_command(address, b"flush_all")
        found = Counters(kind, config, lambda: memcached_keys(address))
    else:
        url = request.getfixturevalue("redis_server").rsplit("/", 1)[0] + f"/{REDIS_DB[kind]}"
        # django-redis's cache takes the fast path; Django's own, the generic cache calls.
        if kind == "redis":
            backend = "django_redis.cache.RedisCache"
        else:
            backend = "django.core.cache.backends.redis.RedisCache"
        config = {"BACKEND": backend, "LOCATION": url, "KEY_PREFIX": KEY_PREFIX}
        client = redis.Redis.from_url(url)
        client.flushdb()
        found = Counters(kind, config, lambda: [k.decode() for k in client.scan_iter(count=1000)])
    with override_settings(CACHES={"default": LOCMEM, "rl": config}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        try:
            yield found
        finally:
            reset_backends()
    if kind != "memcached":
        client.flushdb()
        client.close()


def every_kind_of_write(group: str, subject: tuple[str, str]) -> None:
    """What writes counters for one subject: sliding windows of three lengths counted past
    the limit (refused hits taken back, their waits read from the fine buckets), a look, the
    hierarchical layout, and a leaky bucket."""
    rates = parse("3/m;10/h;100/d")
    refused = [check(group, subject, rates, True).limited for _ in range(5)]
    assert refused == [False, False, False, True, True]
    assert check(group, subject, rates, False).limited
    with mock.patch.object(windows, "HIERARCHICAL", True):
        check(group + ":h", subject, parse("3/m;10/h"), True)
    for _ in range(3):
        check(group + ":gcra", subject, parse("2/m"), True, LEAKY_BUCKET)


def expected_namespace(
    algorithm: Callable[[bytes], Any], group: str, kind: str, value: str
) -> str:
    """A subject's namespace, hashed here with ``algorithm`` (docs/settings.rst,
    RATELIMIT_HASH_ALGORITHM: the first 32 hexadecimal digits of the hash of salt, scope, key
    kind and value)."""
    raw = f"{conf.SALT}\x00{group}\x00{kind}\x00{value}".encode()
    return "{" + algorithm(raw).hexdigest()[:32] + "}"


def test_every_key_a_backend_writes_starts_with_the_cache_prefix(
    counters: Counters, group: str
) -> None:
    subject = ("ip", "192.0.2.31")
    with override_settings(RATELIMIT_CACHE_PREFIX=PREFIX):
        every_kind_of_write(group, subject)
        ns = namespace(group, *subject)
    keys = counters.list_keys()
    assert keys, "nothing written: the test proves nothing"
    wrong = [k for k in keys if not k.startswith(EXPECTED)]
    assert not wrong, f"keys without {EXPECTED!r}: {wrong[:5]}"
    # The subject's own windows, under the prefix then its namespace.
    assert any(k.startswith(EXPECTED + ns + ":") for k in keys), keys[:5]
    # Every kind of write: the three window lengths, the hierarchical levels, the TAT.
    scopes = {namespace(g, *subject) for g in (group, group + ":h", group + ":gcra")}
    assert {s for s in scopes if any(k.startswith(EXPECTED + s) for k in keys)} == scopes


@pytest.mark.parametrize(
    "algorithm", ["hashlib.blake2b", hashlib.md5], ids=["dotted-path", "constructor"]
)
def test_the_hash_algorithm_makes_the_keys_the_counters_land_under(
    counters: Counters, group: str, algorithm: Any
) -> None:
    subject = ("ip", "192.0.2.32")
    hasher = hashlib.blake2b if algorithm == "hashlib.blake2b" else hashlib.md5
    mine = expected_namespace(hasher, group, *subject)
    default = expected_namespace(hashlib.sha256, group, *subject)
    assert mine != default
    assert namespace(group, *subject) == default
    with override_settings(RATELIMIT_HASH_ALGORITHM=algorithm):
        assert namespace(group, *subject) == mine
        rates = parse("3/m;10/h")
        assert [check(group, subject, rates, True).limited for _ in range(4)] == [
            False,
            False,
            False,
            True,
        ]
    keys = counters.list_keys()
    assert keys, "nothing written: the test proves nothing"
    # Every counter of the subject, and only under the namespace the setting hashed.
    assert all(k.startswith(f"{KEY_PREFIX}:1:rl:{mine}:") for k in keys), keys[:5]
    assert not [k for k in keys if default in k]
    # The setting names the keys: back on the default, the subject starts from zero.
    assert check(group, subject, rates, True).usages[0].count == 1


# -- the PostgreSQL leg of make test -----------------------------------------------------------

#: The fewest tests ``-m db_matrix`` may select: about half of those that carry the marker
#: today (107), far over zero.
FEWEST_DB_MATRIX = 50
#: The options of that leg in the Makefile (``pytest-postgres``).
POSTGRES_LEG = ("-m", "db_matrix", "--db=postgres")


def test_the_postgres_leg_selects_a_meaningful_number_of_tests() -> None:
    """``make test`` runs ``pytest -m db_matrix --db=postgres``. Collected alone, with the
    same marker expression: if the markers were lost, this leg would select nothing (pytest's
    exit 5), and the database matrix would be green with nothing run."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *POSTGRES_LEG],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    selected = [line for line in run.stdout.splitlines() if "::" in line]
    files = {line.split("::", 1)[0] for line in selected}
    assert len(selected) >= FEWEST_DB_MATRIX, run.stdout[-2000:]
    # The metrics tables' tests among them: the flushes, downsampling and queries.
    assert any(f.startswith("tests/metrics/") for f in files), files
