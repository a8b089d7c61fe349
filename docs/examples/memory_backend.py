"""A complete counter backend: the counters in a dict of this process.

Set ``RATELIMIT_BACKEND = "memory_backend.MemoryBackend"`` (with this module importable).
Like ``LocMemCache`` it counts per process; it shows what a backend must do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from ratelimit_app.backends.base import Backend, Op


class MemoryBackend(Backend):
    #: Counters kept before expired ones are swept out.
    SWEEP_AT = 100_000

    def __init__(self, alias: str, cache: Any) -> None:
        super().__init__(alias, cache)  # sets self.cache_prefix and self.rl_prefix
        self.counters: dict[str, tuple[int, float]] = {}  # key: (value, expires at)
        self.lock = threading.Lock()

    def key(self, namespace: str, suffix: str) -> str:
        return self.cache_prefix + self.rl_prefix + namespace + suffix

    def value(self, key: str, now: float) -> int:
        value, expires = self.counters.get(key, (0, 0.0))
        return value if expires > now else 0

    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        now = time.monotonic()
        replies = []
        with self.lock:  # one "round trip": nothing else runs in between
            if len(self.counters) > self.SWEEP_AT:
                self.counters = {k: v for k, v in self.counters.items() if v[1] > now}
            for op in ops:
                if op.undo is not None:  # take back a refused hit
                    for suffix, _ttl in op.undo.writes:
                        key = self.key(op.namespace, suffix)
                        if self.value(key, now) > 0:
                            value, expires = self.counters[key]
                            self.counters[key] = (max(0, value - op.amount), expires)
                if op.increment:  # count this hit; a new counter lives ttl seconds
                    for suffix, ttl in op.plan.writes:
                        key = self.key(op.namespace, suffix)
                        value, expires = self.counters.get(key, (0, 0.0))
                        if expires <= now:
                            value, expires = 0, now + ttl
                        self.counters[key] = (value + op.amount, expires)
                replies.append([self.value(self.key(op.namespace, s), now) for s in op.plan.reads])
        return replies

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        with self.lock:
            for suffix in suffixes:
                self.counters.pop(self.key(namespace, suffix), None)
