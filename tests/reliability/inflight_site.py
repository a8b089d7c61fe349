"""A site for the in-flight test (``test_in_flight_processes``): settings, URLs and views in
one module, served by gunicorn as ``django.core.wsgi:get_wsgi_application()``.

``/slow/`` sleeps :data:`SLOW` seconds behind a rule of :data:`CONCURRENT` requests in flight
per ``X-Subject`` header; it records who is inside in Redis (:class:`Recorder`), so the count
of requests running at once is exact across processes. ``/stream/`` streams for seconds, one
at a time per subject, with a lease far longer than the test. No database: the rules come
from settings alone.

* ``RELIABILITY_COUNTERS``: ``memcached`` (``MEMCACHED_SERVERS``) or ``redis``
  (``RELIABILITY_REDIS``), where the limiter keeps its counters;
* ``INFLIGHT_RECORD``: the Redis URL of the record, ``INFLIGHT_RUN`` the prefix of its keys.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections.abc import Iterator
from typing import NamedTuple

import redis
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import path

from tests.reliability.common import counter_caches

#: The rule: at most this many requests of one subject at once, each place held at most
#: ``LEASE`` seconds by a worker that never gives it back.
CONCURRENT, LEASE = 5, 3
#: Seconds the view runs.
SLOW = 0.3
SUBJECT_HEADER = "X-Subject"

# The record: a set of the requests inside the view (``<pid>:<entry time>:<uuid>``), the most
# seen at once since the test last asked (``most``) and when it was first seen (``most_at``),
# and the most over the whole run (``peak``).
_ENTER = """
redis.call('SADD', KEYS[1], ARGV[1])
local n = redis.call('SCARD', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], n)
  redis.call('SET', KEYS[4], ARGV[2])
end
if n > tonumber(redis.call('GET', KEYS[3]) or '0') then redis.call('SET', KEYS[3], n) end
return n
"""
# The most since the last call, and a new count from what is inside now; with a pid, that
# process's requests are taken out first (it was killed: nothing of it runs), and returned.
_RESTART = """
local most = tonumber(redis.call('GET', KEYS[2]) or '0')
local gone = {}
if ARGV[1] ~= '' then
  for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    if string.sub(m, 1, #ARGV[1]) == ARGV[1] then
      redis.call('SREM', KEYS[1], m)
      table.insert(gone, m)
    end
  end
end
local at = redis.call('GET', KEYS[4]) or '0'
redis.call('SET', KEYS[2], redis.call('SCARD', KEYS[1]))
redis.call('SET', KEYS[4], ARGV[2])
return {most, at, gone}
"""


class Seen(NamedTuple):
    """What the record saw since the test last asked."""

    most: int  # the most requests inside the view at once
    at: float  # when that many were first inside
    killed: list[float]  # when each request of a killed worker, inside the view, had entered


class Recorder:
    """Who is inside the view, across processes: each step is one Lua script, so the count
    a request sees on entry is exact."""

    def __init__(self, url: str, run: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.keys = [f"{run}:{name}" for name in ("inside", "most", "peak", "most_at")]
        self._enter = self.client.register_script(_ENTER)
        self._restart = self.client.register_script(_RESTART)

    def enter(self) -> str:
        now = f"{time.time():.6f}"
        member = f"{os.getpid()}:{now}:{uuid.uuid4().hex}"
        self._enter(keys=self.keys, args=[member, now])
        return member

    def leave(self, member: str) -> None:
        self.client.srem(self.keys[0], member)

    def inside(self) -> list[tuple[int, float]]:
        """(pid, entry time) of each request inside the view now."""
        return [_parse(m) for m in self.client.smembers(self.keys[0])]

    def restart(self, killed: int | None = None) -> Seen:
        """What was seen since the last restart; counting starts again from those inside
        now, without the requests of the ``killed`` process (nothing of it runs)."""
        prefix = f"{killed}:" if killed else ""
        most, at, gone = self._restart(keys=self.keys, args=[prefix, f"{time.time():.6f}"])
        return Seen(int(most), float(at), [_parse(m)[1] for m in gone])

    def peak(self) -> int:
        return int(self.client.get(self.keys[2]) or 0)


def _parse(member: bytes | str) -> tuple[int, float]:
    text = member.decode() if isinstance(member, bytes) else member
    pid, entered, _ = text.split(":")
    return int(pid), float(entered)


@functools.cache
def recorder() -> Recorder:
    return Recorder(os.environ["INFLIGHT_RECORD"], os.environ["INFLIGHT_RUN"])


def slow(request: HttpRequest) -> HttpResponse:
    member = recorder().enter()
    try:
        time.sleep(SLOW)
    finally:
        recorder().leave(member)
    return HttpResponse("ok")


def stream(request: HttpRequest) -> StreamingHttpResponse:
    def chunks() -> Iterator[bytes]:
        for _ in range(200):
            yield b"x" * 65536
            time.sleep(0.05)

    return StreamingHttpResponse(chunks())


def ping(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("slow/", slow), path("stream/", stream), path("ping/", ping)]

SECRET_KEY = "django-bucketry-reliability-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "ratelimit_app"]
MIDDLEWARE = ["ratelimit_app.middleware.RatelimitMiddleware"]
ROOT_URLCONF = __name__
DATABASES: dict[str, dict[str, str]] = {}

CACHES = counter_caches()
RATELIMIT_USE_CACHE = "ratelimit"
_KEY = f"header:{SUBJECT_HEADER.lower()}"
RATELIMIT_RULES = [
    {
        "name": "in-flight",
        "path": "/slow/",
        "key": _KEY,
        "concurrent": CONCURRENT,
        "lease": f"{LEASE}s",
    },
    {"name": "in-flight-stream", "path": "/stream/", "key": _KEY, "concurrent": 1, "lease": "1m"},
]
USE_TZ = True
