"""Sliding-window rate limiting for Django on multi-level time buckets.

``ALL`` and ``UNSAFE`` mirror django-ratelimit so that migrating is a change of imports.
"""

from __future__ import annotations

__all__ = ["ALL", "UNSAFE", "__version__"]

__version__ = "0.1.0.dev0"

#: Sentinel for "every HTTP method" (django-ratelimit's value).
ALL = (None,)
#: The methods that change state.
UNSAFE = ["DELETE", "PATCH", "POST", "PUT"]
