"""The rules' path: what the rules a request matched decide, before and after the view.

:class:`~ratelimit_app.middleware.RatelimitMiddleware` matches the request's rules
(:class:`~ratelimit_app.config.rules.RuleSet`) and calls :func:`before`, which does the rest:

1. Deny list: a denied IP or user gets 403 on every request, before any rule; an allowed IP
   or user skips every rule (:mod:`.screen`, with the bans on every path). Emails on the
   lists are matched against the rules keyed on an email: a denied one gets 403, an allowed
   one skips those rules (the email is what the request claims, so the IP and user rules
   still apply).
2. Every matching rule is checked in **one** backend round trip
   (:func:`~ratelimit_app.engine.check_many`; leaky-bucket rules on memcached add a
   compare-and-set round trip), and every one counts the request. A limited blocking rule
   answers 429 (:mod:`~ratelimit_app.engine.responses`) without calling the view, and the request
   then counts nowhere (the other rules' hits are taken back in the same second round trip
   that times the wait).
3. A ``count: "failures"`` rule's hit is provisional: after the view it is taken back
   (:class:`~.outcome.Outcome`, one round trip) unless the request failed: a status in
   ``RATELIMIT_FAILURE_STATUSES`` (but the 403 of Django's CSRF check, which tried no
   password) or ``user_login_failed`` sent during the request (Django's ``LoginView``
   answers a wrong password with 200). Counting before the view is what keeps concurrent
   attempts within the limit: a rule that only looked before the view and counted after it
   would let any number of parallel attempts through.

Backend failures never raise: a rule fails open (default) or, with ``fail_open: False``,
answers 503. :func:`on_the_loop` says when an async request's check may run on the event
loop (a bounded round trip that touches no database), for the rules and ``@ratelimit``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from django.http import HttpRequest, HttpResponse

from ratelimit_app import clock, store
from ratelimit_app.backends import get_backend
from ratelimit_app.config.limits import Limit, Subjects
from ratelimit_app.config.rules import CompiledRule
from ratelimit_app.engine import compiled, enforce, responses, screen
from ratelimit_app.engine.enforce import Decision
from ratelimit_app.engine.outcome import NOTHING, Outcome, show
from ratelimit_app.engine.refusals.remembered import unsettle
from ratelimit_app.engine.trips import Checking, arun, run
from ratelimit_app.identity import keys
from ratelimit_app.runtime import RUNTIME

__all__ = ["UsageByRule", "abefore", "before", "on_the_loop"]


def _decisions(
    request: HttpRequest,
    rules: Sequence[CompiledRule],
    current: store.Snapshot,
    subjects: Subjects,
) -> tuple[list[Decision], list[Decision]] | HttpResponse:
    """The decision of each rule that applies (a callable rate may say none) and those of
    the failure-only rules among them, or the 403 of an email on the deny list. An email is
    a claim the request makes, not the client's identity: an allowed one lifts the rules
    keyed on it, not the others. ``subjects``: the request's subjects found so far, by key
    (rules keyed alike, two on the IP, count one value)."""
    emails = current.allow.emails or current.deny.emails
    found = []
    failing = []
    for rule in rules:
        # What the request is to the rule first (its check, and its places' in flight),
        # then what the rule decides with it.
        check = rule.limit.check(request, subjects=subjects)
        if check is None:
            continue
        in_flight = rule.policy.places
        place = (
            None if in_flight is None else in_flight.limit.check(request, True, subjects=subjects)
        )
        if emails and keys.is_email_kind(check.subject[0]):
            if check.subject[1] in current.deny.emails:
                return responses.denied(request)
            if check.subject[1] in current.allow.emails:
                continue
        d = Decision(rule.policy, check)  # (enforce.decisions, without a list a rule)
        found.append(d)
        if rule.failures_only:
            failing.append(d)
        if in_flight is not None and place is not None:
            found.append(Decision(in_flight, place))  # (enforce.places, the check made above)
    return found, failing


def before(
    request: HttpRequest,
    rules: Sequence[CompiledRule],
    current: store.Snapshot | None = None,
    sender: Any = None,
) -> HttpResponse | Outcome | None:
    """Everything before the view: a response that answers instead of the view, what to do
    after it, or None (nothing to do). ``current``: the snapshot ``rules`` came from;
    ``sender``: the sender of the ``ratelimited`` signal (the middleware's class)."""
    return run(_before(request, rules, current, sender))


async def abefore(
    request: HttpRequest,
    rules: Sequence[CompiledRule],
    current: store.Snapshot | None = None,
    sender: Any = None,
) -> HttpResponse | Outcome | None:
    """:func:`before` on the event loop, its round trip awaited (for rules
    :func:`on_the_loop` allows)."""
    return await arun(_before(request, rules, current, sender))


def _before(
    request: HttpRequest,
    rules: Sequence[CompiledRule],
    current: store.Snapshot | None,
    sender: Any,
) -> Checking[HttpResponse | Outcome | None]:
    if current is None:
        current = store.current()
    subjects: Subjects = {}  # each key's subject, found once (the screen's address too)
    if current.screens:  # lists or site-wide bans (no call without)
        screened = screen.screen(request, current, rules, subjects)
        if screened is not None:
            return None if screened is screen.ALLOWED else screened
    failing: Sequence[Decision]
    if compiled.applies(rules, current):  # rules that only count (most): nothing general
        verdict = yield from compiled.deciding(request, rules, subjects, sender)
        failing = ()
    else:
        found = _decisions(request, rules, current, subjects)
        if isinstance(found, HttpResponse):
            return found
        decisions, failing = found
        if not decisions:
            return None
        # Every rule counts the request in the check's own round trip. A failure-only rule's
        # hit is provisional: taken back after the view unless the request failed. So
        # concurrent attempts never pass the limit, and only requests that did not fail pay
        # a second trip.
        verdict = yield from enforce.deciding(request, decisions, sender)
        if failing and verdict.limited:  # (its hits go down before its waits end)
            unsettle([d.check for d in failing])
    if verdict.failed is not None:
        closed = verdict.closed()
        return NOTHING if closed is None else responses.unavailable(request, closed)
    _mark(request, verdict)
    refusing = verdict.refusing() if verdict.limited else None
    if refusing is not None:
        return _refused(request, verdict, refusing)
    # The rules' limits first; the layers inside (``@ratelimit``, DRF throttles) add theirs
    # to the same list before the view answers, and this pass writes them all.
    # (The list itself, even empty: the inner layers fill it.)
    shown = show(request, verdict.shown)
    places: Sequence[Decision] = ()
    if current.rules.holds and type(verdict) is not compiled.Admitted:  # (plain: no places)
        places = enforce.holding(verdict.decisions)
    provisional = [d for d in failing if d.provisional()] if failing else ()
    return Outcome(request, shown, places, provisional)


def _refused(request: HttpRequest, verdict: enforce.Verdict, refusing: Decision) -> HttpResponse:
    """The 429 of a refused request."""
    exc = responses.exception(refusing)
    response = responses.too_many_requests(request, exc, decision=refusing)
    if verdict.remembered or RUNTIME.refusals.in_flood(clock.now()):
        # A flood's refusals are counted (the signal, the rule's metrics series, *Refused
        # lately*), not logged one by one: django.request logged those before it (a crowd
        # of subjects, each refused once, would otherwise write a line a refusal).
        response._has_been_logged = True  # type: ignore[attr-defined]
    return response


class UsageByRule(Mapping[str, dict[str, Any]]):
    """``request.ratelimit_usage``: each rule checked for the request, and its usage dict
    (as ``get_usage`` returns it), made when read. Read it like a dict."""

    __slots__ = ("_by_name", "_earlier", "_verdict")

    def __init__(self, verdict: enforce.Verdict, earlier: Mapping[str, Any]) -> None:
        #: The rules' verdict (its decisions made when read: the compiled path's are).
        self._verdict = verdict
        self._by_name: dict[str, Decision] | None = None
        #: What an earlier pass of the middleware left on the request.
        self._earlier = earlier

    @property
    def _decided(self) -> dict[str, Decision]:
        """The decided rules by name (made when first read: most views never read it)."""
        if self._by_name is None:
            self._by_name = {d.name: d for d in self._verdict.decisions if d.result is not None}  # type: ignore[misc]
        return self._by_name

    def __getitem__(self, name: str) -> dict[str, Any]:
        d = self._decided.get(name)
        if d is None:
            found: dict[str, Any] = self._earlier[name]
            return found
        usage = d.usage()
        assert usage is not None  # only decided limits are listed
        return usage

    def __iter__(self) -> Iterator[str]:
        decided = self._decided
        yield from (n for n in self._earlier if n not in decided)
        yield from decided

    def __len__(self) -> int:
        decided = self._decided
        return len(decided) + sum(1 for n in self._earlier if n not in decided)

    def __repr__(self) -> str:
        return repr(dict(self))


def _mark(request: HttpRequest, verdict: enforce.Verdict) -> None:
    """``request.ratelimit_usage`` and ``request.limited``, for the view (docs/rules:
    "Rules that do not block")."""
    kept = request.__dict__  # (what an earlier pass left, read without getattr's calls)
    earlier = kept.get("ratelimit_usage") or {}
    request.ratelimit_usage = UsageByRule(verdict, earlier)  # type: ignore[attr-defined]
    request.limited = verdict.limited or kept.get("limited", False)  # type: ignore[attr-defined]


def on_the_loop(limits: Iterable[Limit], screened: store.Snapshot | None = None) -> bool:
    """True when the checks of ``limits`` may run on the event loop, their round trips
    awaited (:func:`abefore`, :func:`~ratelimit_app.engine.enforce.adecide`): they read no
    database and call no user code (keys that do not need ``request.user``, no ban to
    write; ``screened``: the snapshot whose lists the request passes first, which then
    name no user). Else the check runs in a thread, as a sync view's does."""
    if not all(lim.async_safe for lim in limits):
        return False
    if screened is not None and (screened.allow.users or screened.deny.users):
        return False
    try:
        get_backend()
    except Exception:  # cannot be built: the check reports it, off the event loop
        return False
    return True
