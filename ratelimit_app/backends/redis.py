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

SCRIPT = """
local nw = tonumber(ARGV[1])
local written = {}
for i = 1, nw do
  local v = redis.call('INCR', KEYS[i])
  if v == 1 then redis.call('EXPIRE', KEYS[i], ARGV[i + 1]) end
  written[i] = v
end
local values = {}
if #KEYS > nw then values = redis.call('MGET', unpack(KEYS, nw + 1, #KEYS)) end
return {written, values}
"""


class RedisBackend(Backend):
    inline_ok = True

    def __init__(self, alias: str, cache: Any, location: Any, options: dict[str, Any]) -> None:
        super().__init__(alias, cache)
        from django_redis.pool import get_connection_factory

        # django-redis's own connection factory, on a pool of our own: without a timeout a
        # server that stops answering would hang every request, so RATELIMIT_SOCKET_TIMEOUT
        # applies unless the cache's OPTIONS set SOCKET_TIMEOUT / SOCKET_CONNECT_TIMEOUT.
        options = dict(options)
        options.setdefault("SOCKET_TIMEOUT", conf.SOCKET_TIMEOUT)
        options.setdefault("SOCKET_CONNECT_TIMEOUT", conf.SOCKET_TIMEOUT)
        url = location if isinstance(location, str) else next(iter(location))  # the primary
        self.client = get_connection_factory(options).connect(url.split(",")[0])
        self.script = self.client.register_script(SCRIPT)

    def run(self, namespace: str, plan: Plan, increment: bool) -> list[int]:
        self._check_alive()
        base = self.cache_prefix + self.rl_prefix + namespace
        writes = plan.writes if increment else ()
        keys = [base + s for s, _ in writes] + [base + s for s in plan.reads]
        args = [len(writes), *(ttl for _, ttl in writes)]
        try:
            written, found = self.script(keys=keys, args=args)
        except Exception as exc:
            raise self._failed(exc) from exc
        self._succeeded()
        if len(written) != len(writes):
            raise BackendError(f"{self.alias}: lost counter writes")
        values = [int(v or 0) for v in found]
        index = {s: i for i, s in enumerate(plan.reads)}
        for (suffix, _), value in zip(writes, written, strict=True):
            i = index.get(suffix)
            if i is not None and values[i] < int(value):
                values[i] = int(value)
        return values

    def undo(self, namespace: str, plan: Plan) -> None:
        self._check_alive()
        base = self.cache_prefix + self.rl_prefix + namespace
        try:
            pipe = self.client.pipeline(transaction=False)
            for suffix, _ in plan.writes:
                pipe.decr(base + suffix)
            pipe.execute()
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
