"""Any Django cache (local memory for development and the demo): add + incr + get_many."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache

from ratelimit_app.algorithms.windows import Plan
from ratelimit_app.backends.base import Backend, Op
from ratelimit_app.exceptions import BackendError


class CacheBackend(Backend):
    """The generic path: correct on any cache with an atomic ``incr``, three calls a check."""

    def __init__(self, alias: str, cache: Any) -> None:
        super().__init__(alias, cache)
        #: Local memory does no I/O: the async path calls it on the event loop.
        self.inline_ok = isinstance(cache, LocMemCache)

    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        return [self._run(*op) for op in ops]

    def _run(
        self, namespace: str, plan: Plan, increment: bool, undo: Plan | None, amount: int = 1
    ) -> list[int]:
        if undo is not None:
            self._undo(namespace, undo, amount)
        cache = caches[self.alias]  # Django's cache objects are per thread.
        base = self.rl_prefix + namespace  # make_key adds KEY_PREFIX, VERSION
        try:
            written = []
            if increment:
                for suffix, ttl in plan.writes:
                    key = base + suffix
                    cache.add(key, 0, ttl)
                    written.append(cache.incr(key, amount))
            found = cache.get_many([base + s for s in plan.reads])
            values = [int(found.get(base + s) or 0) for s in plan.reads]
        except ValueError as exc:  # incr of a key that vanished: the write was lost
            raise BackendError(f"{self.alias}: lost a counter write ({exc})") from exc
        except Exception as exc:
            raise BackendError(f"{self.alias}: {exc}") from exc
        if increment:
            self.encoded(plan).merge(values, written)
        return values

    def _undo(self, namespace: str, plan: Plan, amount: int = 1) -> None:
        """Take back ``amount`` from each write bucket, stopping at 0 as memcached's
        decrement does: a bucket reset since its hit and counted again must not go below
        0 (lenient). The hits counted meanwhile stay: the fix-up adds, never sets."""
        cache = caches[self.alias]
        base = self.rl_prefix + namespace
        for suffix, _ in plan.writes:
            with contextlib.suppress(Exception):
                left = cache.decr(base + suffix, amount)
                if left < 0:
                    cache.incr(base + suffix, -left)

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        base = self.rl_prefix + namespace  # make_key adds KEY_PREFIX, VERSION
        try:
            caches[self.alias].delete_many([base + s for s in suffixes])
        except Exception as exc:
            raise BackendError(f"{self.alias}: {exc}") from exc
