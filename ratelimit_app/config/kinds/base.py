"""A kind of limit, as the configuration knows it: :class:`Kind`, and the registry
:data:`KINDS` of the kinds registered (:func:`register`).

A kind owns what differs between algorithms everywhere but the engine's round trips (the
engine's side is its :class:`~ratelimit_app.engine.step.Step`): its name and its label
among the admin's choices, the options it takes and how it validates them with its rates,
whether an override's rates can replace its rates, what it adds to a rule's description
and to a usage dict, how ``ratelimit_usage`` shows that usage, and the counters a reset
deletes. Nothing else compares algorithm names: a module asks the kind.

Pure logic: no I/O.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.utils.functional import Promise

from ratelimit_app.algorithms.rates import Rate
from ratelimit_app.config.mistakes import LimitError
from ratelimit_app.runtime import RUNTIME

__all__ = ["COLUMNS", "KINDS", "Kind", "register", "unregister"]

#: The columns of ``ratelimit_usage``'s table of a usage, one line per rate.
COLUMNS = ("rate", "count", "limit", "remaining", "reset (s)", "state")


class Kind:
    """One kind of limit (an algorithm). Subclass it, set :attr:`name` and :attr:`label`,
    override what differs, and :func:`register` the class; then register the engine's
    step of the same name and encode its operation in each backend.

    The defaults are those of a kind that counts requests in the windows of its rates and
    takes no option of its own (the sliding window)."""

    #: The name a limit gives (``algorithm=``), its checks carry (``Check.algorithm``) and
    #: its usage dict reports (``algorithm``).
    name: ClassVar[str]
    #: Its label among the admin's choices.
    label: ClassVar[str | Promise]
    #: Whether a project may name it (``algorithm=``, a rule, the admin, the commands);
    #: False for a kind a limit makes of itself (the places of an in-flight limit).
    offered: ClassVar[bool] = True
    #: Whether it takes a ``burst``.
    takes_burst: ClassVar[bool] = False
    #: What a burst given to a kind that takes none is told (from the kind that takes one).
    burst_help: ClassVar[str] = ""
    #: Whether its checks hold places of requests in flight (an override, which changes
    #: rates, never changes them).
    holds_places: ClassVar[bool] = False
    #: The type of the state its results carry (``Result.meter``; ``NoneType``: none): a
    #: usage dict is the report of the first kind registered with its result's state type.
    state: ClassVar[type] = type(None)
    #: The suffixes of a subject's counters that do not depend on the time: a reset
    #: deletes those of every kind, so a limit whose algorithm changed leaves none behind.
    suffixes: ClassVar[tuple[str, ...]] = ()

    def __repr__(self) -> str:
        return f"<kind {self.name}>"

    # Validation.

    def validate(self, burst: object, static: tuple[Rate, ...] | None) -> None:
        """Raise :class:`~ratelimit_app.config.mistakes.LimitError` when ``burst`` (as
        given) and the literal rates ``static`` (None: from code, not known yet) do not make
        a limit of this kind."""
        if burst is not None:
            raise LimitError("burst", f"Burst {burst!r}: {burst_help()}")

    def fit(self, found: tuple[Rate, ...], burst: int | None) -> None:
        """Raise ``ImproperlyConfigured`` when the rates ``found`` (a callable's, for one
        request) cannot make a limit of this kind with ``burst``."""

    def unfit(self, found: tuple[Rate, ...], burst: int | None) -> str | None:
        """Why an override's rates ``found`` cannot replace this kind's rates (None: they
        can)."""
        try:
            self.fit(found, burst)
        except ImproperlyConfigured as exc:
            return str(exc)
        return None

    def whole(self, found: tuple[Rate, ...], burst: int | None) -> tuple[int, str]:
        """The cost over which a request is refused always, and what sets it."""
        tightest = min(found, key=lambda r: r.count)
        return tightest.count, f"rate {tightest}"

    # Reports.

    def described(self, burst: int | None) -> dict[str, Any]:
        """What it adds to a rule's description (``CompiledRule.describe``)."""
        return {}

    def limit_of(self, rate: Rate, state: Any) -> int:
        """The usage dict's ``limit`` of ``rate``, given the result's ``state``."""
        return rate.count

    def add_usage(self, usage: dict[str, Any], state: Any) -> None:
        """Add its own fields to a usage dict (``state``: the result's)."""

    def usage_rows(self, usage: dict[str, Any]) -> list[tuple[str, ...]]:
        """``ratelimit_usage``'s table of ``usage``: a header line, then one line per rate."""
        return [
            COLUMNS,
            *(
                (
                    str(r["rate"]),
                    str(r["count"]),
                    str(r["limit"]),
                    str(r["remaining"]),
                    str(r["reset"]),
                    "limited" if r["should_limit"] else "ok",
                )
                for r in usage["rates"]
            ),
        ]

    # Counters.

    def buckets(self, found: tuple[Rate, ...], t: float) -> list[str]:
        """The suffixes of a subject's counters at time ``t`` that depend on the time (a
        reset deletes them with every kind's :attr:`suffixes`)."""
        return []


#: Every kind registered, by name, in the order registered (the default first).
KINDS: dict[str, Kind] = {}

K = TypeVar("K", bound=type[Kind])


def register(cls: K) -> K:
    """Make the kind ``cls`` (a class decorator) one a limit may be of."""
    found = cls()
    KINDS[found.name] = found
    RUNTIME.compiled.clear()  # (limits validated against the kinds before)
    return cls


def unregister(name: str) -> None:
    """Take the kind ``name`` out of the registry (tests)."""
    del KINDS[name]
    RUNTIME.compiled.clear()


def of_state(state: object) -> Kind:
    """The kind whose report a usage dict is, by its result's state (the first registered
    whose :attr:`Kind.state` is its type)."""
    cls = type(state)
    for found in KINDS.values():
        if found.state is cls:
            return found
    raise LookupError(f"No kind of limit keeps a state of type {cls.__name__}.")


def burst_help() -> str:
    """What a burst given to a kind that takes none is told: what the kinds that take one
    say."""
    return " ".join(k.burst_help for k in KINDS.values() if k.takes_burst)
