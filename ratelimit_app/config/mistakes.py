"""Configuration mistakes: :class:`Mistake`, found together with the others of the same
limit or rule, and :class:`LimitError`, a limit's. Below :mod:`~ratelimit_app.config.limits`
and :mod:`~ratelimit_app.config.kinds`, which both raise them (``limits`` re-exports them).

Pure logic: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Self, TypeVar

from django.core.exceptions import ImproperlyConfigured

__all__ = ["LimitError", "Mistake", "collect", "raise_all"]


class Mistake(ImproperlyConfigured):
    """A configuration mistake, found together with the others of the same limit or rule.

    Validation goes on past the first mistake, so one run of the system checks reports every
    mistake at once; ``errors`` holds them all, this one first (the one raised)."""

    errors: tuple[Self, ...]

    def __init__(self: Self, message: str) -> None:
        super().__init__(message)
        self.errors = (self,)


M = TypeVar("M", bound=Mistake)
T = TypeVar("T")


def collect(errors: list[M], kind: type[M], check: Callable[..., T], *args: Any) -> T | None:
    """``check(*args)``, or None with its mistakes (of class ``kind``) added to ``errors``."""
    try:
        return check(*args)
    except kind as exc:
        errors.extend(exc.errors)
        return None


def raise_all(errors: Sequence[M]) -> NoReturn:
    """Raise the first of ``errors``, carrying all of them in its ``errors``."""
    first = errors[0]
    first.errors = tuple(errors)
    raise first


class LimitError(Mistake):
    """A limit that cannot be used; ``field`` names the part that is wrong (``key``,
    ``rate``, ``method``, ``algorithm`` or ``burst``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)
