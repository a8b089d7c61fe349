"""The places of an in-flight limit (``concurrent``): sliding windows of
:class:`~ratelimit_app.algorithms.rates.Slots`, made by the limit itself, never named by a
project (the engine's step: :mod:`ratelimit_app.engine.in_flight`)."""

from __future__ import annotations

from ratelimit_app.algorithms import gcra
from ratelimit_app.config.kinds.base import register
from ratelimit_app.config.kinds.sliding_window import SlidingWindow


@register
class InFlight(SlidingWindow):
    """A request holds a place while it runs; an override leaves places as they are."""

    name = gcra.IN_FLIGHT
    label = "in flight"
    offered = False
    holds_places = True
