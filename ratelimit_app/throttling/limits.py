"""The limits the throttles count with, as the operator's tools see them: the admin, the
management commands and :func:`ratelimit_app.core.lookup` / :func:`ratelimit_app.core.reset`
find them through :mod:`ratelimit_app.config.sources` (they never import Django REST framework).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from rest_framework.settings import api_settings

from ratelimit_app.config.limits import Limit
from ratelimit_app.operators import operations
from ratelimit_app.throttling.throttles import PREFIX, ScopedRateThrottle, SimpleRateThrottle

__all__ = ["NoRate", "lookup", "reset", "resolve", "scope_limits", "throttle_limit"]


class NoRate(ValueError):
    """A throttle whose rate is None: DRF's way to throttle nothing (not a mistake)."""


def throttle_limit(throttle: type[SimpleRateThrottle] | str, scope: str | None = None) -> Limit:
    """The limit a throttle counts with: a class of ours (a ``ScopedRateThrottle`` with the
    view's ``scope``), or a scope of ``DEFAULT_THROTTLE_RATES`` (``"user"`` or
    ``"drf:user"``: a sliding window at its rate). Raises ``ValueError`` when there is no
    such limit (no rate, or a rate that cannot make one)."""
    if isinstance(throttle, str):
        scope = throttle.removeprefix(PREFIX)
        throttle = SimpleRateThrottle
    found = throttle.__new__(throttle)
    if scope is not None:
        found.scope = scope
    try:
        if issubclass(throttle, ScopedRateThrottle) or not getattr(found, "rate", None):
            found.rate = found.get_rate()
        found.num_requests, found.duration = found.parse_rate(found.rate)
        if found.rate is None:
            raise NoRate(f"{found.name!r}: its rate is None: it throttles nothing.")
        return found.limit()
    except ImproperlyConfigured as exc:
        raise ValueError(str(exc)) from None


def scope_limits() -> dict[str, Limit]:
    """``drf:<scope>`` -> limit, for every scope of ``DEFAULT_THROTTLE_RATES`` that has a
    valid rate (the system checks report the others)."""
    found = {}
    for scope, rate in (api_settings.DEFAULT_THROTTLE_RATES or {}).items():
        if rate is None:
            continue
        with contextlib.suppress(ValueError):
            found[PREFIX + str(scope)] = throttle_limit(str(scope))
    return found


def resolve(obj: object) -> Limit | None:
    """The limit of a throttle class of ours (None for anything else), for
    ``core.lookup(MyThrottle, ident)``. A ``ScopedRateThrottle``'s scope is the view's: name
    it as ``"drf:<scope>"`` instead."""
    if not (isinstance(obj, type) and issubclass(obj, SimpleRateThrottle)):
        return None
    if issubclass(obj, ScopedRateThrottle) and not obj.scope:
        raise ValueError(f'{obj.__name__}: its scope is the view\'s; name it as "drf:<scope>".')
    return throttle_limit(obj)


def lookup(
    throttle: type[SimpleRateThrottle] | str, ident: str, scope: str | None = None
) -> dict[str, Any] | None:
    """Deprecated: :func:`ratelimit_app.core.lookup` takes a throttle class or
    ``"drf:<scope>"``."""
    _deprecated("lookup")
    return operations.lookup(throttle_limit(throttle, scope), ident)


def reset(throttle: type[SimpleRateThrottle] | str, ident: str, scope: str | None = None) -> bool:
    """Deprecated: :func:`ratelimit_app.core.reset` takes a throttle class or
    ``"drf:<scope>"``."""
    _deprecated("reset")
    return operations.reset(throttle_limit(throttle, scope), ident)


def _deprecated(name: str) -> None:
    warnings.warn(
        f"ratelimit_app.throttling.{name}() is deprecated: call ratelimit_app.core.{name}() "
        f'with the throttle class or "drf:<scope>".',
        DeprecationWarning,
        stacklevel=3,
    )
