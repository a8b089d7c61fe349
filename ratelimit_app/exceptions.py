"""Exceptions, named as in django-ratelimit."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied


class Ratelimited(PermissionDenied):
    """Raised by a blocking ``@ratelimit`` when the request is over its limit."""

    def __init__(self, *args: object, usage: dict[str, object] | None = None) -> None:
        super().__init__(*args)
        #: The ``get_usage`` dict that fired, when known.
        self.usage = usage


class BackendError(Exception):
    """A counter backend failed (connection refused, timeout, lost write)."""
