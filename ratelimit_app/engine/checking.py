"""Check several subjects (the limits of one request) in one backend round trip."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ratelimit_app import clock
from ratelimit_app.algorithms import gcra, windows
from ratelimit_app.backends import get_backend
from ratelimit_app.backends.base import Backend, MeterOp, Op
from ratelimit_app.conf import conf
from ratelimit_app.config.limits import Check
from ratelimit_app.engine import in_flight, leaky_bucket, sliding_window  # noqa: F401  (they register)
from ratelimit_app.engine.fallback import Fallback, fallback
from ratelimit_app.engine.refusals.remembered import remember
from ratelimit_app.engine.result import Result, banned
from ratelimit_app.engine.step import STEPS, CheckTime, Step
from ratelimit_app.engine.trips import Checking, Trip, run
from ratelimit_app.exceptions import BackendError
from ratelimit_app.identity.namespaces import namespace
from ratelimit_app.identity.provenance import page_sent
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.signals import backend_failed

logger = logging.getLogger("ratelimit_app")

TakeBack = Callable[[Sequence[Check], list[Result]], set[int]]


def _limited_counted(checks: Sequence[Check], results: list[Result]) -> set[int]:
    return {i for i, r in enumerate(results) if r.limited and checks[i].increment}


def check_many(
    checks: Sequence[Check],
    take_back: TakeBack = _limited_counted,
    exact: bool = True,
    at: float | None = None,
    request: Any = None,
) -> list[Result]:
    """:func:`checking_many`, run on this thread (:func:`~.trips.run`)."""
    return run(checking_many(checks, take_back, exact, at, request))


def checking_many(
    checks: Sequence[Check],
    take_back: TakeBack = _limited_counted,
    exact: bool = True,
    at: float | None = None,
    request: Any = None,
) -> Checking[list[Result]]:
    """Check several subjects in one backend round trip (a :class:`~.trips.Trip` it yields).

    When a check is over its limit, a second round trip takes back the hits that
    ``take_back`` names (default: the refused ones; a request refused by one limit may take
    back what the others counted) and, with ``exact``, reads what times the refusals' waits
    exactly. Refusals whose waits are exact are remembered (:mod:`.memory`). Raises
    ``BackendError``, and ``ImproperlyConfigured`` for a leaky bucket whose rates (from a
    callable) or burst do not make one. ``at``: the time of the check (default: now), for a
    caller with a clock of its own (DRF's ``timer``). ``request``: the request checked, if
    any; a refusal of it that a page made the browser send is no strike toward a ban
    (:func:`~ratelimit_app.identity.provenance.page_sent`).
    """
    moment = CheckTime(clock.now() if at is None else at)
    steps: list[Step] = []
    ops = []
    for c in checks:  # loops, not comprehensions (each a function call): on every request
        step = STEPS[c.algorithm](c, moment)
        steps.append(step)
        ops.append(step.op)
    return (yield from _run(checks, steps, ops, moment, take_back, exact, request))


def check_unless_banned(
    checks: Sequence[Check],
    take_back: TakeBack,
    at: float | None = None,
    request: Any = None,
    backend: Backend | None = None,
) -> Checking[tuple[Sequence[Result | None], bool]]:
    """:func:`checking_many` (``exact``), unless a subject is banned: then the banned results
    (None for the checks left unchecked) from the bans this process holds, with no round
    trip; and whether it was banned. The bans are looked up by the steps' namespaces, which
    the checks need anyway. ``backend``: where to count (default: the configured one; a
    fallback's memory, :mod:`.fallback`)."""
    moment = CheckTime(clock.now() if at is None else at)
    steps: list[Step] = []
    ops = []
    snap = RUNTIME.snapshot
    # Bans held: looked for in the loop that makes the namespaces.
    if snap is not None and snap.banning:
        rule, site = snap.bans.rule, snap.bans.site
        look = False
        for c in checks:  # (as check_many's)
            step = STEPS[c.algorithm](c, moment)
            steps.append(step)
            ops.append(step.op)
            # The crowd's case is neither: no ban under the namespace, no ban on every path
            # the limit could have made.
            if step.namespace in rule or (site and c.ban is not None):
                look = True
        if look:
            found = _banned_among(steps, moment.t, rule, site)
            if found is not None:
                return found, True
    else:
        for c in checks:
            step = STEPS[c.algorithm](c, moment)
            steps.append(step)
            ops.append(step.op)
    results = yield from _run(checks, steps, ops, moment, take_back, True, request, backend)
    return results, False


def _banned_among(
    steps: Sequence[Step], now: float, rule: dict[str, float], site: dict[str, float]
) -> list[Result | None] | None:
    """The banned results of a request's checks, made into ``steps`` (their namespaces are
    the bans' keys: :func:`ratelimit_app.bans.applied.ban_key`), from the bans this process
    holds (``rule``: a limit's own, by namespace; ``site``: on every path, by address): no
    round trip, no query. None when none is banned."""
    found: list[Result | None] | None = None
    for i, s in enumerate(steps):
        until = rule.get(s.namespace)
        if until is None and site:
            c = s.check
            if c.ban is not None and c.ban.site and c.subject[0] == "ip":
                until = site.get(c.subject[1])
        if until is not None and until > now:
            if found is None:
                found = [None] * len(steps)
            found[i] = banned(s.check, until - now)
    return found


def _run(
    checks: Sequence[Check],
    steps: list[Step],
    ops: list[Any],
    moment: CheckTime,
    take_back: TakeBack,
    exact: bool,
    request: Any,
    backend: Backend | None = None,
) -> Checking[list[Result]]:
    """The round trip of ``steps`` (and the second, when one is refused): their results.
    ``backend``: this process's memory during an outage (not timed as a round trip)."""
    if backend is not None:  # (the fallback's memory: no round trip to time)
        replies = yield Trip(backend, ops, moment.now_us)
    else:
        backend = get_backend()
        replies = yield from counted(backend, ops, moment.now_us)
    results = []
    limited = False
    for s, reply in zip(steps, replies):
        r = s.decide(reply)
        results.append(r)
        limited = limited or r.limited
    if not limited:  # the common case: nothing refused, one round trip
        return results
    return (yield from refused(checks, steps, results, backend, moment, take_back, exact, request))


def counted(backend: Backend, ops: list[Any], now_us: int) -> Checking[list[Any]]:
    """The replies of a check's round trip to the counters (``backend``, the configured
    one): its time told to the exporters' hooks, and an outage over when it answers."""
    trips = HOOKS.trips
    if trips:  # (none unless an exporter is installed): the trip's time told to them
        start = time.perf_counter()
        try:
            replies = yield Trip(backend, ops, now_us)
        except BackendError:
            _tell(backend, time.perf_counter() - start, True)
            raise
        seconds = time.perf_counter() - start
        for fn in trips:  # (_tell, inline: on every request with an exporter)
            try:
                fn(backend, seconds, False)
            except Exception:
                _tell(backend, seconds, False, after=fn)
                break
    else:
        replies = yield Trip(backend, ops, now_us)
    kept = RUNTIME.parts.get(Fallback)  # (fallback.recovered(), inline: every round trip)
    if kept is not None and kept.active:  # the server answers again
        kept.end()
    return replies


def refused(
    checks: Sequence[Check],
    steps: list[Step],
    results: list[Result],
    backend: Backend,
    moment: CheckTime,
    take_back: TakeBack,
    exact: bool,
    request: Any,
) -> Checking[list[Result]]:
    """The results of ``steps``, decided (``results``) and one or more refused: the hits
    ``take_back`` names taken back, and the refusals' waits timed, in a second round trip."""
    # A refused hit does not use up the quota: a client that keeps retrying gets in as soon
    # as the window has room. Counting first and taking back after keeps the check one round
    # trip for admitted hits and never lenient under concurrency.
    for i in take_back(checks, results):
        steps[i].take_back()
    return (yield from _second_trip(backend, steps, exact, moment, request))


class Hooks:
    """What the exporters (:mod:`ratelimit_app.operators.telemetry`) hooked into the engine: empty
    unless one is installed, and then a request pays one list test per hook. A hook must not
    raise; one that does is logged and left out."""

    __slots__ = ("exporter", "observers", "trips")

    def __init__(self) -> None:
        #: Functions told of every verdict, ``observer(verdict)``: the exporters' counters
        #: (:func:`ratelimit_app.engine.enforce.decide`).
        self.observers: list[Callable[[Any], None]] = []
        #: Functions told of every check's round trip, ``fn(backend, seconds, failed)``:
        #: the exporters' timings.
        self.trips: list[Callable[[Backend, float, bool], None]] = []
        #: The exporter whose hooks these are (None: none), so that connecting again
        #: connects nothing more.
        self.exporter: Any = None


#: The exporters' hooks in this process.
HOOKS = Hooks()


def _tell(backend: Backend, seconds: float, failed: bool, after: Any = None) -> None:
    """Tell each of ``HOOKS.trips`` of a round trip (``after``: one that just failed, which
    is removed; those before it were told)."""
    trips = HOOKS.trips
    hooks = list(trips)
    if after is not None:
        logger.error("ratelimit: round-trip observer %r failed; removed", after, exc_info=True)
        trips.remove(after)
        hooks = hooks[hooks.index(after) + 1 :]
    for fn in hooks:
        try:
            fn(backend, seconds, failed)
        except Exception:  # an exporter never fails a request
            logger.exception("ratelimit: round-trip observer %r failed; removed", fn)
            trips.remove(fn)


def _second_trip(
    backend: Backend, steps: list[Step], exact: bool, moment: CheckTime, request: Any = None
) -> Checking[list[Result]]:
    """The take-backs and exact reads of a call where someone was refused, and the count
    of each refusal of a limit that bans (its strike), in one round trip."""
    sent = [(s, op) for s in steps if (op := s.follow_up(exact)) is not None]
    striking = _striking(steps, request)
    strikes = [_strike(s.check, moment) for s in striking]
    # A strike is not remembered: each one must reach its count.
    timed = [s for s in steps if (s.check.ban is None or s not in striking) and s.exact_wait()]
    if sent or strikes:
        try:
            ops = [op for _, op in sent] + [op for op, _ in strikes]
            replies = yield Trip(backend, ops, moment.now_us)
        except BackendError as exc:
            # Whether the hits were taken back is unknown: leaving them counted is the safe
            # side (trying again could take them back twice, which would be lenient).
            logger.info("ratelimit: could not take back refused hits: %s", exc)
            return [s.result for s in steps]
        for (s, _), reply in zip(sent, replies[: len(sent)]):
            s.refine(reply)
        _count_strikes(striking, strikes, replies[len(sent) :], moment)
    remember([(s.check, s.result) for s in timed], moment.t)
    return [s.result for s in steps]


#: What a limit's strikes (refusals counted toward a ban) are scoped by, after its own scope.
STRIKES = "\x00strikes"


def _striking(steps: list[Step], request: Any) -> list[Step]:
    """The counted refusals of limits that ban, but those a page made the browser send
    (a stranger's page would get its readers banned): each is a strike. A site-wide ban
    counts only what the client asked for itself (``strict``)."""
    found = []
    for s in steps:
        spec = s.check.ban
        if spec is None or not s.check.increment or not s.result.limited:
            continue
        if not page_sent(request, spec.site):
            found.append(s)
    return found


def _count_strikes(
    striking: list[Step], strikes: list[tuple[Op, int]], replies: list[Any], moment: CheckTime
) -> None:
    """Mark each refusal whose strike brings its subject to its ban (``Result.reaches_ban``)."""
    for s, (op, after), reply in zip(striking, strikes, replies, strict=True):
        count = windows.evaluate(op.plan, reply, moment.t, True)[0].count
        s.result.reaches_ban = count >= after


def _strike(check: Check, moment: CheckTime) -> tuple[Op, int]:
    """The op that counts one refusal of ``check``'s subject toward its ban, and the count
    that bans."""
    spec = check.ban
    assert spec is not None
    made = sliding_window.plan((spec.strikes,), moment.t, moment.per_window, moment.hierarchical)
    return Op(namespace(check.scope + STRIKES, *check.subject), made, True), spec.after


def take_back(checks: Sequence[Check], results: Sequence[Result]) -> None:
    """:func:`taking_back`, run on this thread (:func:`~.trips.run`)."""
    run(taking_back(checks, results))


def taking_back(checks: Sequence[Check], results: Sequence[Result]) -> Checking[None]:
    """Take back the hits ``results`` counted and still hold, in one round trip: a
    failure-only limit's provisional hit when the request turned out not to be a failure.

    A leaky bucket's hit is taken back only if nothing has changed its bucket since (else it
    stays counted: the safe side). Raises ``BackendError``; either way the results hold
    nothing more to take back.
    """
    ops: list[Op | MeterOp] = []
    kept: list[Op | MeterOp] = []  # (counted in memory during an outage: given back there)
    for c, r in zip(checks, results):
        op = STEPS[c.algorithm].take_back_op(c, r, r.namespace)
        if op is not None:
            (kept if getattr(r, "in_memory", False) else ops).append(op)
        r.plan = r.reply = None
    now_us = gcra.micros(clock.now())
    if kept:
        fallback().memory.execute(kept, now_us)
    if ops:
        yield Trip(get_backend(), ops, now_us)


def charge(checks: Sequence[Check], hits: int, backend: Backend | None = None) -> None:
    """Add ``hits`` to each check's subject in one round trip, refused or not (what a request
    used, learnt after its view: :func:`ratelimit_app.engine.enforce.charge`). Nothing is
    taken back: a charge over the limit refuses the subject's next requests, whose own
    checks then time their waits. A leaky bucket's level rises by ``hits`` even past its
    capacity. ``backend``: where the checks counted (default: the configured one). Raises
    ``BackendError``."""
    moment = CheckTime(clock.now())
    ops = []
    for c in checks:
        ops.append(STEPS[c.algorithm].charge_op(c._replace(cost=hits), moment))
    (get_backend() if backend is None else backend).execute(ops, moment.now_us)


def report_failure(exc: BackendError) -> None:
    """Log and signal a backend failure, naming the servers the backend talks to (the
    backend itself may not exist: bad settings)."""
    alias = conf.USE_CACHE
    try:
        servers = ", ".join(s.name for s in get_backend(alias).servers)
    except Exception:  # bad settings, or a backend that cannot be built
        servers = ""
    where = f" ({servers})" if servers else ""
    logger.warning("ratelimit: counter backend %r%s failed: %s", alias, where, exc)
    backend_failed.send(sender=BackendError, alias=alias, error=exc)
