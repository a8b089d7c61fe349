"""What is left of a request's limits once they are decided: the :class:`Outcome`.

An entry point decides a request's limits (:func:`ratelimit_app.engine.enforce.decide`) and
gets back, besides an answer instead of the view (a 429, a 503), an outcome that finishes
the request after the view: it gives back the places in flight the request held (when its
response is done: now, or when a streaming response is closed; at once when the view
raised), takes back the provisional hits of failure-only limits unless the request failed
(:meth:`Outcome.failed`), and writes the ``RateLimit`` headers of every limit of the request,
once, when this layer is the outermost that shows them (:func:`show`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.contrib.auth.signals import user_login_failed
from django.dispatch import receiver
from django.http import HttpResponseBase

from ratelimit_app import request_state
from ratelimit_app.conf import conf
from ratelimit_app.config.limits import Check
from ratelimit_app.engine import enforce, responses
from ratelimit_app.engine.enforce import (
    Decision,
    Verdict,
    ataking_back,
    release_when_done,
    take_back,
)
from ratelimit_app.identity import provenance

__all__ = [
    "NOTHING",
    "Outcome",
    "add_shown",
    "decided_together",
    "release",
    "show",
    "shown_together",
    "view_outcome",
]


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


#: The marker of a request with no provisional hit: whether it fails is never read.
_UNREAD = _Failure()


class Outcome:
    """After the view: the places in flight to give back (``places``), the provisional hits
    of failure-only limits (``provisional``: taken back unless the request failed) and, when
    this layer writes them, the decisions the ``RateLimit`` headers show
    (``header_decisions``: None when another layer writes, or no headers)."""

    __slots__ = ("header_decisions", "marker", "places", "provisional", "request")

    def __init__(
        self,
        request: Any = None,
        header_decisions: list[Decision] | None = None,
        places: Sequence[Decision] = (),
        provisional: Sequence[Decision] = (),
    ) -> None:
        self.request, self.header_decisions, self.places = request, header_decisions, places
        self.provisional = provisional
        self.marker = _Failure() if provisional else _UNREAD

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        """Around the view of a request with provisional hits: a ``user_login_failed``
        sent meanwhile (Django's ``LoginView`` answers a wrong password with 200) makes it
        a failed request."""
        token = _current_failure.set(self.marker)
        try:
            yield
        finally:
            _current_failure.reset(token)

    def failed(self, response: Any) -> bool:
        """A wrong password (``user_login_failed``), or a failure status, but the 403 of
        Django's CSRF check: a form another site submitted tried no password."""
        if self.marker.failed:
            return True
        if response.status_code not in conf.FAILURE_STATUSES:
            return False
        return not provenance.csrf_refused(self.request, response)

    def settle(self, response: Any) -> None:
        """The round trip after the view, once: the provisional hits taken back unless the
        request failed, the places given back when the response is done."""
        now, later = self._settled(response)
        if now:
            take_back(now)
        if later:
            release_when_done(response, later)

    async def asettle(self, response: Any) -> None:
        """:meth:`settle`, its round trip awaited on the event loop."""
        now, later = self._settled(response)
        if now:
            await ataking_back(now)
        if later:
            release_when_done(response, later)

    def _settled(self, response: Any) -> tuple[list[Decision], Sequence[Decision]]:
        """What :meth:`settle` takes back now, and the places it gives back when a
        streaming response ends; nothing the second time."""
        provisional, places = self.provisional, self.places
        if not (provisional or places):
            return [], ()
        self.provisional = self.places = ()
        failing = list(provisional) if provisional and not self.failed(response) else []
        if places and getattr(response, "streaming", False):
            return failing, places
        return [*failing, *places], ()

    def finish(self, response: Any) -> Any:
        """``response`` once the view has answered: settled (:meth:`settle`), its headers
        written."""
        if self.provisional or self.places:
            self.settle(response)
        shown = self.header_decisions
        if shown is not None:
            release(self.request, shown)
            add_shown(response, shown)
        return response

    def abort(self) -> None:
        """The view raised: give the places back now, and let the headers go."""
        if self.places:
            take_back(self.places)
            self.places = ()
        if self.header_decisions is not None:
            release(self.request, self.header_decisions)


#: The outcome of a request no limit applied to: nothing to do after the view.
NOTHING = Outcome()


def show(request: Any, decisions: Sequence[Decision]) -> list[Decision] | None:
    """Put ``decisions`` among those the request's ``RateLimit`` headers show.

    The rules, ``@ratelimit`` and the DRF throttles each call it once they have decided,
    outermost first. The first caller of a request gets the list back and writes the
    headers after the view (:func:`add_shown`): by then it holds the limits of every layer
    inside it too, so a response shows all of them once. Later callers get None: an outer
    layer writes."""
    kept = request_state.state(getattr(request, "_request", request))  # (DRF wraps Django's)
    if kept is None:  # a request that takes no attribute
        return list(decisions)
    if kept.shown is not None:
        kept.shown.extend(decisions)
        return None
    kept.shown = list(decisions)
    return kept.shown


def release(request: Any, shown: list[Decision] | None = None) -> None:
    """Forget the request's shown decisions once their writer is done with them (``shown``:
    only when they are these), so a request object that is passed to a view again (tests
    do) starts afresh."""
    request = getattr(request, "_request", request)
    kept = getattr(request, "__dict__", {}).get(request_state.ATTRIBUTE)  # (of(), inline)
    if kept is not None and (shown is None or kept.shown is shown):
        kept.shown = None


def add_shown(response: Any, shown: list[Decision] | None) -> Any:
    """Add the ``RateLimit`` headers of ``shown`` (:func:`show`'s list) to ``response``,
    unless the view set its own."""
    if shown and isinstance(response, HttpResponseBase):
        responses.add_headers(response, responses.decision_headers(shown))  # type: ignore[arg-type]
    return response


def view_outcome(
    request: Any, verdict: Verdict | None, blocks: bool, holds: bool
) -> HttpResponseBase | Outcome:
    """What a decorated view's request gets from its limit's ``verdict`` (None: no limit
    applied, or it failed open), with ``request.limited`` set as django-ratelimit sets it:
    the 503 of a blocking limit that failed closed (the counters are down: the client did
    nothing wrong), the refusal raised (``RATELIMIT_EXCEPTION_CLASS``) when it ``blocks``,
    else what to do after the view (``holds``: it gives back places in flight)."""
    already = getattr(request, "limited", False)
    if verdict is None:
        request.limited = already
        return NOTHING
    if verdict.failed is not None:
        request.limited = True
        return responses.unavailable(request) if blocks else NOTHING
    request.limited = verdict.limited or already
    refusing = verdict.refusing() if verdict.limited else None
    if refusing is not None and blocks:
        raise responses.exception(refusing)
    shown = show(request, verdict.shown)
    places = enforce.holding(verdict.decisions) if holds else ()
    if shown is None and not places:
        return NOTHING
    return Outcome(request, shown, places)


# -- limits decided together: a DRF view's throttles ------------------------------------------


class _Together:
    """What the limits of one view decided together share on the request: each decision
    waiting for its asker, with the verdict it is part of; and the decisions they show."""

    __slots__ = ("shown", "waiting")

    def __init__(self) -> None:
        self.waiting: dict[Check, list[tuple[Decision, Verdict]]] = {}
        self.shown: list[Decision] | None = None


def decided_together(
    request: Any, decision: Decision, together: Callable[[], list[Decision]], at: float | None
) -> tuple[Decision, Verdict]:
    """``decision`` decided, with its verdict. The request's first asker decides every
    decision ``together()`` makes (``decision`` among them) in one check and leaves the
    others on the request (:mod:`ratelimit_app.request_state`) for their askers, in turn; a
    decision that was not among them is decided alone."""
    kept = request_state.of(request)
    shared = None if kept is None else kept.throttles
    if shared is not None:
        waiting = shared.waiting.get(decision.check)
        if waiting:
            return waiting.pop(0)
        batch = [decision]
    else:
        batch = together()
        shared = _Together()
        kept = request_state.state(request)  # (None: a request that takes no attribute)
        if kept is not None:
            kept.throttles = shared
    made = [d.check for d in batch]  # as made: an override may replace a decision's check
    asked = decision.check
    verdict = enforce.decide(request, batch, at=at)
    for check, d in zip(made, batch, strict=True):
        shared.waiting.setdefault(check, []).append((d, verdict))
    return shared.waiting[asked].pop(0)


def shown_together(request: Any, headers: Any, decision: Decision) -> None:
    """Show ``decision`` (when :attr:`~ratelimit_app.engine.enforce.Decision.shown`) in the
    ``RateLimit`` headers, through ``headers`` (a dict the view's response gets, DRF's
    ``view.headers``), once for all the decisions decided together with it; unless a layer
    outside writes (:func:`show`), which then gets them."""
    kept = request_state.of(request)
    shared = None if kept is None else kept.throttles
    if not isinstance(headers, dict) or shared is None:
        return
    shown = [decision] if decision.shown else []
    if shared.shown is not None:  # the first decision shown took the writing
        shared.shown.extend(shown)
    else:
        shared.shown = show(request, shown)
        if shared.shown is None:  # an outer layer writes
            return
        release(request)  # the view's response is DRF's to finalise: nothing outer writes
    if shared.shown:
        headers.update(responses.decision_headers(shared.shown))
