"""Sliding-window rate limiting for Django on multi-level time buckets.

``ALL`` and ``UNSAFE`` mirror django-ratelimit so that migrating is a change of imports.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ALL", "UNSAFE", "__version__", "charge"]

__version__ = "0.1.0.dev0"

#: Sentinel for "every HTTP method" (django-ratelimit's value).
ALL = (None,)
#: The methods that change state.
UNSAFE = ["DELETE", "PATCH", "POST", "PUT"]


def charge(request: Any, hits: int) -> int:
    """Add ``hits`` more to every limit that admitted ``request``
    (:func:`ratelimit_app.core.charge`)."""
    from ratelimit_app.core import charge as charge_request

    return charge_request(request, hits)
