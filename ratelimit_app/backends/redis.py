"""Redis through django-redis: one atomic Lua script a check.

The script increments the write buckets (setting their TTL on creation) and reads every
bucket of the window, atomically, in one round trip. Keys of one subject share a hash tag
(``{...}``), so the script also runs on Redis Cluster. Connections come from django-redis's
connection factory with bounded socket timeouts. Bucket indexes come from the client's
clock (:func:`ratelimit_app.clock.now`), never the server's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ratelimit_app.backends.base import Backend
from ratelimit_app.conf import conf
from ratelimit_app.exceptions import BackendError
from ratelimit_app.windows import Plan

#: KEYS[1] routes the call (it carries the subject's hash tag); ARGV[1] is the subject's key
#: base, ARGV[2] "suffix ttl ..." to increment, ARGV[3] "suffix ..." to read. Building the keys
#: here keeps the request and redis-py's work small; every key shares KEYS[1]'s hash tag, so
#: all live in its slot on Redis Cluster. The values come back as one string ("3 0 1 ..."):
#: redis-py parses a reply element by element in Python, a string in one piece.
SCRIPT = """
local base = ARGV[1]
local written = {}
for suffix, ttl in string.gmatch(ARGV[2], "(%S+) (%d+)") do
  local key = base .. suffix
  local v = redis.call('INCR', key)
  if v == 1 then redis.call('EXPIRE', key, ttl) end
  written[#written + 1] = v
end
local keys = {}
for suffix in string.gmatch(ARGV[3], "%S+") do keys[#keys + 1] = base .. suffix end
local found = {}
if #keys > 0 then
  local values = redis.call('MGET', unpack(keys))
  for i = 1, #keys do found[i] = values[i] or '0' end
end
return {written, table.concat(found, ' ')}
"""


#: Take back a refused hit: decrement, and drop a bucket that is back to zero (or that had
#: vanished, which DECR would otherwise recreate at -1 with no TTL).
UNDO = """
local base = ARGV[1]
for suffix in string.gmatch(ARGV[2], "%S+") do
  local key = base .. suffix
  if redis.call('DECR', key) <= 0 then redis.call('DEL', key) end
end
return 1
"""


class RedisBackend(Backend):
    inline_ok = True

    def __init__(self, alias: str, cache: Any, location: Any, options: dict[str, Any]) -> None:
        super().__init__(alias, cache)
        from django_redis.pool import get_connection_factory

        # django-redis's own connection factory (the cache's OPTIONS: password, parser, pool
        # class...), on a pool of our own: django-redis shares one pool per URL, whose
        # timeouts whoever came first decided, and without a timeout a server that stops
        # answering would hang every request. RATELIMIT_SOCKET_TIMEOUT applies unless the
        # cache's OPTIONS set SOCKET_TIMEOUT / SOCKET_CONNECT_TIMEOUT.
        options = dict(options)
        options.setdefault("SOCKET_TIMEOUT", conf.SOCKET_TIMEOUT)
        options.setdefault("SOCKET_CONNECT_TIMEOUT", conf.SOCKET_TIMEOUT)
        url = location if isinstance(location, str) else next(iter(location))  # the primary
        factory = get_connection_factory(options)
        pool = factory.get_connection_pool(factory.make_connection_params(url.split(",")[0]))
        self.client = factory.redis_client_cls(
            connection_pool=pool,
            **factory.redis_client_cls_kwargs,
        )
        self.script = self.client.register_script(SCRIPT)
        self.undo_script = self.client.register_script(UNDO)

    def run(self, namespace: str, plan: Plan, increment: bool) -> list[int]:
        self._check_alive()
        enc = self.encoded(plan)
        base = (self.cache_prefix + self.rl_prefix + namespace).encode()
        writes = enc.writes_line if increment else b""
        try:
            written, found = self.script(
                keys=[base + enc.reads[-1]], args=[base, writes, enc.reads_line]
            )
            values = list(map(int, found.split()))
        except Exception as exc:  # includes a counter that is not a number
            raise self._failed(exc) from exc
        self._succeeded()
        if len(written) != (len(enc.writes) if increment else 0):
            raise BackendError(f"{self.alias}: lost counter writes")
        if increment:
            enc.merge(values, written)
        return values

    def undo(self, namespace: str, plan: Plan) -> None:
        self._check_alive()
        enc = self.encoded(plan)
        base = (self.cache_prefix + self.rl_prefix + namespace).encode()
        suffixes = b" ".join(s for s, _ in enc.writes)
        try:
            self.undo_script(keys=[base + enc.reads[-1]], args=[base, suffixes])
        except Exception as exc:
            raise self._failed(exc) from exc

    def close(self) -> None:
        self.client.connection_pool.disconnect()

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        self._check_alive()
        base = self.cache_prefix + self.rl_prefix + namespace
        try:
            self.client.delete(*(base + s for s in suffixes))
        except Exception as exc:
            raise self._failed(exc) from exc
