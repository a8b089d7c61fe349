"""This process's refusals (:mod:`ratelimit_app.engine.refusals.memory`), shared by every way in:
each check refused with an exact wait, and its result, answered from memory while it lasts.
It knows the engine's checks and results by their attributes only, so the engine imports it
and not the other way round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratelimit_app.engine.refusals import memory as refusals
from ratelimit_app.runtime import RUNTIME

if TYPE_CHECKING:
    from ratelimit_app.config.limits import Check
    from ratelimit_app.engine.result import Result

#: Seconds at most a refusal is answered from memory before a look confirms it: how long a
#: count that went down in another process (a reset, a rule changed) takes to reach this one.
REFUSAL_MEMORY = 5.0
#: Refused subjects remembered at most; the least recently refused is forgotten first. A
#: crowd's refused subjects each come back to every process: 25,000 hold a crowd of 20,000
#: (about a kilobyte each, its check and result: 25 MB at the bound).
REFUSAL_MEMORY_SIZE = 25_000
#: Refusals a second from which a process remembers them: a flood.
FLOOD = 50
#: Seconds after which a counted event is an admitted one: a refused hit is taken back
#: within its round trips (each bounded by the socket timeout), so a refusal that events
#: this old keep in force is **settled** and outlasts the cap while the version counters
#: vouch for it (:meth:`~ratelimit_app.engine.refusals.memory.Memory.vouch`). Ten seconds
#: leaves room for a worker that stalls between its two round trips, and for clocks a
#: little apart.
SETTLED = 10.0

#: Each check refused, and its result: the runtime's refusal memory.
RUNTIME.refusals = refusals.Memory(REFUSAL_MEMORY_SIZE, FLOOD)
refusals.after_fork(RUNTIME.refusals)


def refusal_key(c: Check) -> tuple[Any, ...]:
    """What a refusal is remembered by: the limit's counters of one subject."""
    return (c.scope, c.subject, c.algorithm, c.burst)


def remember_always(on: bool) -> bool:
    """Remember every refusal, flood or not (``on``), or only a flood's; returns the
    previous choice (:func:`ratelimit_app.testing.remember_refusals`)."""
    memory = RUNTIME.refusals
    before, memory.always = memory.always, on
    return before


def remember(refused: Sequence[tuple[Check, Result]], t: float) -> None:
    """Remember the refusals of counted checks (their waits exact; settled as their results
    say, ``Result.settled``) made at ``t``, when the process is refusing a flood
    (:meth:`~ratelimit_app.engine.refusals.memory.Memory.flooding`)."""
    cap = REFUSAL_MEMORY
    if cap <= 0 or not refused:
        return
    memory = RUNTIME.refusals
    for c, r in refused:
        if c.increment and r.limited and memory.flooding(t):
            wait = r.binding().retry_after
            settled = t + getattr(r, "settled", 0.0)
            memory.remember(refusal_key(c), t, t + min(wait, cap), (c, r), t + wait, settled)


def unsettle(checks: Sequence[Check]) -> None:
    """Hold the refusals of ``checks`` for their cap only (:meth:`Memory.unsettle
    <ratelimit_app.engine.refusals.memory.Memory.unsettle>`): a failure-only limit's hits
    are taken back after the view, so its counts go down before its waits end."""
    memory = RUNTIME.refusals
    if memory.entries:
        memory.unsettle([refusal_key(c) for c in checks])


def recalled(key: tuple[Any, ...], t: float, cost: int = 1) -> Result | None:
    """The remembered refusal of ``key``, its waits counted down to ``t`` (None: none). A
    refusal of a costlier request does not answer one of ``cost``, which may fit."""
    found = RUNTIME.refusals.recall(key, t)
    if found is None:
        return None
    elapsed, (c, r) = found
    if c.cost > cost:
        return None
    return r.counted_down(elapsed)
