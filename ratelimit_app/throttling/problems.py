"""The throttles' part of the system checks (``ratelimit_app.E021``): what would make a
throttle of ours fail on its first request, found before any request comes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from rest_framework.settings import api_settings

from ratelimit_app.algorithms import rates
from ratelimit_app.conf import drf_throttles_named
from ratelimit_app.identity.addresses import num_proxies_problem
from ratelimit_app.throttling.limits import NoRate, throttle_limit
from ratelimit_app.throttling.throttles import ScopedRateThrottle, SimpleRateThrottle

__all__ = ["problems"]


def problems(patterns: Sequence[Any] | None = None) -> list[str]:
    """What would make a throttle of ours fail on a request: a ``REST_FRAMEWORK`` setting
    (a class of this package that does not exist, a bad ``NUM_PROXIES``, a rate our parser
    refuses), or a view of ``patterns`` (default: the URLconf's) whose throttle of ours has
    no rate for its scope, or a rate, algorithm or burst that make no limit."""
    if patterns is None:
        from django.urls import get_resolver

        patterns = get_resolver().url_patterns
    return _settings_problems() + _view_problems(patterns)


def _settings_problems() -> list[str]:
    from django.utils.module_loading import import_string

    found = []
    for path in drf_throttles_named():
        try:
            import_string(path)
        except ImportError as exc:
            found.append(f"REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES']: {exc}.")
    problem = num_proxies_problem(api_settings.NUM_PROXIES)
    if problem:
        found.append(problem)
    for scope, rate in (api_settings.DEFAULT_THROTTLE_RATES or {}).items():
        if rate is not None:
            try:
                rates.normalize(rate)
            except ImproperlyConfigured as exc:
                found.append(f"REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'][{scope!r}]: {exc}")
    return found


def _view_problems(patterns: Sequence[Any]) -> list[str]:
    found = []
    seen = set()
    for view in _view_classes(patterns):
        for cls in getattr(view, "throttle_classes", ()) or ():
            if not (isinstance(cls, type) and issubclass(cls, SimpleRateThrottle)):
                continue
            scope = None
            if issubclass(cls, ScopedRateThrottle):
                scope = getattr(view, getattr(cls, "scope_attr", "throttle_scope"), None)
                if not scope:
                    continue  # a view without a scope is not throttled by it
            if (cls, scope) in seen:
                continue
            seen.add((cls, scope))
            try:
                throttle_limit(cls, scope)
            except NoRate:
                continue
            except ValueError as exc:
                found.append(f"{view.__module__}.{view.__qualname__}, {cls.__name__}: {exc}")
    return found


def _view_classes(patterns: Sequence[Any]) -> Iterator[type]:
    """The class of every DRF view (``as_view()`` keeps it as ``cls``) in ``patterns``."""
    for pattern in patterns:
        nested = getattr(pattern, "url_patterns", None)
        if nested is not None:
            yield from _view_classes(nested)
            continue
        view = getattr(getattr(pattern, "callback", None), "cls", None)
        if isinstance(view, type):
            yield view
