"""``METRICS_BUFFER = "redis"``: one buffer in Redis shared by every process.

For sites that cannot lose a killed worker's last seconds: each :func:`metrics_app.record`
is one ``HINCRBY`` on a hash (field ``<minute>:<name>``) through the django-redis cache named
by ``METRICS_REDIS_CACHE``, so it costs a round trip instead of a dict increment. The
Celery task :func:`metrics_app.tasks.flush_redis_buffer` (in the beat schedule) drains it:

1. a Lua script renames the hash to ``<key>:flushing:<uuid>`` and adds that name to the set
   ``<key>:pending``, atomically, so new increments go to a fresh hash;
2. each pending hash is written with :func:`metrics_app.storage.write_counts` under the
   flush id ``redis:<uuid>``, then deleted.

A crash between 2's commit and its delete leaves the hash pending; the next run writes it
again and the ledger makes that a no-op. Keys share one hash tag (``{...}``), so the script
also runs on Redis Cluster.
"""

from __future__ import annotations

import uuid
from typing import Any

from metrics_app.conf import conf

_MOVE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('RENAME', KEYS[1], KEYS[2])
  redis.call('SADD', KEYS[3], KEYS[2])
  return 1
end
return 0
"""


def _connection() -> Any:
    from django_redis import get_redis_connection

    return get_redis_connection(conf.REDIS_CACHE)


def _key() -> str:
    return "{" + conf.REDIS_KEY + "}"


def record(name: str, minute: int, count: int) -> None:
    _connection().hincrby(_key(), f"{minute}:{name}", count)


def flush() -> int:
    """Drain the Redis buffer into the database; returns the number of keys written."""
    from metrics_app import storage

    conn = _connection()
    key = _key()
    pending = f"{key}:pending"
    conn.eval(_MOVE, 3, key, f"{key}:flushing:{uuid.uuid4().hex}", pending)
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
