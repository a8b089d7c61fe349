"""The version counters that tell every process the configuration in force changed.

Five counters in the counter backend, read together in one round trip about once a second
by each process (:mod:`ratelimit_app.store`), and bumped by whatever changes the database's
rules, lists, bans or overrides (the models' signals, :mod:`ratelimit_app.bans.applied`), or
lowers a subject's counts (a reset, :func:`ratelimit_app.operators.operations.reset`).
"""

from __future__ import annotations

import logging
import math
import secrets

from ratelimit_app.algorithms.windows import Plan
from ratelimit_app.backends import get_backend
from ratelimit_app.backends.base import Op
from ratelimit_app.identity.namespaces import namespace
from ratelimit_app.runtime import RUNTIME

__all__ = [
    "BANS",
    "BANS_DELETED",
    "CONFIG",
    "COUNTS",
    "OVERRIDES",
    "VERSION_KEY",
    "VERSION_PLANS",
    "Versions",
    "bump",
    "read_version",
    "seed_counts",
    "version_op",
]

logger = logging.getLogger("ratelimit_app")

VERSION_KEY = "config-version"

#: The version counters, one key each, read together once a second (one round trip):
#: :data:`CONFIG` (a rule or a list changed, an override deleted: everything but the bans
#: is read again), :data:`BANS` (a ban made, extended or lifted: the bans changed since are
#: read), :data:`OVERRIDES` (an override saved: likewise), :data:`BANS_DELETED` (a ban
#: row deleted while in force: the bans are read again) and :data:`COUNTS` (a subject's
#: counts reset: every process forgets the refusals it remembers). COUNTS is never 0 once
#: read: the first process to find it 0 sets it to a random number (:func:`seed_counts`), so
#: counters flushed or lost show as a change too.
CONFIG, BANS, OVERRIDES, BANS_DELETED, COUNTS = 0, 1, 2, 3, 4
_SUFFIXES = (":h0:0", ":h1:0", ":h2:0", ":h3:0", ":h4:0")
#: Each counter's plan: increment it, read them all (an eviction changes one too: a read).
VERSION_PLANS = tuple(
    Plan(writes=((suffix, 400 * 86400),), reads=_SUFFIXES, rates=()) for suffix in _SUFFIXES
)
Versions = tuple[int, ...]


def bump(which: int = CONFIG) -> None:
    """Something changed: a new version of ``which`` counter (:data:`CONFIG`,
    :data:`BANS`, :data:`OVERRIDES`, :data:`BANS_DELETED` or :data:`COUNTS`) for every
    process, and this process looks on its next request."""
    try:
        version_op(increment=True, which=which)
    except Exception as exc:  # other processes catch up when the cache is back
        logger.warning("ratelimit: could not announce a configuration change: %s", exc)
    snap = RUNTIME.snapshot
    if snap is not None:
        if which == CONFIG:
            snap.expires = -math.inf  # read everything (the bans but what changed)
        snap.deadline = -math.inf


def version_op(increment: bool, which: int = CONFIG) -> Versions:
    """The five counters, read in one round trip, ``which`` incremented first when
    ``increment``; raises what the backend raises."""
    ns = namespace("ratelimit-config", VERSION_KEY, "")
    found = get_backend().run(ns, VERSION_PLANS[which], increment)
    return tuple(int(v) for v in found)


def seed_counts() -> Versions:
    """The five counters, :data:`COUNTS` first raised by a random number from 1 to 2**20:
    for a process that found it 0 (never set, or lost with the counters), so that the next
    loss shows as a change to every process, whatever it read before. Raises what the
    backend raises."""
    ns = namespace("ratelimit-config", VERSION_KEY, "")
    op = Op(ns, VERSION_PLANS[COUNTS], True, None, 1 + secrets.randbelow(1 << 20))
    return tuple(int(v) for v in get_backend().run_many((op,))[0])


def read_version() -> Versions | None:
    """The five counters, or None when the counter backend cannot be read (logged)."""
    try:
        return version_op(increment=False)
    except Exception as exc:
        logger.debug("ratelimit: could not read the configuration version: %s", exc)
        return None
