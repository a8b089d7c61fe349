"""``RatelimitMiddleware``: applies ``RATELIMIT_RULES`` and turns ``Ratelimited`` into a 429.

Per request:

1. Deny list: a denied IP or user gets 403 on every request, before any rule. An allowed IP
   or user skips every rule.
2. The rules that match the request (:class:`~ratelimit_app.config.rules.RuleSet`: a request no
rule
   covers costs a prefix test and nothing else). Emails on the lists are matched against
   the rules keyed on an email: a denied one gets 403, an allowed one skips those rules (the
   email is what the request claims, so the IP and user rules still apply).
3. Every matching rule is checked in **one** backend round trip
   (:func:`~ratelimit_app.engine.check_many`; leaky-bucket rules on memcached add a
   compare-and-set round trip), and every one counts the request. A limited blocking rule
   answers 429 (:mod:`~ratelimit_app.responses`) without calling the view, and the request
   then counts nowhere (the other rules' hits are taken back in the same second round trip
   that times the wait).
4. A ``count: "failures"`` rule's hit is provisional: after the view it is taken back
   (:func:`~ratelimit_app.engine.take_back`, one round trip) unless the request failed: a
   status in ``RATELIMIT_FAILURE_STATUSES`` (but the 403 of Django's CSRF check, which tried
   no password) or ``user_login_failed`` sent during the request (Django's ``LoginView``
   answers a wrong password with 200). Counting before the view is
   what keeps concurrent attempts within the limit: a rule that only looked before the view
   and counted after it would let any number of parallel attempts through.

Backend failures never raise: a rule fails open (default) or, with ``fail_open: False``,
answers ``RATELIMIT_FAIL_CLOSED_STATUS``. The sync and async paths share every step; the async
path runs a check on the event loop when it is a bounded round trip that touches no database
(memcached and Redis, keys that do not need ``request.user``), in a thread otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponse

from ratelimit_app import keys, responses, store
from ratelimit_app.backends import get_backend
from ratelimit_app.conf import conf, require_installed
from ratelimit_app.config.limits import Subjects
from ratelimit_app.config.rules import CompiledRule
from ratelimit_app.engine import enforce, screen
from ratelimit_app.engine.enforce import Decision
from ratelimit_app.engine.outcome import NOTHING, Outcome, show
from ratelimit_app.exceptions import Ratelimited

__all__ = ["RatelimitMiddleware"]


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
        check = rule.limit.check(request, subjects=subjects)
        if check is None:
            continue
        if emails and keys.is_email_kind(check.subject[0]):
            if check.subject[1] in current.deny.emails:
                return responses.denied(request)
            if check.subject[1] in current.allow.emails:
                continue
        d = Decision(rule.policy, check)  # (enforce.decisions, without a list a rule)
        found.append(d)
        if rule.failures_only:
            failing.append(d)
        if rule.holds:
            place = enforce.places(rule.policy, request, subjects)
            if place is not None:
                found.append(place)
    return found, failing


def before(
    request: HttpRequest, rules: Sequence[CompiledRule], current: store.Snapshot | None = None
) -> HttpResponse | Outcome | None:
    """Everything before the view: a response that answers instead of the view, what to do
    after it, or None (nothing to do). ``current``: the snapshot ``rules`` came from."""
    if current is None:
        current = store.current()
    subjects: Subjects = {}  # each key's subject, found once (the screen's address too)
    if current.screens:  # lists or site-wide bans (no call without)
        screened = screen.screen(request, current, rules, subjects)
        if screened is not None:
            return None if screened is screen.ALLOWED else screened
    found = _decisions(request, rules, current, subjects)
    if isinstance(found, HttpResponse):
        return found
    decisions, failing = found
    if not decisions:
        return None
    # Every rule counts the request in the check's own round trip. A failure-only rule's hit
    # is provisional: taken back after the view unless the request failed. So concurrent
    # attempts never pass the limit, and only requests that did not fail pay a second trip.
    verdict = enforce.decide(request, decisions, sender=RatelimitMiddleware)
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
    shown = show(request, verdict.shown) if conf.HEADERS else None
    held = enforce.holding(decisions) if current.rules.holds else ()
    provisional = [d for d in failing if d.provisional()] if failing else ()
    return Outcome(request, shown, held, provisional)


def _refused(request: HttpRequest, verdict: enforce.Verdict, refusing: Decision) -> HttpResponse:
    """The 429 of a refused request."""
    exc = responses.exception(refusing)
    response = responses.too_many_requests(request, exc, decision=refusing)
    if verdict.remembered:
        # A flood's repeats are counted (the signal, the rule's metrics series), not logged
        # one by one: django.request logged the refusal that started it.
        response._has_been_logged = True  # type: ignore[attr-defined]
    return response


class UsageByRule(Mapping[str, dict[str, Any]]):
    """``request.ratelimit_usage``: each rule checked for the request, and its usage dict
    (as ``get_usage`` returns it), made when read. Read it like a dict."""

    __slots__ = ("_by_name", "_decisions", "_earlier")

    def __init__(self, decisions: Sequence[Decision], earlier: Mapping[str, Any]) -> None:
        self._decisions = decisions
        self._by_name: dict[str, Decision] | None = None
        #: What an earlier pass of the middleware left on the request.
        self._earlier = earlier

    @property
    def _decided(self) -> dict[str, Decision]:
        """The decided rules by name (made when first read: most views never read it)."""
        if self._by_name is None:
            self._by_name = {d.name: d for d in self._decisions if d.result is not None}  # type: ignore[misc]
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
    held = request.__dict__  # (what an earlier pass left, read without getattr's calls)
    earlier = held.get("ratelimit_usage") or {}
    request.ratelimit_usage = UsageByRule(verdict.decisions, earlier)  # type: ignore[attr-defined]
    request.limited = verdict.limited or held.get("limited", False)  # type: ignore[attr-defined]


def _async_inline(rules: Sequence[CompiledRule]) -> bool:
    """True when the checks of ``rules`` may run on the event loop (see the module doc)."""
    current = store.current()
    if current.allow.users or current.deny.users or not all(r.limit.async_safe for r in rules):
        return False
    try:
        return get_backend().inline_ok
    except Exception:  # cannot be built: the check reports it, off the event loop
        return False


class RatelimitMiddleware:
    """Sync and async capable; both paths share :func:`before` and :func:`after`."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        require_installed("RatelimitMiddleware")
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    @staticmethod
    def _rules(request: HttpRequest) -> tuple[Sequence[CompiledRule], store.Snapshot] | None:
        """The matching rules and the snapshot they are from, or None when nothing applies
        (the fast path)."""
        if not conf.ENABLE:
            return None
        current = store.current()
        rules = current.rules.match(request)
        if rules:
            return rules, current
        deny = current.deny
        if deny.networks or deny.users or current.site_bans:
            return rules, current
        return None

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        matched = self._rules(request)
        if matched is None:
            return self.get_response(request)
        outcome = before(request, *matched)
        if outcome is None:
            return self.get_response(request)
        if isinstance(outcome, HttpResponse):
            return outcome
        if not outcome.provisional:  # no failure-only hit: whether it fails does not matter
            return outcome.finish(self.get_response(request))
        with outcome.tracking():
            response = self.get_response(request)
        return outcome.finish(response)

    async def __acall__(self, request: HttpRequest) -> Any:
        matched = self._rules(request)
        if matched is None:
            return await self.get_response(request)
        inline = _async_inline(matched[0])
        if inline:
            outcome = before(request, *matched)
        else:
            outcome = await sync_to_async(before)(request, *matched)
        if outcome is None:
            return await self.get_response(request)
        if isinstance(outcome, HttpResponse):
            return outcome
        with outcome.tracking():
            response = await self.get_response(request)
        if not inline and (outcome.provisional or outcome.held):  # the round trip, off the loop
            await sync_to_async(outcome.settle)(response)
        return outcome.finish(response)

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        """A ``Ratelimited`` raised by a decorated view becomes the same 429."""
        if isinstance(exception, Ratelimited | conf.EXCEPTION_CLASS):
            return responses.too_many_requests(request, exception)
        return None
