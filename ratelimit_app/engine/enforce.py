"""One way to check a request: every limit that applies to it, decided together.

The middleware (rules), ``@ratelimit``, ``get_usage`` / ``is_ratelimited`` and the DRF
throttles each say which limits apply (a :class:`Decision` each, made from the limit's own
:meth:`~ratelimit_app.config.limits.Limit.check`) and call :func:`decide`, which

1. answers from the refusal memory when a limit refused this subject lately (no round trip),
2. else answers from the bans this process holds when a limit banned its subject (no round
   trip), or checks every limit in one round trip
   (:func:`ratelimit_app.engine.checking.check_unless_banned`); a request that a blocking
   limit refuses counts in none of them,
3. reports a backend failure,
4. sends :data:`~ratelimit_app.signals.ratelimited` for each counted limit over its limit,

and returns a :class:`Verdict`. The adapters only translate it: a 429 or 503, an exception,
DRF's ``allow_request``, django-ratelimit's usage dict.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

from django.http import HttpRequest

from ratelimit_app import request_state, store
from ratelimit_app.algorithms.rates import MAX_COUNT
from ratelimit_app.backends import get_backend
from ratelimit_app.bans import applied as bans
from ratelimit_app.conf import conf
from ratelimit_app.config.limits import Check, Subjects
from ratelimit_app.config.policy import Policy
from ratelimit_app.engine import Result, report_failure, usage_dict
from ratelimit_app.engine import charge as charge_checks
from ratelimit_app.engine.checking import HOOKS, check_unless_banned, taking_back
from ratelimit_app.engine.fallback import fallback, falls_back
from ratelimit_app.engine.refusals.recall import recall_many
from ratelimit_app.engine.result import banned
from ratelimit_app.engine.trips import Checking, arun, run
from ratelimit_app.exceptions import BackendError
from ratelimit_app.overrides import applied as overrides
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.signals import ratelimited

__all__ = [
    "Decision",
    "Verdict",
    "adecide",
    "ataking_back",
    "charge",
    "decide",
    "deciding",
    "decisions",
    "holding",
    "places",
    "release_when_done",
    "take_back",
]

logger = logging.getLogger("ratelimit_app")

#: The kinds of subject that are the requester's own: the connection's address, the session's
#: user (a ``user`` or ``user_or_ip`` key of an anonymous request counts the address). Only
#: their counters are shown in an admitted response's headers: a value the request names
#: (an email, a form field, a header) may be anyone's, and its counter is not the
#: requester's to read (a login rule's counter would tell a stranger how many wrong
#: passwords an account had lately).
REQUESTER_KINDS = frozenset(["ip", "user", "user_or_ip"])


class Decision:
    """One limit's part of a verdict: its :class:`~ratelimit_app.config.policy.Policy`, its
    check of this request and its result.

    The policy's fields are read here as the decision's own: ``limit``, ``name`` (a rule's
    name, ``drf:<scope>``; None for a decorator's limit), ``blocks`` (its refusal refuses the
    request, which then counts nowhere), ``fail_open`` (what it does when the counters
    cannot be reached; the policy's None is ``RATELIMIT_FAIL_OPEN`` now), ``shadow`` (a dry
    run: it refuses nothing, and what it would
    refuse is counted as a refusal would be, its own hit taken back, logged at INFO and
    signalled: :attr:`shadowed`), ``failures_only``, ``sender`` (who sends its
    ``ratelimited`` signal; None: the sender :func:`decide` is given) and
    ``counts_requester`` (its subject is the requester itself, so its counter is shown on
    admitted responses; None: a subject of :data:`REQUESTER_KINDS`).
    """

    __slots__ = (
        "_usage",
        "blocks",
        "check",
        "counts_requester",
        "fail_open",
        "failures_only",
        "limit",
        "name",
        "policy",
        "refused",
        "result",
        "sender",
        "shadow",
        "shadowed",
        "shown",
    )

    def __init__(self, policy: Policy, check: Check) -> None:
        # Made for every limit of every request: one unpacking, nothing derived but the
        # fail-open default.
        self.policy, self.check = policy, check
        (
            self.limit,
            self.name,
            self.blocks,
            fail_open,
            self.shadow,
            self.failures_only,
            self.sender,
            self.counts_requester,
            _,
            _,
            _,
        ) = policy
        self.fail_open = conf.FAIL_OPEN if fail_open is None else fail_open
        #: None until decided, and when not checked (the backend failed, or another limit
        #: refused the request from memory).
        self.result: Result | None = None
        #: Over its limit (a non-blocking limit's refusal only marks the request).
        self.refused = False
        #: A dry run's refusal: over its limit, and admitted (:attr:`refused` stays False).
        self.shadowed = False
        #: Whether the response's ``RateLimit`` headers show its counter: the requester's
        #: own (:attr:`counts_requester`), and a refusal's.
        self.shown = False
        self._usage: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"Decision({self.name or self.limit.group!r}, {self.result!r})"

    def dry_run(self) -> bool:
        """True when it refuses nothing: a dry run (its policy's ``shadow``)."""
        return self.shadow

    def enforces(self) -> bool:
        """True when its refusal refuses the request (blocking, and no dry run)."""
        return self.blocks and not self.dry_run()

    @property
    def retry_after(self) -> float:
        """Seconds until it admits this subject again (0.0: it admits now)."""
        result = self.result
        return result.binding().retry_after if result is not None and result.limited else 0.0

    def usage(self) -> dict[str, Any] | None:
        """django-ratelimit's usage dict of the result, made once (None: not checked)."""
        if self._usage is None and self.result is not None:
            self._usage = usage_dict(self.result)
        return self._usage

    def provisional(self) -> bool:
        """True when its hit is counted and may still be taken back (:func:`take_back`)."""
        r = self.result
        return r is not None and (r.plan is not None or r.reply is not None)


class Verdict:
    """What :func:`decide` found: each limit's decision, whether the backend failed, and
    whether the answer came from the refusal memory."""

    __slots__ = ("decisions", "failed", "in_memory", "limited", "remembered", "shown")

    #: The policies of its limits when every one admitted a count and nothing more (the
    #: compiled path's :class:`~ratelimit_app.engine.compiled.Admitted`, whose decisions are
    #: made only when read); None here.
    plain: Sequence[Policy] | None = None

    def __init__(
        self,
        decisions: Sequence[Decision],
        failed: BackendError | None = None,
        remembered: bool = False,
        shown: list[Decision] | None = None,
        limited: bool = False,
        in_memory: bool = False,
    ) -> None:
        self.decisions = decisions
        self.failed = failed
        self.remembered = remembered
        #: The counters failed and the limits with a fallback were counted in this
        #: process's memory (:mod:`ratelimit_app.engine.fallback`).
        self.in_memory = in_memory
        #: The decisions whose counters the response's ``RateLimit`` headers show.
        self.shown = [] if shown is None else shown
        #: True when any limit is over (blocking or not).
        self.limited = limited

    def __repr__(self) -> str:
        return f"Verdict({list(self.decisions)!r}, failed={self.failed!r})"

    def refusing(self) -> Decision | None:
        """The blocking limit that refuses the request (the one that frees up last), or
        None: the request is admitted."""
        if not self.limited:
            return None
        found = [d for d in self.decisions if d.blocks and d.refused]
        if not found:
            return None
        return found[0] if len(found) == 1 else max(found, key=lambda d: d.retry_after)

    def closed(self) -> Decision | None:
        """When the backend failed: the first blocking limit that fails closed (the request
        is then answered as unavailable), or None."""
        if self.failed is None:
            return None
        for d in self.decisions:
            if d.blocks and not d.fail_open:
                return d
        return None


def decisions(
    policy: Policy,
    check: Check,
    request: HttpRequest,
    increment: bool = True,
    subjects: Subjects | None = None,
) -> list[Decision]:
    """The decisions of ``policy`` for a request whose check is ``check``: its own, then
    its places' in flight (``concurrent``) when the request counts and takes one."""
    found = [Decision(policy, check)]
    if increment and policy.places is not None:
        place = places(policy, request, subjects)
        if place is not None:
            found.append(place)
    return found


def places(
    policy: Policy, request: HttpRequest, subjects: Subjects | None = None
) -> Decision | None:
    """The decision of ``policy``'s places in flight (``concurrent``) for a request that
    counts, or None (no places, or no subject to hold one)."""
    in_flight = policy.places
    if in_flight is None:
        return None
    check = in_flight.limit.check(request, True, subjects=subjects)
    return None if check is None else Decision(in_flight, check)


def decide(
    request: HttpRequest,
    decisions: Sequence[Decision],
    sender: Any = None,
    at: float | None = None,
) -> Verdict:
    """:func:`deciding`, run on this thread (:func:`~ratelimit_app.engine.trips.run`)."""
    return run(deciding(request, decisions, sender, at))


async def adecide(
    request: HttpRequest,
    decisions: Sequence[Decision],
    sender: Any = None,
    at: float | None = None,
) -> Verdict:
    """:func:`deciding`, run on the event loop: its round trips are awaited
    (:func:`~ratelimit_app.engine.trips.arun`). For limits that read no database and call
    no user code (:attr:`~ratelimit_app.config.limits.Limit.async_safe`)."""
    return await arun(deciding(request, decisions, sender, at))


def deciding(
    request: HttpRequest,
    decisions: Sequence[Decision],
    sender: Any = None,
    at: float | None = None,
) -> Checking[Verdict]:
    """Decide ``decisions`` (each limit of ``request`` that applies) in one round trip, or
    from the refusal memory; send ``ratelimited`` for each counted refusal (``sender``: the
    adapter, as :mod:`ratelimit_app.signals` documents). ``at``: the time of the check, for
    a caller with a clock of its own (DRF's ``timer``). A refusal of a request a page made
    the browser send is no strike toward a ban (:mod:`ratelimit_app.identity.provenance`)."""
    if not conf.MIDDLEWARE_INSTALLED:  # the middleware keeps the configuration fresh
        store.current()  # (overrides and bans; at most a look a second at its version)
    # Per-subject overrides (an unlimited one leaves its limit out); no snapshot yet: none.
    if getattr(RUNTIME.snapshot, "overriding", False):
        decisions, checks = _overridden(request, decisions)
        if not decisions:
            return Verdict(decisions)
    else:
        checks = []
        for d in decisions:  # loops, not comprehensions (each a function call): every request
            checks.append(d.check)
    results: Sequence[Result | None] | None = None
    if RUNTIME.refusals.entries:  # (no call without refusals)
        results = yield from _recall(decisions, checks, at)
    remembered: bool | None = results is not None
    in_memory = False
    if results is None:  # checked, unless banned (then answered without a round trip)
        found = yield from _checked(request, decisions, checks, at)
        if type(found) is Verdict:  # the counters failed
            return found
        results, remembered = found  # type: ignore[misc]  # (not a Verdict: tested above)
        in_memory = remembered is None  # (counted in memory: see _checked)
    return verdict_of(request, decisions, results, remembered is True, in_memory, sender)


def verdict_of(
    request: HttpRequest,
    decisions: Sequence[Decision],
    results: Sequence[Result | None],
    remembered: bool,
    in_memory: bool,
    sender: Any,
) -> Verdict:
    """The verdict of ``decisions`` given their ``results`` (None: not checked), which
    came from the refusal memory or the bans held (``remembered``), or were counted in this
    process's memory (``in_memory``): each refusal followed through (a ban, a dry run's
    log) and signalled, the exporters told, the verdict kept on the request."""
    shown = []
    limited = False
    for d, result in zip(decisions, results):
        # A decision takes its result here, and what follows from it, once.
        d.result = result
        if result is None:  # not checked: another limit refused from memory
            d.refused = d.shown = False
            continue
        shows = d.counts_requester
        if shows is None:
            shows = d.check.subject[0] in REQUESTER_KINDS
        refused = result.limited
        if refused:  # (the common case makes no call)
            refused = _refusal(request, d)
        d.refused = refused
        d.shown = shows = shows or refused
        if shows:
            shown.append(d)
        if refused:
            limited = True
        if result.limited and d.check.increment:
            _signal(request, d, sender)
    verdict = Verdict(
        decisions, None, remembered, shown, limited, in_memory
    )  # (positional: every request)
    return delivered(request, verdict)


def delivered(request: HttpRequest, verdict: Verdict) -> Verdict:
    """``verdict`` of ``request`` told to the exporters and kept on the request (for
    :func:`charge`): the last step of every verdict that counted."""
    if HOOKS.observers:  # (none unless an exporter is installed)
        _observe(verdict)
    kept = request_state.state(request)  # the verdicts of the request, for charge()
    if kept is not None:
        if kept.verdicts is None:
            kept.verdicts = [verdict]
        else:
            kept.verdicts.append(verdict)
    return verdict


def _overridden(
    request: HttpRequest, decisions: Sequence[Decision]
) -> tuple[Sequence[Decision], list[Check]]:
    """``decisions`` with the overrides in force, and their checks. The crowd's subjects have
    none: one look-up of each value tells (:func:`~.overrides.prefilter`), in the loop that
    gathers the checks, and the table itself is asked only when one may."""
    known, asks = overrides.prefilter()
    checks = []
    for d in decisions:
        check = d.check
        kind, value = check.subject
        if value in known or kind in asks:
            decisions = overrides.apply(request, decisions)
            return decisions, [d.check for d in decisions]
        checks.append(check)
    return decisions, checks


def _checked(
    request: HttpRequest, decisions: Sequence[Decision], checks: list[Check], at: float | None
) -> Checking[tuple[Sequence[Result | None], bool | None] | Verdict]:
    """The results of ``checks`` and whether they came from the bans held, or, when the
    counters failed, the results of the limits that fall back, counted in memory (and None
    in place of that flag), or the failed verdict."""
    try:
        return (
            yield from check_unless_banned(
                checks, partial(refused_take_back, decisions), at, request
            )
        )
    except BackendError as exc:
        results = yield from _in_memory(request, decisions, checks, exc, at)
        return _failed(decisions, exc) if results is None else (results, None)


def failed_over(
    request: HttpRequest,
    decisions: Sequence[Decision],
    checks: list[Check],
    exc: BackendError,
    sender: Any,
) -> Checking[Verdict]:
    """The verdict of ``decisions`` (their ``checks``) when the counters failed (``exc``):
    the limits that fall back counted in this process's memory, or the failure reported."""
    results = yield from _in_memory(request, decisions, checks, exc, None)
    if results is None:
        return _failed(decisions, exc)
    return verdict_of(request, decisions, results, False, True, sender)


def _in_memory(
    request: HttpRequest,
    decisions: Sequence[Decision],
    checks: list[Check],
    exc: BackendError,
    at: float | None,
) -> Checking[list[Result | None] | None]:
    """The results of a request whose counters failed (``exc``), for the limits that fall
    back, counted in this process's memory (:mod:`ratelimit_app.engine.fallback`); None
    (not checked) for those that fail open. None when none falls back, or one that does not
    fails closed: the request is then failed as before."""
    falling = []
    for i, d in enumerate(decisions):
        if falls_back(d.policy.fallback):
            falling.append(i)
        elif d.blocks and not d.fail_open:
            return None
    if not falling:
        return None
    kept = fallback()
    if _outage():  # (a corrupt counter is one subject's data: counted, not announced)
        kept.start(exc)
    counted = [decisions[i] for i in falling]
    results, _ = yield from check_unless_banned(
        [checks[i] for i in falling], partial(refused_take_back, counted), at, request, kept.memory
    )
    found: list[Result | None] = [None] * len(decisions)
    for i, r in zip(falling, results, strict=True):
        if r is not None:
            r.in_memory = True
        found[i] = r
    return found


def _outage() -> bool:
    """True when the counters' backend has a server marked down, or none to mark (a Django
    cache): an outage, which the fallback announces. A reply that is one subject's corrupt
    data marks nothing: the next request reaches the server, and announcing it would make
    two log lines per such request."""
    try:
        servers = get_backend().servers
    except Exception:  # cannot be built: an outage of its own kind
        return True
    return not servers or any(s.dead_until for s in servers)


def _failed(decisions: Sequence[Decision], exc: BackendError) -> Verdict:
    """The verdict of a request whose counters failed, reported."""
    report_failure(exc)
    failed = Verdict(decisions, failed=exc)
    if HOOKS.observers:
        _observe(failed)
    return failed


ADMITTED = "admitted"
REFUSED = "refused"
BANNED = "banned"
SHADOW_REFUSED = "shadow_refused"
FAILED_OPEN = "failed_open"
FAILED_CLOSED = "failed_closed"
#: Decided on this process's memory while the counters were down (``fallback``).
FALLBACK_ADMITTED = "fallback_admitted"
FALLBACK_REFUSED = "fallback_refused"
#: Every outcome :func:`outcome` names.
OUTCOMES = (
    ADMITTED,
    REFUSED,
    BANNED,
    SHADOW_REFUSED,
    FAILED_OPEN,
    FAILED_CLOSED,
    FALLBACK_ADMITTED,
    FALLBACK_REFUSED,
)


def outcome(d: Decision, verdict: Verdict) -> str | None:
    """What ``d`` decided for its request, as the exporters count it (one of
    :data:`OUTCOMES`), or None when it was not decided (another limit refused the request
    from memory first)."""
    if verdict.failed is not None:
        return FAILED_OPEN if d.fail_open else FAILED_CLOSED
    result = d.result
    if result is None:
        return FAILED_OPEN if verdict.in_memory else None  # (a limit without a fallback)
    if d.refused:
        if result.banned:
            return BANNED
        return FALLBACK_REFUSED if verdict.in_memory else REFUSED
    if d.shadowed:
        return SHADOW_REFUSED
    return FALLBACK_ADMITTED if verdict.in_memory else ADMITTED


def limit_name(d: Decision) -> str:
    """The name a decision's limit is known by: a rule's name, ``drf:<scope>`` or a
    decorator's group."""
    return d.name or d.limit.group


def _observe(verdict: Verdict) -> None:
    for fn in HOOKS.observers:  # (no copy: one that fails is removed below, then the rest)
        try:
            fn(verdict)
        except Exception:  # an exporter never fails a request
            _observe_after(verdict, fn)
            return


def _observe_after(verdict: Verdict, failed: Any) -> None:
    """Remove the observer ``failed`` (it raised: logged), and tell those after it."""
    observers = HOOKS.observers
    logger.error("ratelimit: observer %r failed; removed", failed, exc_info=True)
    rest = observers[observers.index(failed) + 1 :]
    observers.remove(failed)
    for fn in rest:
        try:
            fn(verdict)
        except Exception:
            logger.exception("ratelimit: observer %r failed; removed", fn)
            observers.remove(fn)


def _refusal(request: Any, d: Decision) -> bool:
    """What a decision over its limit does: ban its subject when the refusal brings it to
    its limit's ban (its result then waits for the ban's end); refuse, unless it is a dry
    run (then logged)."""
    result, check = d.result, d.check
    dry = d.dry_run()
    if result is not None and result.reaches_ban and check.increment and not dry:
        seconds = bans.impose(d.name or d.limit.group, check, request)
        if seconds:
            d.result = banned(check, seconds)
    if not dry:
        return True
    d.shadowed = True
    if check.increment:
        _log_shadowed(request, d)
    return False


def _recall(
    decisions: Sequence[Decision], checks: list[Check], at: float | None
) -> Checking[Sequence[Result | None] | None]:
    """The results of a request refused from memory (None: not refused from memory).

    Only a counted limit whose refusal answers the whole request is recalled: a blocking
    one, or the only one. A non-blocking limit refused from memory would leave the others
    unchecked and the request, let through, uncounted; a look asks the counters."""
    alone = len(decisions) == 1
    wanted = [
        c if c.increment and (alone or d.enforces()) else None for c, d in zip(checks, decisions)
    ]
    found = yield from recall_many(wanted, at)
    return found if any(found) else None


def refused_take_back(
    decisions: Sequence[Decision], checks: Sequence[Check], results: list[Result]
) -> set[int]:
    """What a request takes back when refused: everything it counted when a blocking limit
    refuses it (a refused request counts nowhere), else only the refused hits (a
    non-blocking limit's own over-the-limit hit, a dry run's)."""
    refused = [i for i, r in enumerate(results) if r.limited]
    if any(decisions[i].enforces() for i in refused):
        return set(range(len(checks)))
    return set(refused)


def _log_shadowed(request: Any, d: Decision) -> None:
    """The INFO line of a dry run's refusal: the limit and the request, never the subject's
    value (its hashed namespace only)."""
    request = getattr(request, "_request", request)  # a DRF Request wraps Django's
    logger.info(
        "ratelimit: dry run: %s would refuse %s %s (subject %s)",
        d.name or d.limit.group,
        getattr(request, "method", ""),
        getattr(request, "path", ""),
        d.result.namespace if d.result is not None else "",
    )


def _signal(request: Any, d: Decision, sender: Any) -> None:
    """``ratelimited`` for a counted refusal (``rule`` only for a named limit, as
    :mod:`ratelimit_app.signals` documents; ``shadow=True`` for a dry run's)."""
    extra: dict[str, Any] = {} if d.name is None else {"rule": d.name}
    if d.shadowed:
        extra["shadow"] = True
    request = getattr(request, "_request", request)  # a DRF Request wraps Django's
    kept = request_state.state(request)
    before = None
    if kept is not None:  # (the subject's value, for *Refused lately*, while it is sent)
        before, kept.signalled = kept.signalled, d.check.subject
    try:
        ratelimited.send(
            sender=sender if d.sender is None else d.sender,
            group=d.limit.group,
            subject=d.result.namespace if d.result is not None else "",
            usage=d.usage(),
            request=request,
            **extra,
        )
    finally:
        if kept is not None:  # (a receiver's own check of this request signals inside)
            kept.signalled = before


def take_back(decisions: Sequence[Decision]) -> None:
    """:func:`ataking_back`'s work, on this thread: take back the provisional hits of
    ``decisions`` (failure-only limits of a request that did not fail; places in flight
    given back) in one round trip; a backend failure is reported (the hits then stay
    counted: the safe side)."""
    run(_taking_back(decisions))


async def ataking_back(decisions: Sequence[Decision]) -> None:
    """:func:`take_back`, its round trip awaited on the event loop."""
    await arun(_taking_back(decisions))


def _taking_back(decisions: Sequence[Decision]) -> Checking[None]:
    provisional = [d for d in decisions if d.provisional()]
    if not provisional:
        return
    try:
        yield from taking_back([d.check for d in provisional], [d.result for d in provisional])  # type: ignore[misc]
    except BackendError as exc:
        report_failure(exc)


def charge(request: Any, hits: int) -> int:
    """Add ``hits`` more to every limit that admitted ``request`` (counted it, did not
    refuse it), each in the request's own subject, in one round trip; the number of limits
    charged.

    What a view learns only once it has run (tokens used, rows exported): a charge that
    takes a subject over its limit refuses the subject's next requests, never this one. A
    failure-only limit and a dry run's refusal are passed by, and so is a limit two layers
    both decided (charged once). A backend failure is reported, not raised: the response is
    not failed for it."""
    if type(hits) is not int or not 0 <= hits <= MAX_COUNT:
        raise ValueError(
            f"charge(request, {hits!r}): the hits to add are an integer from 0 to {MAX_COUNT}."
        )
    checks: dict[tuple[Any, ...], Check] = {}
    kept: dict[tuple[Any, ...], Check] = {}  # (counted in memory during an outage)
    for verdict in _verdicts(request):
        for d in verdict.decisions:
            c = d.check
            if d.result is None or not c.increment or d.refused or d.shadowed:
                continue
            if d.limit.algorithm_kind.holds_places:  # a place is one request, whatever it used
                continue
            if not d.failures_only:
                into = kept if getattr(d.result, "in_memory", False) else checks
                into.setdefault((c.scope, c.subject, c.algorithm, c.burst), c)
    if not hits or not (checks or kept):
        return 0
    if kept:
        charge_checks(list(kept.values()), hits, fallback().memory)
    try:
        if checks:
            charge_checks(list(checks.values()), hits)
    except BackendError as exc:
        report_failure(exc)
    return len(checks) + len(kept)


def _verdicts(request: Any) -> list[Verdict]:
    """The verdicts :func:`decide` left on ``request`` (a DRF ``Request`` and the Django
    request it wraps both hold some)."""
    found: list[Verdict] = []
    for r in (request, getattr(request, "_request", None)):
        kept = request_state.of(r)
        if kept is not None and kept.verdicts:
            found += kept.verdicts
    return found


def holding(decisions: Sequence[Decision]) -> list[Decision]:
    """The in-flight places ``decisions`` hold: those of an admitted request (a refused one
    gave its place back already), to give back when its response is done."""
    return [d for d in decisions if d.limit.algorithm_kind.holds_places and d.provisional()]


def release_when_done(response: Any, held: Sequence[Decision]) -> None:
    """Give ``held`` places back when ``response`` is done: now for a response whose content
    is complete, when the server closes a streaming one (its stream ended, or the client
    went away). One round trip."""
    if not held:
        return
    if getattr(response, "streaming", False) and hasattr(response, "_resource_closers"):
        response._resource_closers.append(partial(take_back, list(held)))
    else:
        take_back(held)
