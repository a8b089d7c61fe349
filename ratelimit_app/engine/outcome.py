"""What is left of a request's limits once they are decided: the :class:`Outcome`.

An entry point decides a request's limits (:func:`ratelimit_app.engine.enforce.decide`) and
gets back, besides an answer instead of the view (a 429, a 503), an outcome that finishes
the request after the view: it gives back the places in flight the request held (when its
response is done: now, or when a streaming response is closed; at once when the view
raised) and writes the ``RateLimit`` headers of every limit of the request, once, when this
layer is the outermost that shows them (:func:`show`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.http import HttpResponseBase

from ratelimit_app import request_state, responses
from ratelimit_app.engine.enforce import Decision, release_when_done, take_back

__all__ = ["NOTHING", "Outcome", "add_shown", "release", "show"]


class Outcome:
    """After the view: the places to give back (``held``) and, when this layer writes
    them, the decisions the ``RateLimit`` headers show (``shown``: None when another layer
    writes, or no headers)."""

    __slots__ = ("held", "request", "shown")

    def __init__(
        self,
        request: Any = None,
        shown: list[Decision] | None = None,
        held: Sequence[Decision] = (),
    ) -> None:
        self.request, self.shown, self.held = request, shown, held

    def finish(self, response: Any) -> Any:
        """``response`` once the view has answered: its places given back when it is done,
        its headers written."""
        if self.held:
            release_when_done(response, self.held)
        shown = self.shown
        if shown is not None:
            release(self.request, shown)
            add_shown(response, shown)
        return response

    def abort(self) -> None:
        """The view raised: give the places back now, and let the headers go."""
        if self.held:
            take_back(self.held)
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
