"""``METRICS_BUFFER = "redis"``: one buffer in Redis shared by every process.

For sites that cannot lose a killed worker's last seconds: each :func:`metrics_app.record`
is one script call (one round trip) that adds to a field ``<minute>:<name>`` of a hash
:data:`REDIS_KEY`, through the django-redis cache ``METRICS_BUFFER`` names (``"default"``,
or the alias of ``"redis:<alias>"``), instead of a dict increment. The Celery task
:func:`metrics_app.tasks.flush_redis_buffer` (in the beat schedule) drains it:

1. each hash already pending (a run that failed before) is written with
   :func:`metrics_app.storage.write_counts` under the flush id ``redis:<uuid>``, then
   deleted;
2. a Lua script renames the live hash to ``<key>:flushing:<uuid>`` and adds that name to
   the set ``<key>:pending``, atomically, so new increments go to a fresh hash; the new
   pending hash is written as in 1.

A crash between a commit and its delete leaves the hash pending; the next run writes it
again and the ledger makes that a no-op. Keys share one hash tag (``{...}``), so the scripts
also run on Redis Cluster.

**The bounds**, as in the memory buffer: the live hash holds at most
:data:`~metrics_app.buffer.aggregator.MAX_BUFFERED_KEYS` fields, of which at most
:data:`~metrics_app.buffer.aggregator.MAX_CLIENT_KEYS` have a client-chosen name (counted in
``<key>:client``, reset when the hash is renamed). A count for a new field past a bound is
dropped. While the database is down, step 1 fails and the live hash is not renamed, so the
buffer stays within one live hash and the pending ones.
"""

from __future__ import annotations

import uuid
from typing import Any

from metrics_app.buffer import aggregator
from metrics_app.conf import DEFAULT_REDIS_ALIAS, conf

#: The name of the live hash, used inside a hash tag (``{metrics:buffer}``); the buffer does
#: not use the cache's ``KEY_PREFIX``, so sites sharing one Redis need databases of their own.
REDIS_KEY = "metrics:buffer"

_MOVE = """
redis.call('DEL', KEYS[4])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('RENAME', KEYS[1], KEYS[2])
  redis.call('SADD', KEYS[3], KEYS[2])
  return 1
end
return 0
"""

#: Add ARGV[2] to field ARGV[1] of the live hash KEYS[1]; a new field only within the bounds:
#: ARGV[3] fields in all, ARGV[4] client-chosen ones (counted in KEYS[2]; "0": not one).
#: Returns 1 when counted, 0 when dropped.
_RECORD = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
  if ARGV[4] ~= '0' then
    if tonumber(redis.call('GET', KEYS[2]) or '0') >= tonumber(ARGV[4]) then return 0 end
    redis.call('INCR', KEYS[2])
  end
end
redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


def _connection() -> Any:
    from django_redis import get_redis_connection

    return get_redis_connection(conf.BUFFER_CACHE or DEFAULT_REDIS_ALIAS)


def _key() -> str:
    return "{" + REDIS_KEY + "}"


def record(name: str, minute: int, count: int, client_chosen: bool = False) -> bool:
    """Add ``count`` to ``(name, minute)``; False when a bound dropped it (see the module)."""
    conn = _connection()
    key = _key()
    share = max(1, aggregator.MAX_CLIENT_KEYS) if client_chosen else 0
    args = [f"{minute}:{name}", count, aggregator.MAX_BUFFERED_KEYS, share]
    # A registered script is sent by its SHA (EVALSHA), the source only the first time.
    return bool(conn.register_script(_RECORD)(keys=[key, f"{key}:client"], args=args))


def flush() -> int:
    """Drain the Redis buffer into the database; returns the number of keys written."""
    conn = _connection()
    key = _key()
    pending = f"{key}:pending"
    # What an earlier run left pending goes first: if the database is still down this
    # raises, and the live hash stays where its bounds hold.
    written = _write_pending(conn, pending)
    keys = [key, f"{key}:flushing:{uuid.uuid4().hex}", pending, f"{key}:client"]
    if conn.eval(_MOVE, len(keys), *keys):
        written += _write_pending(conn, pending)
    return written


def _write_pending(conn: Any, pending: str) -> int:
    """Write and delete every hash listed in ``pending``; the keys written."""
    from metrics_app import storage

    written = 0
    for member in sorted(conn.smembers(pending)):
        member_name = member.decode()
        counts: dict[tuple[str, int], int] = {}
        for field, value in conn.hgetall(member).items():
            minute, _, name = field.decode().partition(":")
            counts[name, int(minute)] = int(value)
        applied = storage.write_counts(counts, "redis:" + member_name.rsplit(":", 1)[-1])
        pipe = conn.pipeline()
        pipe.delete(member)
        pipe.srem(pending, member)
        pipe.execute()
        written += len(counts) if applied else 0
    return written


def buffered_keys() -> int:
    """Fields waiting in the live hash (not counting hashes being flushed)."""
    return int(_connection().hlen(_key()))


def client_keys() -> int:
    """Fields of the live hash with a client-chosen name."""
    return int(_connection().get(_key() + ":client") or 0)
