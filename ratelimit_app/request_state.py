"""What the limiter keeps on a request while it is served: one private attribute.

The layers of a request (the middleware, ``@ratelimit``, the DRF throttles, the request's
keys) pass nothing to each other through request attributes but this one,
:data:`ATTRIBUTE`, which holds a :class:`RequestState`. Besides it a request gets only
django-ratelimit's public ``request.limited`` and ``request.ratelimit_usage``.

A DRF ``Request`` and the Django request it wraps each hold their own state: the throttles of
one DRF view share theirs on the DRF request (a Django request passed to a second view starts
afresh), everything else is kept on the Django request.

A leaf: it imports nothing of the package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ATTRIBUTE", "RequestState", "of", "state"]

#: The one attribute the limiter sets on a request (besides ``limited`` and
#: ``ratelimit_usage``).
ATTRIBUTE = "_ratelimit"


class RequestState:
    """What the layers of one request share. Each field starts as its class's None, so
    making one (on every rate-limited request) sets nothing."""

    #: Every verdict decided for the request (``charge()`` adds to their limits).
    verdicts: list[Any] | None = None
    #: The decisions the response's ``RateLimit`` headers show, gathered from every layer;
    #: None until a layer shows some (the first one writes the headers).
    shown: list[Any] | None = None
    #: What a DRF view's throttles decided together (set on the DRF ``Request``).
    throttles: Any = None
    #: The body as a JSON object once parsed for a key (a sentinel when it is none).
    json: Any = None
    #: ``(kind, value)`` of the refusal whose ``ratelimited`` signal is being sent, for our
    #: own receiver that shows it (*Refused lately*): the signal itself carries the hashed
    #: subject only, and deriving the value again from the request costs a crowd's 429 a
    #: second reading of its key.
    signalled: tuple[str, str] | None = None


def of(request: Any) -> RequestState | None:
    """The state ``request`` holds (None: none yet, or a request that takes no attribute).
    Read from the instance's own attributes: DRF's ``Request`` answers a missing attribute
    by raising twice, which would cost more than the rest."""
    found: RequestState | None = getattr(request, "__dict__", {}).get(ATTRIBUTE)
    return found


def state(request: Any) -> RequestState | None:
    """The state of ``request``, made on first use; None for a request that takes no
    attribute (nothing is then shared)."""
    held = getattr(request, "__dict__", None)
    if held is None:
        return None
    found: RequestState | None = held.get(ATTRIBUTE)
    if found is None:
        found = held[ATTRIBUTE] = RequestState()
    return found
