"""Django's ``DummyCache`` as the counter cache: nothing is stored, so nothing is limited.

``DummyCache`` is common in development settings. It accepts every write and forgets it, and
every read misses. Through the generic cache path that is a lost write on every hit (its
``incr`` finds no key), and a check that fails closed refuses every request: a site that
works in production would refuse everything in development. As django-ratelimit does, it
never limits instead: each check sees only its own hit (the increment a real cache would
have answered with 1) and nothing before it. So a rate of ``0`` still refuses, as it does
everywhere, and every other rate admits. ``ratelimit_app.W005`` warns at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence

from ratelimit_app.backends.base import Backend, Op


class DummyBackend(Backend):
    """Counts nothing; a check's own hit is the only one it sees. Leaky buckets use the
    default meter on the ``DummyCache``, which reads nothing back: every bucket is empty."""

    inline_ok = True  # no I/O at all

    def run_many(self, ops: Sequence[Op]) -> list[list[int]]:
        found = []
        for op in ops:
            values = [0] * len(op.plan.reads)
            if op.increment:
                # What an increment of an empty counter answers, as the proof of this hit
                # (of its cost: a cost over the limit is refused here too).
                encoded = self.encoded(op.plan)
                encoded.merge(values, [op.amount] * len(encoded.writes))
            found.append(values)
        return found

    def delete(self, namespace: str, suffixes: Sequence[str]) -> None:
        """Nothing is stored: nothing to forget."""
