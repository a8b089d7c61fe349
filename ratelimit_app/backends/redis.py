"""Redis through django-redis: one atomic Lua script a check.

The script increments the write buckets (setting their TTL on creation) and reads every
bucket of the window, atomically, in one round trip. Keys of one subject share a hash tag
(``{...}``), so the script also runs on Redis Cluster. Bucket indexes come from the client's
clock (:func:`ratelimit_app.clock.now`), never the server's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ratelimit_app.backends.base import Backend
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

    def __init__(self, alias: str, cache: Any) -> None:
        super().__init__(alias, cache)
        from django_redis import get_redis_connection

        self.client = get_redis_connection(alias)
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

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        self._check_alive()
        base = self.cache_prefix + self.rl_prefix + namespace
        try:
            self.client.delete(*(base + s for s in suffixes))
        except Exception as exc:
            raise self._failed(exc) from exc
