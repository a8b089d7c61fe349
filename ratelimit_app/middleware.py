"""``RatelimitMiddleware``: applies ``RATELIMIT_RULES`` and turns ``Ratelimited`` into a 429.

Per request:

1. Deny list: a denied IP or user gets 403 on every request, before any rule. An allowed IP
   or user skips every rule.
2. The rules that match the request (:class:`~ratelimit_app.rules.RuleSet`: a request no rule
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
   status in ``RATELIMIT_FAILURE_STATUSES`` or ``user_login_failed`` sent during the request
   (Django's ``LoginView`` answers a wrong password with 200). Counting before the view is
   what keeps concurrent attempts within the limit: a rule that only looked before the view
   and counted after it would let any number of parallel attempts through.

Backend failures never raise: a rule fails open (default) or, with ``fail_open: False``,
answers ``RATELIMIT_FAIL_CLOSED_STATUS``. The sync and async paths share every step; the async
path runs a check on the event loop when it is a bounded round trip that touches no database
(memcached and Redis, keys that do not need ``request.user``), in a thread otherwise.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.contrib.auth.signals import user_login_failed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

from ratelimit_app import keys, responses, store
from ratelimit_app.backends import get_backend
from ratelimit_app.conf import conf
from ratelimit_app.engine import (
    REFUSALS,
    Check,
    Result,
    check_many,
    recall_many,
    report_failure,
    take_back,
    usage_dict,
)
from ratelimit_app.exceptions import BackendError, Ratelimited
from ratelimit_app.rules import Rule
from ratelimit_app.signals import ratelimited

__all__ = ["RatelimitMiddleware"]


class _Failure:
    """Set when ``user_login_failed`` is sent while the request is handled."""

    __slots__ = ("failed",)

    def __init__(self) -> None:
        self.failed = False


_current_failure: contextvars.ContextVar[_Failure | None] = contextvars.ContextVar(
    "ratelimit_failure", default=None
)


@receiver(user_login_failed, dispatch_uid="ratelimit_app.login_failed")
def _login_failed(**kwargs: Any) -> None:
    marker = _current_failure.get()
    if marker is not None:
        marker.failed = True


@contextlib.contextmanager
def _tracking(marker: _Failure) -> Iterator[None]:
    token = _current_failure.set(marker)
    try:
        yield
    finally:
        _current_failure.reset(token)


@dataclasses.dataclass(slots=True)
class _Pending:
    """What is left to do after the view: headers to add, and the provisional hits of
    failure-only rules to take back if the request does not fail."""

    policies: list[tuple[str | None, dict[str, Any]]]
    provisional: list[tuple[Check, Result]] = dataclasses.field(default_factory=list)
    marker: _Failure = dataclasses.field(default_factory=_Failure)

    def failed(self, response: HttpResponse) -> bool:
        return self.marker.failed or response.status_code in conf.FAILURE_STATUSES

    def to_take_back(self, response: HttpResponse) -> list[tuple[Check, Result]]:
        """The provisional hits to take back: all of them, unless the request failed."""
        if not self.provisional or self.failed(response):
            return []
        return self.provisional


def _exception(usage: dict[str, Any] | None, rule: str | None) -> Exception:
    exc = conf.EXCEPTION_CLASS()
    with contextlib.suppress(AttributeError):  # a custom class may use __slots__
        exc.usage = usage  # type: ignore[attr-defined]
        exc.rule = rule  # type: ignore[attr-defined]
    return exc


def before(
    request: HttpRequest, rules: Sequence[Rule], current: store.Snapshot | None = None
) -> HttpResponse | _Pending | None:
    """Everything before the view: a response that answers instead of the view, what to do
    after it, or None (nothing to do). ``current``: the snapshot ``rules`` came from."""
    if current is None:
        current = store.current()
    allow, deny = current.allow, current.deny
    if allow.networks or allow.users or deny.networks or deny.users:
        # The connection's address and the session's user are the client's own: an allowed
        # one skips every rule, a denied one is refused everywhere.
        address = keys.client_address(request) if allow.networks or deny.networks else None
        if deny.has_ip(address) or deny.has_user(request):
            return responses.denied(request)
        if rules and (allow.has_ip(address) or allow.has_user(request)):
            return None
    checks: list[Check] = []
    used: list[Rule] = []
    all_block = True  # every rule used blocks
    # Rules keyed alike (two rules on the IP) count one value: found once.
    subjects: dict[Any, tuple[str, str]] = {}
    for rule in rules:
        limit = rule.limit
        rate_list = limit.static_rates
        if rate_list is None:
            rate_list = limit.rates_for(request)
            scope = limit.scope_for(rate_list) if rate_list else ""
        else:
            scope = limit.static_scope or limit.scope_for(rate_list)
        if not rate_list:
            continue
        key = limit.key
        subject = subjects.get(key) if limit.shares_value else None
        if subject is None:
            subject = subjects[key] = keys.subject(key, limit.group, request)
        if (allow.emails or deny.emails) and keys.is_email_kind(subject[0]):
            # An email is a claim the request makes, not the client's identity: a denied one
            # is refused, an allowed one lifts the limits keyed on it, not the others.
            if subject[1] in deny.emails:
                return responses.denied(request)
            if subject[1] in allow.emails:
                continue
        # Every rule counts the request in the check's own round trip. A failure-only rule's
        # hit is provisional: taken back after the view unless the request failed. So
        # concurrent attempts never pass the limit, and only requests that did not fail pay
        # a second round trip.
        checks.append(
            Check(
                scope,
                subject,
                rate_list,
                True,
                limit.algorithm,
                limit.burst,
            )
        )
        used.append(rule)
        if not rule.block:
            all_block = False
    if not checks:
        return None
    results: Sequence[Result | None] | None = None
    remembered: list[Result | None] = []
    if REFUSALS:
        # A subject this process refused, whose wait has not ended: refused again from
        # memory by a blocking rule, with no round trip (refusals.py says why that is safe).
        remembered = recall_many(
            checks
            if all_block
            else [c if r.block else None for c, r in zip(checks, used, strict=True)]
        )
        if any(remembered):
            results = remembered
    if results is None:

        def take_back(checks: Sequence[Check], results: list[Result]) -> set[int]:
            # A request a blocking rule refuses counts nowhere; otherwise only refused hits
            # are taken back (a non-blocking rule's own over-the-limit hit).
            if any(r.limited and rule.block for r, rule in zip(results, used, strict=True)):
                return set(range(len(checks)))
            return {i for i, r in enumerate(results) if r.limited}

        try:
            results = check_many(checks, take_back=take_back)
        except BackendError as exc:
            report_failure(exc)
            closed = [rule for rule in used if rule.block and not rule.fail_open]
            if closed:
                return responses.unavailable(request, closed[0].name)
            return _Pending([])
    policies: list[tuple[str | None, dict[str, Any]]] = []
    blocking: list[tuple[Rule, dict[str, Any]]] = []
    request_usage = getattr(request, "ratelimit_usage", None) or {}
    limited = False
    for rule, check, result in zip(used, checks, results, strict=True):
        if result is None:  # not checked: another rule refused from memory
            continue
        usage = usage_dict(result)
        request_usage[rule.name] = usage
        if check.subject[0] in responses.OWN_KINDS:
            policies.append((rule.name, usage))
        if result.limited:
            limited = True
            ratelimited.send(
                sender=RatelimitMiddleware,
                group=rule.group,
                rule=rule.name,
                subject=result.namespace,
                usage=usage,
                request=request,
            )
            if rule.block:
                blocking.append((rule, usage))
    request.ratelimit_usage = request_usage  # type: ignore[attr-defined]
    request.limited = limited or getattr(request, "limited", False)  # type: ignore[attr-defined]
    if blocking:
        rule, usage = max(blocking, key=lambda b: b[1]["retry_after"])
        response = responses.too_many_requests(
            request, _exception(usage, rule.name), usage, rule.name
        )
        if remembered is results:
            # A flood's repeats are counted (the signal, the rule's metrics series), not
            # logged one by one: django.request logged the refusal that started it.
            response._has_been_logged = True  # type: ignore[attr-defined]
        return response
    provisional = [
        (c, r)
        for c, r, rule in zip(checks, results, used, strict=True)
        if r is not None and rule.failures_only and (r.plan is not None or r.reply is not None)
    ]
    return _Pending(policies if conf.HEADERS else [], provisional)


def after(request: HttpRequest, pending: _Pending, response: HttpResponse) -> HttpResponse:
    """Everything after the view: take back provisional hits, add the RateLimit headers."""
    settle(pending.to_take_back(response))
    if pending.policies:
        responses.add_headers(response, pending.policies)
    return response


def settle(provisional: list[tuple[Check, Result]]) -> None:
    """Take back the provisional hits of a request that did not fail; a backend failure
    is reported (the hits then stay counted: the safe side)."""
    if not provisional:
        return
    checks, results = zip(*provisional, strict=True)
    try:
        take_back(checks, results)
    except BackendError as exc:
        report_failure(exc)


def _async_inline(rules: Sequence[Rule]) -> bool:
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
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    @staticmethod
    def _rules(request: HttpRequest) -> tuple[Sequence[Rule], store.Snapshot] | None:
        """The matching rules and the snapshot they are from, or None when nothing applies
        (the fast path)."""
        if not conf.ENABLE:
            return None
        current = store.current()
        rules = current.rules.match(request)
        if rules:
            return rules, current
        deny = current.deny
        if deny.networks or deny.users:
            return rules, current
        return None

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        matched = self._rules(request)
        if matched is None:
            return self.get_response(request)
        pending = before(request, *matched)
        if pending is None:
            return self.get_response(request)
        if isinstance(pending, HttpResponse):
            return pending
        if not pending.provisional:  # no failure-only hit: whether it fails does not matter
            return after(request, pending, self.get_response(request))
        token = _current_failure.set(pending.marker)
        try:
            response = self.get_response(request)
        finally:
            _current_failure.reset(token)
        return after(request, pending, response)

    async def __acall__(self, request: HttpRequest) -> Any:
        matched = self._rules(request)
        if matched is None:
            return await self.get_response(request)
        inline = _async_inline(matched[0])
        if inline:
            pending = before(request, *matched)
        else:
            pending = await sync_to_async(before)(request, *matched)
        if pending is None:
            return await self.get_response(request)
        if isinstance(pending, HttpResponse):
            return pending
        with _tracking(pending.marker):
            response = await self.get_response(request)
        if not inline:
            await sync_to_async(settle)(pending.to_take_back(response))
            pending.provisional = []
        return after(request, pending, response)

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        """A ``Ratelimited`` raised by a decorated view becomes the same 429."""
        if isinstance(exception, Ratelimited | conf.EXCEPTION_CLASS):
            usage = getattr(exception, "usage", None)
            return responses.too_many_requests(
                request, exception, usage, getattr(exception, "rule", None)
            )
        return None
