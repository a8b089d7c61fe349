"""The kinds of limit: :class:`~.base.Kind` and its registry, :data:`KINDS`.

A kind of limit is one class (:mod:`.sliding_window`, :mod:`.leaky_bucket`,
:mod:`.in_flight`) that owns its validation, its usage fields, how an override rewrites it,
its look-up and reset, and its admin choice; importing this package registers the built-in
ones. :func:`kind` is the kind a project names (``algorithm=``), :func:`choices` the admin's.
"""

from __future__ import annotations

from django.utils.functional import Promise

from ratelimit_app.config.kinds import in_flight, leaky_bucket, sliding_window  # noqa: F401  (they register)
from ratelimit_app.config.kinds.base import (
    KINDS,
    Kind,
    burst_help,
    of_state,
    register,
    unregister,
)
from ratelimit_app.config.mistakes import LimitError

__all__ = [
    "DEFAULT",
    "IN_FLIGHT",
    "KINDS",
    "Kind",
    "burst_help",
    "choices",
    "expected",
    "fixed_suffixes",
    "judge_burst",
    "kind",
    "names",
    "of_state",
    "register",
    "unregister",
]

#: The kind of a limit that names none.
DEFAULT = sliding_window.SlidingWindow.name
#: The kind of an in-flight limit's places (made by the limit, never named).
IN_FLIGHT = in_flight.InFlight.name


def names() -> tuple[str, ...]:
    """The kinds a project may name, the default first, then as registered."""
    return tuple(sorted((n for n, k in KINDS.items() if k.offered), key=lambda n: n != DEFAULT))


def choices() -> list[tuple[str, str | Promise]]:
    """The admin's choices of kind: ``(name, label)``, as :func:`names` orders them."""
    return [(n, KINDS[n].label) for n in names()]


def expected() -> str:
    """The names a project may give, as a message lists them:
    ``'sliding_window' (default) or 'leaky_bucket'``."""
    parts = [f"{DEFAULT!r} (default)", *(repr(n) for n in names() if n != DEFAULT)]
    if len(parts) == 1:
        return parts[0]
    return f"{', '.join(parts[:-1])} or {parts[-1]}"


def kind(name: object) -> Kind:
    """The kind a project names (``algorithm=``); :class:`LimitError` for a name that is no
    kind's, or a kind's that no project names."""
    found = KINDS.get(name) if isinstance(name, str) else None
    if found is None or not found.offered:
        raise LimitError("algorithm", f"Unknown algorithm {name!r}: expected {expected()}.")
    return found


def judge_burst(burst: object) -> None:
    """A burst given with no valid algorithm: judged only as a kind that takes one judges
    it without rates (:class:`LimitError` when it could not be one)."""
    for k in KINDS.values():
        if k.takes_burst:
            k.validate(burst, None)


def fixed_suffixes() -> list[str]:
    """Every kind's suffixes that do not depend on the time (what a reset deletes besides
    the limit's own kind's buckets)."""
    return [s for k in KINDS.values() for s in k.suffixes]
