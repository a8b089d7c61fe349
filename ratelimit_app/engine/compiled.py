"""The compiled path: limits that only count, checked with nothing general.

Most limits count a sliding window and do nothing more (a *plain* one,
:attr:`~ratelimit_app.config.policy.Policy.plain`: its own rates and cost, no ban, no places
in flight, no failure-only count, no dry run). What such a limit's check needs beside the
subject is made once: its scope, rates and cost with the limit, and its plan for the current
fine bucket in the runtime (:func:`~.sliding_window.current_plan`). So while nothing in force
could change their answer (no override, the uniform layout: :func:`usable`; for rules also
no email on the lists: :func:`applies`), plain limits are checked here with only their
subjects' work: each subject, its namespace, its op, one round trip, and each reply counted
by the limit's plan. The rules' path takes it for a request whose rules are all plain
(:func:`deciding`), a single limit's (``get_usage``, ``@ratelimit``:
:func:`ratelimit_app.core.limit_verdicting`) for a plain limit that counts
(:func:`checking`).

It is the same check as the general path's (:func:`~ratelimit_app.engine.enforce.deciding`),
made of the same parts: the ops sent are the steps' ops, the trip is
:func:`~.checking.counted`. A request every limit admits gets an :class:`Admitted` verdict,
whose decisions and results are made only when read, as
:func:`~ratelimit_app.engine.enforce.verdict_of` makes them; the general objects take over
where anything more than an admitted count happens: a refused request becomes steps
(:meth:`~.sliding_window.SlidingWindow.decided`) for the general second trip
(:func:`~.checking.refused`) and its verdict is ``verdict_of``'s; a subject with a ban held
or a refusal remembered goes to the general path before any round trip (which answers it
from the ban or the memory), a failure to its fallback
(:func:`~ratelimit_app.engine.enforce.failed_over`). ``tests/ratelimit/test_compiled.py``
holds both paths to the same answers.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from functools import partial
from typing import Any

from django.http import HttpRequest

from ratelimit_app import clock, store
from ratelimit_app.algorithms import windows
from ratelimit_app.algorithms.calendar import Quota
from ratelimit_app.algorithms.rates import Rate
from ratelimit_app.algorithms.windows import Plan, Usage
from ratelimit_app.backends import get_backend
from ratelimit_app.backends.base import Op
from ratelimit_app.config.kinds import DEFAULT
from ratelimit_app.config.limits import Check, Subjects
from ratelimit_app.config.policy import Policy
from ratelimit_app.config.rules import CompiledRule
from ratelimit_app.engine import enforce
from ratelimit_app.engine.checking import counted, refused
from ratelimit_app.engine.enforce import REQUESTER_KINDS, Decision, Verdict
from ratelimit_app.engine.refusals.remembered import refusal_key
from ratelimit_app.engine.responses import limit_policy
from ratelimit_app.engine.result import Result
from ratelimit_app.engine.sliding_window import SlidingWindow, current_plan
from ratelimit_app.engine.step import CheckTime
from ratelimit_app.engine.trips import Checking
from ratelimit_app.exceptions import BackendError
from ratelimit_app.identity.namespaces import namespace
from ratelimit_app.runtime import COMPILED_MEMO, RUNTIME

__all__ = ["Admitted", "Prepared", "applies", "checking", "deciding", "usable"]

_tuple = tuple.__new__
#: A check's subject (``Check.subject``).
_SUBJECT = operator.itemgetter(1)


def usable() -> bool:
    """True while nothing in force could change a plain limit's answer but what
    :func:`checking` asks of each subject (a ban held, a refusal remembered): no override,
    the uniform layout."""
    return not (windows.HIERARCHICAL or getattr(RUNTIME.snapshot, "overriding", False))


def applies(rules: Sequence[CompiledRule], current: store.Snapshot) -> bool:
    """True when ``rules`` (a request's, from ``current``) are checked on the compiled path:
    each is plain, nothing in force could change their answer (:func:`usable`), and no
    email is on the lists (an email's rules may be lifted)."""
    if not rules or current.allow.emails or current.deny.emails or not usable():
        return False
    for rule in rules:  # noqa: SIM110  (a loop, not all() of a generator: every request)
        if not rule.plain:
            return False
    return True


def deciding(
    request: HttpRequest, rules: Sequence[CompiledRule], subjects: Subjects, sender: Any
) -> Checking[Verdict]:
    """The verdict of ``rules`` (:func:`applies`) for ``request``, as
    :func:`~ratelimit_app.engine.enforce.deciding` gives it: their ops made here from the
    rule set as :class:`Prepared` for the current fine buckets, in one pass (a function,
    not a generator: one level less on every trip), their checks only if something reads
    them. ``subjects``: the request's subjects found so far, by key; ``sender``: the
    ``ratelimited`` signal's."""
    moment = CheckTime(clock.now())
    t = moment.t
    ruleset = rules if type(rules) is tuple else tuple(rules)  # (kept by its rules)
    prepared: Prepared | None = RUNTIME.compiled.get(ruleset)
    if (
        prepared is None
        or not prepared.since <= t < prepared.until
        or prepared.per_window != moment.per_window
    ):
        prepared = Prepared.made(ruleset, moment)
    found: list[tuple[str, str]] = []  # each rule's subject
    ops: list[Op] = []
    refusals = RUNTIME.refusals.entries  # (a site that refused anyone lately holds some)
    snap = RUNTIME.snapshot
    bans = snap.bans.rule if snap is not None and snap.banning else None
    general = False  # a refusal remembered or a ban held may answer: the general path's
    for (limit, scope, rates, cost), made in zip(prepared.limits, prepared.plans):
        if limit.shares_value:  # (Limit.check's, for the limit's own rates and cost)
            key = limit.key
            subject = subjects.get(key)
            if subject is None:
                subject = subjects[key] = limit.subject_of(limit.group, request)
        else:
            subject = limit.subject_of(limit.group, request)
        found.append(subject)
        ns = namespace(scope, *subject)
        if (
            refusals
            and refusal_key(Prepared.check(limit, scope, rates, cost, subject)) in refusals
        ):
            general = True  # (a flood's)
        elif bans is not None and ns in bans:
            general = True
        ops.append(_tuple(Op, (ns, made, True, None, cost)))
    if general:
        checks = prepared.checks(found)
        return enforce.deciding(request, _decisions(prepared.policies, checks), sender)
    return _counting(request, prepared.policies, None, ops, found, sender, moment, prepared)


class Prepared:
    """A rule set's plain rules as their checks share them, whoever the subject: each
    rule's limit, counters (scope), rates and cost, its policy, the ``RateLimit-Policy``
    entry of its rates, and its plan for the current fine buckets. Kept by the rules (in
    ``RUNTIME.compiled``: at most one per set of rules a request matches, bounded by the
    configuration) and made again when a fine bucket of one of its rates begins or ends
    (:attr:`since`, :attr:`until`) or the layout changes; a rule set with a calendar quota
    is made for each request (a period is no fine bucket)."""

    __slots__ = ("headers", "limits", "per_window", "plans", "policies", "since", "until")

    def __init__(self, rules: Sequence[CompiledRule], moment: CheckTime) -> None:
        #: Each rule's limit, scope, rates and cost (a plain limit's own).
        self.limits: list[tuple[Any, str, tuple[Rate, ...], int]] = []
        self.policies: list[Policy] = []
        #: Each rule's RateLimit-Policy entry and its rates' names in the RateLimit header.
        self.headers: list[tuple[str, tuple[str, ...]]] = []
        #: Each rule's plan at ``moment``, as :func:`~.sliding_window.current_plan` makes it.
        self.plans: list[Plan] = []
        t, per_window = moment.t, moment.per_window
        #: The layout's buckets per window, and the times its plans hold for.
        self.per_window = per_window
        self.since, self.until = -math.inf, math.inf
        for rule in rules:
            limit = rule.limit
            scope, rates, cost = limit.static_scope, limit.static_rates, limit.static_cost
            # (A plain limit's own scope, rates and cost.)
            assert scope is not None
            assert rates is not None
            assert cost is not None
            self.limits.append((limit, scope, rates, cost))
            self.policies.append(rule.policy)
            self.headers.append(limit_policy(rule.policy.name, scope, rates, None))
            self.plans.append(current_plan(scope, rates, moment))
            for rate in rates:
                if type(rate) is Quota:  # (never held: made for each request)
                    self.since, self.until = math.inf, -math.inf
                    continue
                since, until = windows.fine_bucket(rate.seconds, t, per_window)
                self.since, self.until = max(self.since, since), min(self.until, until)

    @staticmethod
    def check(
        limit: Any, scope: str, rates: tuple[Rate, ...], cost: int, subject: tuple[str, str]
    ) -> Check:
        """The check of one of its rules (``limit``'s own ``scope``, ``rates`` and ``cost``)
        for ``subject``, as :meth:`~ratelimit_app.config.limits.Limit.check` makes it."""
        return _tuple(Check, (scope, subject, rates, True, DEFAULT, limit.burst, cost, None))

    def checks(self, subjects: Sequence[tuple[str, str]]) -> list[Check]:
        """Its rules' checks for ``subjects`` (one each, in order)."""
        return [Prepared.check(*entry, subject) for entry, subject in zip(self.limits, subjects)]

    @classmethod
    def made(cls, rules: tuple[CompiledRule, ...], moment: CheckTime) -> Prepared:
        """``rules`` prepared at ``moment``, kept for the requests that follow."""
        prepared = cls(rules, moment)
        memo = RUNTIME.compiled
        if len(memo) >= COMPILED_MEMO:
            memo.clear()
        memo[rules] = prepared
        return prepared


def checking(
    request: HttpRequest, policies: Sequence[Policy], checks: Sequence[Check], sender: Any
) -> Checking[Verdict]:
    """The verdict of plain limits (``policies``, each :attr:`~.Policy.plain`) whose
    ``checks`` count ``request`` (while :func:`usable`), as
    :func:`~ratelimit_app.engine.enforce.deciding` gives it: :class:`Admitted` when every
    limit admits it. A subject whose refusal this process remembers, or whose namespace a
    ban holds, is the general path's, which answers it from memory or from the ban."""
    refusals = RUNTIME.refusals.entries
    if refusals:
        for check in checks:
            if refusal_key(check) in refusals:
                return enforce.deciding(request, _decisions(policies, checks), sender)
    moment = CheckTime(clock.now())
    ops = _ops(checks, moment)
    if ops is None:
        return enforce.deciding(request, _decisions(policies, checks), sender)
    found = list(map(_SUBJECT, checks))  # (in C: no comprehension's call on every check)
    return _counting(request, policies, checks, ops, found, sender, moment, None)


def _counting(
    request: HttpRequest,
    policies: Sequence[Policy],
    checks: Sequence[Check] | None,
    ops: list[Op],
    subjects: Sequence[tuple[str, str]],
    sender: Any,
    moment: CheckTime,
    prepared: Prepared | None,
) -> Checking[Verdict]:
    """The verdict of ``ops`` at ``moment``, the counts of ``subjects`` no refusal is
    remembered of and no ban holds: their ``checks``, or None for a rule set's, made from
    ``prepared`` only when something reads them."""
    try:
        backend = get_backend()  # (one that cannot be built is a failure too)
        replies = yield from counted(backend, ops, moment.now_us)
    except BackendError as exc:
        checks = _checks(checks, prepared, subjects)
        decisions = _decisions(policies, checks)
        return (yield from enforce.failed_over(request, decisions, list(checks), exc, sender))
    headers = prepared.headers if prepared is not None else None
    counts, shown, limited = _evaluated(
        policies, checks, ops, replies, subjects, moment.t, headers
    )
    if not limited:  # (every limit's count admitted: no decision made, none read yet)
        made = (policies, checks, ops, counts, prepared, subjects)
        return enforce.delivered(request, Admitted(made, shown))
    checks = _checks(checks, prepared, subjects)
    decisions = _decisions(policies, checks)
    results = _results(ops, counts)
    steps: list[Any] = []
    for op, check, r in zip(ops, checks, results):
        steps.append(SlidingWindow.decided(check, moment, op, r))
    undo = partial(enforce.refused_take_back, decisions)
    results = yield from refused(checks, steps, results, backend, moment, undo, True, request)
    return enforce.verdict_of(request, decisions, results, False, False, sender)


def _checks(
    checks: Sequence[Check] | None,
    prepared: Prepared | None,
    subjects: Sequence[tuple[str, str]],
) -> Sequence[Check]:
    """``checks``, or (None) the checks of ``prepared``'s rules for ``subjects``."""
    if checks is not None:
        return checks
    assert prepared is not None  # (a rule set's checks are made when read)
    return prepared.checks(subjects)


def _ops(checks: Sequence[Check], moment: CheckTime) -> list[Op] | None:
    """The op of each check at ``moment``, or None when a ban held may answer one of them
    (the general path's to decide)."""
    per_window = moment.per_window
    ticks = moment.t * per_window  # (a fine bucket's index: ticks // a rate's seconds)
    plans = RUNTIME.plans
    ops: list[Op] = []
    snap = RUNTIME.snapshot
    bans = snap.bans.rule if snap is not None and snap.banning else None
    for check in checks:
        # (A plain limit's check has its rates and cost: Policy.plain.)
        scope, rates = check.scope, check.rates
        ns = namespace(scope, *check.subject)
        if bans is not None and ns in bans:
            return None
        # The limit's plan for its fine bucket (current_plan's look, inline: one rate).
        found = plans.get(scope) if len(rates) == 1 else None
        if (
            found is not None
            and found[0] == int(ticks // rates[0].seconds)
            and found[1] == per_window
        ):
            made = found[2]
        else:
            made = current_plan(scope, rates, moment)
        ops.append(_tuple(Op, (ns, made, True, None, check.cost)))
    return ops


def _evaluated(
    policies: Sequence[Policy],
    checks: Sequence[Check] | None,
    ops: Sequence[Op],
    replies: Sequence[list[int]],
    subjects: Sequence[tuple[str, str]],
    t: float,
    headers: Sequence[tuple[str, tuple[str, ...]]] | None,
) -> tuple[list[list[Usage]], list[Any], bool]:
    """Each op's usages from its reply at ``t``; the entries the ``RateLimit`` headers show
    (:func:`~ratelimit_app.engine.enforce.verdict_of`'s choice, for an admitted request:
    each limit's ``RateLimit-Policy`` entry, place and usages); whether any limit is over.
    ``headers``: each limit's entry (a rule set's, prepared), or None: made from its check.
    """
    counts: list[list[Usage]] = []
    shown: list[Any] = []
    limited = False
    for enforced, op, reply, subject in zip(policies, ops, replies, subjects):
        usages = windows.evaluate(op.plan, reply, t, True, op.amount)
        counts.append(usages)
        if usages[0].limited if len(usages) == 1 else any([u.limited for u in usages]):
            limited = True
        shows = enforced.counts_requester
        if shows is None:
            shows = subject[0] in REQUESTER_KINDS
        if shows:
            at = len(counts) - 1  # (its place among the limits)
            if headers is not None:
                header = headers[at]
            else:  # (a single limit's: no rule set prepared)
                assert checks is not None
                check = checks[at]
                header = limit_policy(enforced.name, check.scope, check.rates, None)
            shown.append((header, at, usages))
    return counts, shown, limited


def _decisions(policies: Sequence[Policy], checks: Sequence[Check]) -> list[Decision]:
    """A decision of each policy, with its check."""
    return [Decision(enforced, check) for enforced, check in zip(policies, checks)]


def _results(ops: Sequence[Op], counts: Sequence[list[Usage]]) -> list[Result]:
    """The results of counted ``ops``, from their usages ``counts``: each holding its plan
    (what a take-back undoes)."""
    results = []
    for op, usages in zip(ops, counts):
        r = Result(usages, op.namespace)
        r.plan = op.plan
        results.append(r)
    return results


class Admitted(Verdict):
    """The verdict of plain limits that each admitted their count (:func:`checking`): what
    the request's answer reads is made at once (nothing limited or failed; the limits the
    ``RateLimit`` headers show, as entries of
    :func:`~ratelimit_app.engine.responses.decision_headers`, and the limits' policies for the
    exporters, :attr:`plain`), its :attr:`decisions` and their results only when read
    (``request.ratelimit_usage``, ``charge()``, ``get_usage``): most requests never do. Read
    they are the general path's, as :func:`~ratelimit_app.engine.enforce.verdict_of` makes
    them."""

    __slots__ = ("_made", "plain")

    def __init__(self, made: tuple[Any, ...], shown: list[Any]) -> None:
        self.failed = None
        self.remembered = self.limited = self.in_memory = False
        #: Its limits' policies, checks (None: a rule set's, made when read), ops, usages,
        #: rule set (:class:`Prepared`, or None) and subjects, as counted.
        self._made = made
        self.plain = made[0]
        self.shown = shown

    def __getattr__(self, name: str) -> Any:
        """Its :attr:`decisions`, made when first read (an unset slot): each limit's
        decision with its result, admitted, as the general path makes them."""
        if name != "decisions":
            raise AttributeError(name)
        policies, checks, ops, counts, prepared, subjects = self._made
        made = _decisions(policies, _checks(checks, prepared, subjects))
        entries: list[Any] = self.shown  # (the headers' entries: policy, place, usages)
        shown = {entry[1] for entry in entries}
        for at, (d, r) in enumerate(zip(made, _results(ops, counts))):
            d.result = r
            d.shown = at in shown
        self.decisions = made
        return made
