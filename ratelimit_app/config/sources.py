"""Named limits that come from somewhere other than ``RATELIMIT_RULES``.

The DRF throttles (``drf:<scope>``, or a throttle class) live in a package that imports Django
REST framework, an optional extra: the operations, the admin and the system checks must not
import it. So that package registers its source here when it is imported, and they ask here:
a source that was never imported has nothing in force.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratelimit_app.config.limits import Limit

__all__ = ["DRF", "Source", "get", "limit", "register", "registered", "resolve"]

#: The source of :mod:`ratelimit_app.throttling`: its limits are named ``drf:<scope>``.
DRF = "drf"


@dataclass(frozen=True, slots=True)
class Source:
    """Where some named limits come from."""

    #: Each limit's name starts with ``<prefix>:``.
    prefix: str
    #: What a person calls one of them (the admin's choices say it).
    kind: str
    #: Name -> limit, for those whose configuration makes a limit.
    limits: Callable[[], Mapping[str, Limit]]
    #: The configuration's mistakes, given the URL patterns (the system checks report them).
    problems: Callable[[Sequence[Any]], list[str]]
    #: The limit an object of the source stands for (a throttle class), None for others.
    resolve: Callable[[object], Limit | None] | None = None


_sources: dict[str, Source] = {}


def register(
    prefix: str,
    *,
    kind: str,
    limits: Callable[[], Mapping[str, Limit]],
    problems: Callable[[Sequence[Any]], list[str]],
    resolve: Callable[[object], Limit | None] | None = None,
) -> None:
    """Add (or replace) the source whose limits are named ``<prefix>:...``."""
    _sources[prefix] = Source(prefix, kind, limits, problems, resolve)


def registered() -> list[Source]:
    """Every source registered so far, in registration order."""
    return list(_sources.values())


def get(prefix: str) -> Source | None:
    """The source registered under ``prefix``, if its module has been imported."""
    return _sources.get(prefix)


def limit(name: str) -> Limit | None:
    """The limit named ``name`` (``"drf:anon"``) by a registered source, if any."""
    prefix, colon, _ = name.partition(":")
    source = _sources.get(prefix) if colon else None
    return None if source is None else source.limits().get(name)


def resolve(obj: object) -> Limit | None:
    """The limit ``obj`` (a throttle class) stands for in a registered source, if any.
    Raises ``ValueError`` when it is a source's but makes no limit (a throttle without a
    rate)."""
    for source in _sources.values():
        found = None if source.resolve is None else source.resolve(obj)
        if found is not None:
            return found
    return None
