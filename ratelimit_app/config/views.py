"""The limits ``@ratelimit`` put on the views of the URLconf, found by the names people know
them by: a URL name (``accounts:login``), a URL path (``/hello/``), the view's dotted path, or
the decorator's group.

A decorator's counters are filed under its group, which by default is the view's dotted
path: nobody types that. ``@ratelimit`` leaves its guards on the function it wraps (the
attribute ``ratelimit_limits``, a tuple: stacked decorators add up), so the admin and the
commands find a view's limits without a request. Reading only: nothing here counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from django.urls import Resolver404, URLResolver, get_resolver, resolve

from ratelimit_app.config.limits import Limit

__all__ = ["Decorated", "View", "attached", "find", "routed"]

#: Where ``@ratelimit`` leaves its guards on the function it returns.
ATTRIBUTE = "ratelimit_limits"
#: ``method_decorator`` applies a decorator once at class definition, to a stand-in function
#: of this module, only to copy its attributes: at request time the group is the bound
#: method's (``module.ViewClass.Class.method``, as :func:`ratelimit_app.core.group_name`).
METHOD_DECORATOR = "django.utils.decorators."
#: How far down ``__wrapped__`` to look past decorators that do not copy the attribute.
DEPTH = 16


class Guard(Protocol):
    """What ``@ratelimit`` leaves on a view (:class:`ratelimit_app.decorators.ViewLimit`)."""

    view_name: str
    limit: Limit | None
    problems: list[str]


@dataclass(frozen=True, slots=True)
class Decorated:
    """One ``@ratelimit`` on a view: its group and limit, or why it has none."""

    group: str
    limit: Limit | None
    #: Why there is no limit (no rate, or a mistake); None when there is one.
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class View:
    """A routed view that carries ``@ratelimit``."""

    #: Its URL name with its namespaces (``accounts:login``), None when it has none.
    url_name: str | None
    #: Its route as the URLconf writes it, from the root (``/hello/``, ``/users/<int:pk>/``).
    route: str
    #: The view's dotted path (a class-based view's class).
    path: str
    limits: tuple[Decorated, ...]

    @property
    def label(self) -> str:
        """How people know it: its URL name, else its route."""
        return self.url_name or self.route


def _guards(fn: object) -> tuple[Guard, ...]:
    """The guards on ``fn``, looking past decorators that keep ``__wrapped__`` only."""
    for _ in range(DEPTH):
        found = getattr(fn, ATTRIBUTE, None)
        if found is not None or not hasattr(fn, "__wrapped__"):
            return tuple(found or ())
        fn = fn.__wrapped__
    return ()


def _decorated(guard: Guard, fn: Callable[..., Any], view_class: type | None) -> Decorated:
    limit = guard.limit
    if limit is None:
        problem = " ".join(guard.problems) or "it has no rate: it limits nothing"
        return Decorated(guard.view_name, None, f"@ratelimit on {guard.view_name}: {problem}")
    default = limit.group == guard.view_name
    if default and view_class is not None and guard.view_name.startswith(METHOD_DECORATOR):
        group = f"{fn.__module__}.{view_class.__name__}.{fn.__qualname__}"
        limit = dataclasses.replace(limit, group=group)
    return Decorated(limit.group, limit)


def attached(callback: Callable[..., Any]) -> tuple[Decorated, ...]:
    """The limits of every ``@ratelimit`` on a view as the URLconf routes it: a function, or
    ``as_view()`` of a class (its ``dispatch`` and method handlers, then what wraps
    ``as_view()`` itself)."""
    view_class = getattr(callback, "view_class", None)
    places: list[tuple[Any, type | None]] = []
    if isinstance(view_class, type):
        for name in ("dispatch", *getattr(view_class, "http_method_names", ())):
            places.append((getattr(view_class, name, None), view_class))
    places.append((callback, None))
    found: dict[int, Decorated] = {}
    for fn, owner in places:
        for guard in _guards(fn):
            # as_view() copies dispatch's attributes: each guard once, read where it is.
            found.setdefault(id(guard), _decorated(guard, fn, owner))
    return tuple(found.values())


def _dotted(callback: Callable[..., Any]) -> str:
    view = getattr(callback, "view_class", None) or callback
    return f"{view.__module__}.{view.__qualname__}"


def _walk(patterns: Sequence[Any], prefix: str, namespace: str) -> Iterator[View]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern).removeprefix("^")
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            try:
                nested = pattern.url_patterns
            except Exception:  # an include() that cannot be loaded: Django's checks say so
                continue
            yield from _walk(nested, route, inner)
            continue
        limits = attached(pattern.callback)
        if limits:
            name = namespace + pattern.name if pattern.name else None
            yield View(name, "/" + route, _dotted(pattern.callback), limits)


def routed() -> list[View]:
    """Every view of the root URLconf that carries ``@ratelimit``. Raises the URLconf's own
    error when it cannot be loaded."""
    return list(_walk(get_resolver().url_patterns, "", ""))


def _at_path(text: str) -> tuple[Decorated, ...]:
    """The limits of the view a URL (``/hello/``, ``/hello/?x=1``, ``https://host/hello/``)
    resolves to."""
    try:
        return attached(resolve(unquote(urlsplit(text).path)).func)
    except (Resolver404, ValueError):  # no view there; no URL at all ("http://[::1")
        return ()


def find(name: str) -> tuple[Decorated, ...]:
    """The limits ``name`` stands for: with a leading ``/`` or a scheme, the view its URL
    resolves to; else the views of that URL name, else of that dotted path, else the
    decorators of that group. Each limit once; empty when none."""
    if name.startswith("/") or "://" in name:
        return _at_path(name)
    views = routed()
    for matches in (
        [d for v in views if v.url_name == name for d in v.limits],
        [d for v in views if v.path == name for d in v.limits],
        [d for v in views for d in v.limits if d.group == name],
    ):
        if matches:
            unique = {(d.group, repr(d.limit), d.problem): d for d in matches}
            return tuple(unique.values())
    return ()
