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

from ratelimit_app.backends.base import Backend, Encoded, Op
from ratelimit_app.conf import conf
from ratelimit_app.exceptions import BackendError
from ratelimit_app.windows import Plan

#: One check of one or more subjects (the rules of a request), seven ARGV per subject, offset
#: ``o``; below, ARGV[n] stands for ARGV[o + n]. ARGV[1] is the subject's key base; its KEYS
#: entry carries the subject's hash tag, so the call is routed to the right node, and every key
#: built for the subject shares that tag (one Redis Cluster slot per subject).
#: A uniform window's buckets are the fields of one hash per window (``base:W/G``): one key to
#: read with HGETALL instead of 61 to look up, and stale fields are dropped on the way (a whole
#: window after they left it, so a client whose clock runs ahead cannot drop what others
#: still count). Hierarchical buckets are keys of their own (``base:hL:index``).
#: ARGV[2] "level field ttl ..." hash increments, ARGV[3] "suffix ttl ..." key increments,
#: ARGV[4] "level first last keep ..." hash fields to read (first..last; fields before
#: first - keep are stale: keep is two windows, a whole window older than anything a check
#: may still read, whatever the clock of the client that trims),
#: ARGV[5] "suffix ..." keys to read,
#: and first of all ARGV[6] "level field ..." / ARGV[7] "suffix ..." to take back (a refused
#: hit): decrement, and drop a bucket back at zero, or one that had vanished, which the
#: decrement would otherwise recreate at -1 with no TTL.
#: The reply, per subject: the new values of the increments, and "suffix count ..." for every
#: bucket that holds a count, as one string (redis-py parses a reply element by element in
#: Python).
SCRIPT = """
local reply = {}
for o = 0, #ARGV - 1, 7 do
  local base = ARGV[o + 1]
  for level, field in string.gmatch(ARGV[o + 6], "(%S+) (%d+)") do
    local key = base .. level
    if redis.call('HINCRBY', key, field, -1) <= 0 then redis.call('HDEL', key, field) end
  end
  for suffix in string.gmatch(ARGV[o + 7], "%S+") do
    local key = base .. suffix
    if redis.call('DECR', key) <= 0 then redis.call('DEL', key) end
  end
  local written = {}
  for level, field, ttl in string.gmatch(ARGV[o + 2], "(%S+) (%d+) (%d+)") do
    local key = base .. level
    written[#written + 1] = redis.call('HINCRBY', key, field, 1)
    redis.call('EXPIRE', key, ttl)
  end
  for suffix, ttl in string.gmatch(ARGV[o + 3], "(%S+) (%d+)") do
    local key = base .. suffix
    local v = redis.call('INCR', key)
    if v == 1 then redis.call('EXPIRE', key, ttl) end
    written[#written + 1] = v
  end
  local out = {}
  for level, first, last, keep in string.gmatch(ARGV[o + 4], "(%S+) (%d+) (%d+) (%d+)") do
    local key = base .. level
    local lo, hi = tonumber(first), tonumber(last)
    local stale_before = lo - tonumber(keep)
    local all = redis.call('HGETALL', key)
    local stale = {}
    for i = 1, #all, 2 do
      local k = tonumber(all[i])
      if k < stale_before then
        stale[#stale + 1] = all[i]
      elseif k >= lo and k <= hi then
        out[#out + 1] = level .. ':' .. all[i]
        out[#out + 1] = all[i + 1]
      end
    end
    if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  end
  local suffixes = {}
  for suffix in string.gmatch(ARGV[o + 5], "%S+") do suffixes[#suffixes + 1] = suffix end
  if #suffixes > 0 then
    local keys = {}
    for i = 1, #suffixes do keys[i] = base .. suffixes[i] end
    local values = redis.call('MGET', unpack(keys))
    for i = 1, #suffixes do
      if values[i] then
        out[#out + 1] = suffixes[i]
        out[#out + 1] = values[i]
      end
    end
  end
  reply[#reply + 1] = written
  reply[#reply + 1] = table.concat(out, ' ')
end
return reply
"""


def _split(suffix: bytes) -> tuple[bytes, bytes] | None:
    """``b":60/60:123"`` -> ``(b":60/60", b"123")`` for uniform buckets, else None."""
    if suffix.startswith(b":h"):
        return None
    level, _, field = suffix.rpartition(b":")
    return level, field


def _window_length(level: bytes) -> int:
    """Buckets of one window at a level: ``b":60/60"`` -> 60, ``b":60/60x10"`` -> 6.

    Fields more than this many buckets before the first one a check reads are stale, whatever
    the reads of the moment (at the start of a coarse bucket a check may read a single fine
    bucket, but later checks read older ones again at the old edge).
    """
    per_window, _, coarse = level.rpartition(b"/")[2].partition(b"x")
    return int(per_window) // int(coarse or b"1")


class RedisEncoded(Encoded):
    """The plan as the script's arguments, and the order its increments come back in."""

    __slots__ = ("hash_writes", "key_reads", "key_writes", "runs", "undo_hash", "undo_keys")

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        hash_writes, key_writes, undo_hash, undo_keys, order = [], [], [], [], []
        for n, (suffix, ttl) in enumerate(self.writes):
            split = _split(suffix)
            if split is None:
                key_writes.append(b"%s %d" % (suffix, ttl))
                undo_keys.append(suffix)
            else:
                hash_writes.append(b"%s %s %d" % (*split, ttl))
                undo_hash.append(b"%s %s" % split)
                order.append(n)
        order += [n for n, (s, _) in enumerate(self.writes) if _split(s) is None]
        # The script answers hash increments first: reorder write_index to match.
        self.write_index = [self.write_index[n] for n in order]
        self.hash_writes = b" ".join(hash_writes)
        self.key_writes = b" ".join(key_writes)
        self.undo_hash = b" ".join(undo_hash)
        self.undo_keys = b" ".join(undo_keys)
        runs: dict[bytes, list[int]] = {}
        key_reads = []
        for suffix in self.reads:
            split = _split(suffix)
            if split is None:
                key_reads.append(suffix)
            else:
                runs.setdefault(split[0], []).append(int(split[1]))
        self.runs = b" ".join(
            b"%s %d %d %d" % (lv, min(ks), max(ks), 2 * _window_length(lv))
            for lv, ks in runs.items()
        )
        self.key_reads = b" ".join(key_reads)


class RedisBackend(Backend):
    inline_ok = True
    encoding = RedisEncoded

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

    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        self._check_alive()
        keys, args = [], []
        for op in ops:
            enc: Any = self.encoded(op.plan)
            base = (self.cache_prefix + self.rl_prefix + op.namespace).encode()
            keys.append(base + enc.reads[-1])
            args += [base, b"", b"", enc.runs, enc.key_reads, b"", b""]
            if op.increment:
                args[-6:-4] = [enc.hash_writes, enc.key_writes]
            if op.undo is not None:
                taken: Any = self.encoded(op.undo)
                args[-2:] = [taken.undo_hash, taken.undo_keys]
        try:
            reply = self.script(keys=keys, args=args)
            results = []
            for n, op in enumerate(ops):
                written, found = reply[2 * n], reply[2 * n + 1]
                enc = self.encoded(op.plan)
                values = [0] * len(enc.reads)
                tokens = found.split()
                for k in range(0, len(tokens), 2):
                    values[enc.index[tokens[k]]] = int(tokens[k + 1])
                if len(written) != (len(enc.writes) if op.increment else 0):
                    raise BackendError("lost counter writes")
                if op.increment:
                    enc.merge(values, written)
                results.append(values)
        except Exception as exc:  # includes a counter that is not a number
            raise self._failed(exc) from exc
        self._succeeded()
        return results

    def close(self) -> None:
        self.client.connection_pool.disconnect()

    def physical_key(self, namespace: str, suffix: str) -> tuple[str, str | None]:
        """The Redis key (and hash field) that holds one bucket."""
        base = self.cache_prefix + self.rl_prefix + namespace
        split = _split(suffix.encode())
        if split is None:
            return base + suffix, None
        return base + split[0].decode(), split[1].decode()

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        self._check_alive()
        keys: set[str] = set()
        fields: dict[str, list[str]] = {}
        for suffix in suffixes:
            key, field = self.physical_key(namespace, suffix)
            if field is None:
                keys.add(key)
            else:
                fields.setdefault(key, []).append(field)
        try:
            pipe = self.client.pipeline(transaction=False)
            if keys:
                pipe.delete(*keys)
            for key, names in fields.items():
                pipe.hdel(key, *names)
            pipe.execute()
        except Exception as exc:
            raise self._failed(exc) from exc
