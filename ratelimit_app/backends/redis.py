"""Redis through django-redis: one atomic Lua script a check.

The script increments the write buckets (setting their TTL on creation) and reads every
bucket of the window, atomically, in one round trip. Keys of one subject share a hash tag
(``{...}``), one Redis Cluster slot per subject: :class:`RedisClusterBackend` (redis-py's
cluster client; django-redis has none) runs one script call per slot. Connections come from
django-redis's connection factory with bounded socket timeouts. Bucket indexes come from the
client's clock (:func:`ratelimit_app.clock.now`), never the server's.

Leaky buckets (:mod:`ratelimit_app.gcra`) have a script of their own, :data:`METER_SCRIPT`:
every leaky-bucket rule of a request in one atomic call. A request with rules of both
algorithms sends both scripts in one pipelined round trip (each atomic on its own).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, cast

from redis.crc import key_slot
from redis.exceptions import NoScriptError

from ratelimit_app import gcra
from ratelimit_app.backends.base import Backend, Encoded, MeterOp, MeterReply, Op
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


#: Every leaky bucket of a request, atomically: KEYS[i] is the i-th subject's TAT key,
#: ARGV[1] the client's time in microseconds ``t``, then seven ARGV per subject (offset
#: ``o``; ARGV[n] stands for ARGV[o + n]): the rate's count ``n``; the interval ``T`` and the
#: tolerance ``tau`` as (microseconds, ticks of 1/n microsecond) pairs, ARGV[2], ARGV[3] and
#: ARGV[4], ARGV[5]; the mode, ARGV[6]: "c" counts (stores the new TAT when the request
#: fits), "l" looks, "u" takes back the request that stored ARGV[7], if the TAT is still
#: that. A TAT is stored as "<microseconds>:<ticks>" (see :mod:`ratelimit_app.gcra`): every
#: number stays an exact integer in Lua's doubles. The reply, per subject: the TAT read ("" if
#: none) and the TAT stored ("" if none).
METER_SCRIPT = """
local t = tonumber(ARGV[1])
local margin = MARGIN_MS
local function parse(text, n)
  local a, r = string.match(text, '^(%d+):(%d+)$')
  if not a or tonumber(r) >= n then
    error('not a leaky-bucket TAT: ' .. string.sub(text, 1, 40))
  end
  return tonumber(a), tonumber(r)
end
local function store(key, a, r)
  local text = string.format('%.0f:%.0f', a, r)
  redis.call('SET', key, text, 'PX', math.floor((a - t) / 1000) + margin)
  return text
end
local reply = {}
for i = 1, #KEYS do
  local o = 1 + (i - 1) * 7
  local key, mode = KEYS[i], ARGV[o + 6]
  local n = tonumber(ARGV[o + 1])
  local q, rem = tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])
  local stored = redis.call('GET', key)
  local written = ''
  if stored then parse(stored, n) end
  if mode == 'u' then
    if stored == ARGV[o + 7] then
      local a, r = parse(stored, n)
      a, r = a - q, r - rem
      if r < 0 then a, r = a - 1, r + n end
      if a > t or (a == t and r > 0) then store(key, a, r) else redis.call('DEL', key) end
    end
  elseif mode == 'c' and n > 0 then
    local a, r = t, 0
    if stored then
      local sa, sr = parse(stored, n)
      if sa > t or (sa == t and sr > 0) then a, r = sa, sr end
    end
    a, r = a + q, r + rem
    if r >= n then a, r = a + 1, r - n end
    local tau_a, tau_r = tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5])
    if a - t < tau_a or (a - t == tau_a and r <= tau_r) then written = store(key, a, r) end
  end
  reply[#reply + 1] = stored or ''
  reply[#reply + 1] = written
end
return reply
""".replace("MARGIN_MS", str(gcra.TTL_MARGIN * 1000 + 1))


def _meter_args(m: gcra.Meter) -> list[bytes]:
    """A meter's part of :data:`METER_SCRIPT`'s ARGV, less the mode and the take-back."""
    n = m.rate.count or 1  # a count of 0 never admits: the script only reads
    q, rem = divmod(m.interval, n)
    tau_a, tau_r = divmod(m.tau, n)
    return [b"%d" % m.rate.count, b"%d" % q, b"%d" % rem, b"%d" % tau_a, b"%d" % tau_r]


def _split(suffix: bytes) -> tuple[bytes, bytes] | None:
    """``b":60/60:123"`` -> ``(b":60/60", b"123")`` for uniform buckets, else None."""
    if suffix.startswith(b":h") or suffix == gcra.SUFFIX.encode():
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
        self.refresh_proofs()
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
        self.meter_script = self.client.register_script(METER_SCRIPT)

    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        return self._exchange(ops, (), 0)[0]

    def meter_many(self, ops: Sequence[MeterOp], now_us: int) -> list[MeterReply]:
        return self._exchange((), ops, now_us)[1]

    def exchange(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        """Both scripts pipelined into one round trip (one alone when the other has no work)."""
        if not meters:
            return self.run_many(ops), []
        if not ops:
            return [], self.meter_many(meters, now_us)
        return self._exchange(ops, meters, now_us)

    def _exchange(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        self._check_alive()
        # One script call per group of subjects (:meth:`_groups`: all of them on one server,
        # one hash slot each on a cluster).
        window_groups = [
            (group, [ops[i] for i in group])
            for group in (self._groups([op.namespace for op in ops]) if ops else [])
        ]
        meter_groups = [
            (group, [meters[i] for i in group])
            for group in (self._groups([m.namespace for m in meters]) if meters else [])
        ]
        calls: list[tuple[Any, list[bytes], list[bytes]]] = []
        for _, chosen_ops in window_groups:
            calls.append((self.script, *self._window_args(chosen_ops)))
        for _, chosen_meters in meter_groups:
            calls.append((self.meter_script, *self._meter_args(chosen_meters, now_us)))
        values: list[list[int]] = [[] for _ in ops]
        metered: list[MeterReply] = [MeterReply(None)] * len(meters)
        try:
            replies = iter(self._evaluate(calls))
            for group, chosen_ops in window_groups:
                found = self._window_values(chosen_ops, next(replies))
                for i, v in zip(group, found, strict=True):
                    values[i] = v
            for group, chosen_meters in meter_groups:
                answered = self._meter_replies(chosen_meters, next(replies))
                for i, reply in zip(group, answered, strict=True):
                    metered[i] = reply
        except Exception as exc:  # includes a counter that is not a number
            raise self._failed(exc) from exc
        self._succeeded()
        return values, metered

    def _groups(self, namespaces: Sequence[str]) -> list[list[int]]:
        """The subjects (indexes into ``namespaces``) each script call carries: all of them,
        in one call, on a single server."""
        return [list(range(len(namespaces)))]

    def _evaluate(self, calls: list[tuple[Any, list[bytes], list[bytes]]]) -> list[Any]:
        """Run the scripts: one alone through redis-py (which loads it if needed), several
        as EVALSHAs in one pipeline (a script the server lacks is then run again alone)."""
        if len(calls) == 1:
            script, keys, args = calls[0]
            return [script(keys=keys, args=args)]
        pipe = self.client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies = pipe.execute(raise_on_error=False)
        for n, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):  # not run: safe to run again
                script, keys, args = calls[n]
                replies[n] = script(keys=keys, args=args)
            elif isinstance(reply, Exception):
                raise reply
        return replies

    def _window_args(self, ops: Sequence[Op]) -> tuple[list[bytes], list[bytes]]:
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
        return keys, args

    def _window_values(self, ops: Sequence[Op], reply: Any) -> list[list[int]]:
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
        return results

    def _meter_args(self, ops: Sequence[MeterOp], now_us: int) -> tuple[list[bytes], list[bytes]]:
        keys, args = [], [b"%d" % now_us]
        for op in ops:
            keys.append((self.cache_prefix + self.rl_prefix + op.namespace + gcra.SUFFIX).encode())
            args += _meter_args(op.meter)
            if op.take_back is not None:
                written = op.take_back.written
                taken = b"" if written is None else gcra.encode(op.meter, written)
                args += [b"u", taken]
            else:
                args += [b"c" if op.increment else b"l", b""]
        return keys, args

    @staticmethod
    def _meter_replies(ops: Sequence[MeterOp], reply: Any) -> list[MeterReply]:
        return [
            MeterReply(
                gcra.decode(op.meter, reply[2 * n] or None),
                gcra.decode(op.meter, reply[2 * n + 1] or None),
            )
            for n, op in enumerate(ops)
        ]

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
            for key in sorted(keys):  # one key a command: a cluster's pipeline takes no more
                pipe.delete(key)
            for key, names in fields.items():
                pipe.hdel(key, *names)
            pipe.execute()
        except Exception as exc:
            raise self._failed(exc) from exc


class RedisClusterBackend(RedisBackend):
    """Redis Cluster, through redis-py's ``RedisCluster`` (django-redis has no cluster client).

    Select it with ``RATELIMIT_BACKEND = "ratelimit_app.backends.redis.RedisClusterBackend"``;
    ``LOCATION`` of the ``RATELIMIT_USE_CACHE`` alias names one node of the cluster
    (``redis://host:port``; a list: the first), from which the client learns the others.
    The scripts and the key layout are :class:`RedisBackend`'s: every key of a subject carries
    its hash tag, so a subject's buckets live in one slot, and the subjects of a request are
    checked by one script call per slot (a cluster refuses a call whose keys span slots).
    A request whose rules count two subjects on two slots makes two round trips.

    The client connects (and learns the cluster's slots) on first use, not when the backend
    is built: a cluster that cannot be reached fails that check, and the next ones fail at
    once for ``RATELIMIT_DEAD_RETRY`` seconds, like any backend that failed. redis-py's
    cluster client retries a failed node and refreshes its slot map, so a check can take
    longer than one socket timeout: async views run it in a thread, off the event loop.
    """

    inline_ok = False

    def __init__(self, alias: str, cache: Any) -> None:
        """Built as ``RATELIMIT_BACKEND`` classes are, ``cls(alias, cache)``: the node and
        the timeouts come from ``CACHES[alias]``."""
        Backend.__init__(self, alias, cache)
        from django.conf import settings

        config = settings.CACHES[alias]
        location = config.get("LOCATION", "")
        options = cast(dict[str, Any], config.get("OPTIONS") or {})
        url = location if isinstance(location, str) else next(iter(location), "")
        self.url = str(url).split(",")[0].strip()
        if not self.url:
            raise BackendError(f"{alias}: no Redis Cluster node in LOCATION")
        self.timeouts = {
            "socket_timeout": options.get("SOCKET_TIMEOUT", conf.SOCKET_TIMEOUT),
            "socket_connect_timeout": options.get("SOCKET_CONNECT_TIMEOUT", conf.SOCKET_TIMEOUT),
        }
        self.connected = False
        self._connect_lock = threading.Lock()

    def _connect(self) -> None:
        """Build the cluster client on first use (it reads the slot map from a node)."""
        if self.connected:
            return
        self._check_alive()
        with self._connect_lock:
            if self.connected:
                return
            from redis.cluster import RedisCluster

            try:
                client = RedisCluster.from_url(self.url, **self.timeouts)
            except Exception as exc:
                raise self._failed(exc) from exc
            self.client = client
            self.script = client.register_script(SCRIPT)
            self.meter_script = client.register_script(METER_SCRIPT)
            self.connected = True

    def _exchange(
        self, ops: Sequence[Op], meters: Sequence[MeterOp], now_us: int
    ) -> tuple[list[list[int]], list[MeterReply]]:
        self._connect()
        return super()._exchange(ops, meters, now_us)

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        self._connect()
        super().delete(namespace, suffixes)

    def _groups(self, namespaces: Sequence[str]) -> list[list[int]]:
        """One group per hash slot (a namespace is its subject's hash tag), in first-seen
        order."""
        by_slot: dict[int, list[int]] = {}
        for i, ns in enumerate(namespaces):
            by_slot.setdefault(key_slot(ns.encode()), []).append(i)
        return list(by_slot.values())

    def _evaluate(self, calls: list[tuple[Any, list[bytes], list[bytes]]]) -> list[Any]:
        """Each call on its own, routed to the node of its slot by redis-py."""
        return [script(keys=keys, args=args) for script, keys, args in calls]

    def close(self) -> None:
        if self.connected:
            self.client.close()
