"""Refusals answered from this process's memory, and the due ones confirmed in one look."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ratelimit_app import clock
from ratelimit_app.config.limits import Check
from ratelimit_app.engine.checking import checking_many
from ratelimit_app.engine.refusals import remembered as memory
from ratelimit_app.engine.refusals.remembered import recalled, refusal_key
from ratelimit_app.engine.result import Result
from ratelimit_app.engine.trips import Checking
from ratelimit_app.exceptions import BackendError
from ratelimit_app.runtime import RUNTIME

#: Checks one look confirms at most: the request's due refusals and others due soon.
LOOK_BATCH = 256


class _Due(NamedTuple):
    """A remembered refusal whose cap ran out before its wait: ``slot`` is its place among
    the request's checks (None: another subject's, due soon)."""

    slot: int | None
    check: Check
    elapsed: float
    left: float
    result: Result


def recall_many(
    checks: Sequence[Check | None], t: float | None = None
) -> Checking[list[Result | None]]:
    """(A generator of :mod:`~ratelimit_app.engine.trips`: its look is a trip it yields.)
    The remembered refusals of the checks of one request (None: a check not to recall, or
    one not refused), with their waits counted down.

    When none is refused from memory but some are **due** (the memory's cap ran out before
    the wait: :meth:`~ratelimit_app.engine.refusals.memory.Memory.due`), they are confirmed in one
    round
    trip that only looks, together with the refusals due soon (up to :data:`LOOK_BATCH`): a
    botnet of refused subjects then costs a few looks per process per
    :data:`~.memory.REFUSAL_MEMORY`, not one per subject. Still no room: refused and remembered
    again; room after all (a reset or a rule changed elsewhere): forgotten. A look that
    fails confirms nothing: the caller's check decides (and meets the outage).
    """
    remembered = RUNTIME.refusals
    if not remembered:  # nothing refused lately, nothing to look up
        return [None] * len(checks)
    keys = [None if c is None else refusal_key(c) for c in checks]
    if not remembered.holds(keys):  # the common case: refusals, but not of these subjects
        return [None] * len(checks)
    if t is None:
        t = clock.now()
    found = [
        None if c is None or k is None else recalled(k, t, c.cost) for c, k in zip(checks, keys)
    ]
    if any(found):
        return found
    due = _due(checks, keys, t)
    if due:
        yield from _confirm(due, found, t)
    return found


def _due(
    checks: Sequence[Check | None], keys: Sequence[tuple[Any, ...] | None], t: float
) -> list[_Due]:
    """The request's counted checks that are due, and the refusals due soon."""
    due = []
    for i, (c, k) in enumerate(zip(checks, keys)):
        if c is not None and k is not None and c.increment:
            entry = RUNTIME.refusals.due(k, t)
            if entry is not None:
                elapsed, left, (_, r) = entry
                due.append(_Due(i, c, elapsed, left, r))
    if due:
        mine = [refusal_key(d.check) for d in due]
        soon = RUNTIME.refusals.soon(t, memory.REFUSAL_MEMORY / 2, LOOK_BATCH - len(due), mine)
        due += [_Due(None, c, elapsed, left, r) for _, elapsed, left, (c, r) in soon]
    return due


def _confirm(due: list[_Due], found: list[Result | None], t: float) -> Checking[None]:
    """Look at ``due`` in one round trip: remember again what is still refused (filling
    the request's own slots of ``found``), forget the rest."""
    remembered = RUNTIME.refusals
    # A refusal not known settled (remembered while its hits were recent) may be by now:
    # when the version counters vouch for the memory, the look reads its fine buckets too
    # (a second round trip, reads only; at most once per SETTLED seconds a subject), and a
    # settled one is held until it is no longer.
    after = memory.SETTLED
    exact = any(
        d.slot is not None and remembered.settles(refusal_key(d.check), t, after) for d in due
    )
    try:
        looks = [d.check._replace(increment=False) for d in due]
        seen = yield from checking_many(looks, exact=exact, at=t)
    except BackendError:
        return
    cap = memory.REFUSAL_MEMORY
    for d, look in zip(due, seen):
        key = refusal_key(d.check)
        if look.limited:
            now = d.result.counted_down(d.elapsed)
            settled = t + getattr(look, "settled", 0.0)
            remembered.remember(key, t, t + min(d.left, cap), (d.check, now), t + d.left, settled)
            if d.slot is not None:
                found[d.slot] = now
        else:
            remembered.forget([key])
