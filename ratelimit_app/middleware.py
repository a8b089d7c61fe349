"""``RatelimitMiddleware``: applies ``RATELIMIT_RULES`` and turns ``Ratelimited`` into a 429.

An adapter: per request it finds the rules that match
(:class:`~ratelimit_app.config.rules.RuleSet`: a request no rule covers costs a prefix test
and nothing else) and hands them to the engine (:func:`ratelimit_app.engine.matched.before`:
lists, bans, one round trip for every rule, the 429 or 503), then runs the view and lets the
engine's :class:`~ratelimit_app.engine.outcome.Outcome` finish (failure-only hits, places in
flight, the ``RateLimit`` headers). The sync and async paths share every step; the async
path checks on the event loop, its round trips awaited
(:func:`~ratelimit_app.engine.matched.abefore`), when
:func:`~ratelimit_app.engine.matched.on_the_loop` says so, in a thread otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponse

from ratelimit_app import store
from ratelimit_app.conf import conf, require_installed
from ratelimit_app.config.rules import CompiledRule
from ratelimit_app.engine import responses
from ratelimit_app.engine.matched import UsageByRule, abefore, before, on_the_loop
from ratelimit_app.exceptions import Ratelimited

__all__ = ["RatelimitMiddleware", "UsageByRule"]


class RatelimitMiddleware:
    """Sync and async capable; both paths share the engine's
    :func:`~ratelimit_app.engine.matched.before` and its outcome."""

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
        outcome = before(request, *matched, RatelimitMiddleware)
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
        inline = on_the_loop((r.limit for r in matched[0]), screened=matched[1])
        if inline:
            outcome = await abefore(request, *matched, RatelimitMiddleware)
        else:
            outcome = await sync_to_async(before)(request, *matched, RatelimitMiddleware)
        if outcome is None:
            return await self.get_response(request)
        if isinstance(outcome, HttpResponse):
            return outcome
        with outcome.tracking():
            response = await self.get_response(request)
        if outcome.provisional or outcome.places:  # the round trip after the view
            if inline:
                await outcome.asettle(response)
            else:
                await sync_to_async(outcome.settle)(response)
        return outcome.finish(response)

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        """A ``Ratelimited`` raised by a decorated view becomes the same 429."""
        if isinstance(exception, Ratelimited | conf.EXCEPTION_CLASS):
            return responses.too_many_requests(request, exception)
        return None
