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
from collections.abc import Iterator, Sequence
from typing import Any

from django.contrib.auth.signals import user_login_failed
from django.dispatch import receiver
from django.http import HttpResponseBase

from ratelimit_app import request_state, responses
from ratelimit_app.conf import conf
from ratelimit_app.engine.enforce import Decision, release_when_done, take_back
from ratelimit_app.identity import provenance

__all__ = ["NOTHING", "Outcome", "add_shown", "release", "show"]


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
    """After the view: the places to give back (``held``), the provisional hits of
    failure-only limits (``provisional``: taken back unless the request failed) and, when
    this layer writes them, the decisions the ``RateLimit`` headers show (``shown``: None
    when another layer writes, or no headers)."""

    __slots__ = ("held", "marker", "provisional", "request", "shown")

    def __init__(
        self,
        request: Any = None,
        shown: list[Decision] | None = None,
        held: Sequence[Decision] = (),
        provisional: Sequence[Decision] = (),
    ) -> None:
        self.request, self.shown, self.held = request, shown, held
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
        provisional, held = self.provisional, self.held
        if not (provisional or held):
            return
        self.provisional = self.held = ()
        failing = list(provisional) if provisional and not self.failed(response) else []
        if held and getattr(response, "streaming", False):
            take_back(failing)
            release_when_done(response, held)
        else:
            take_back([*failing, *held])

    def finish(self, response: Any) -> Any:
        """``response`` once the view has answered: settled (:meth:`settle`), its headers
        written."""
        if self.provisional or self.held:
            self.settle(response)
        shown = self.shown
        if shown is not None:
            release(self.request, shown)
            add_shown(response, shown)
        return response

    def abort(self) -> None:
        """The view raised: give the places back now, and let the headers go."""
        if self.held:
            take_back(self.held)
            self.held = ()
        if self.shown is not None:
            release(self.request, self.shown)


#: The outcome of a request no limit applied to: nothing to do after the view.
NOTHING = Outcome()


def show(request: Any, decisions: Sequence[Decision]) -> list[Decision] | None:
    """Put ``decisions`` among those the request's ``RateLimit`` headers show.

    The rules, ``@ratelimit`` and the DRF throttles each call it (when ``RATELIMIT_HEADERS``
    is on) once they have decided, outermost first. The first caller of a request gets the
    list back and writes the headers after the view (:func:`add_shown`): by then it holds
    the limits of every layer inside it too, so a response shows all of them once. Later
    callers get None: an outer layer writes."""
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
