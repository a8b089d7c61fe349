"""The leaky bucket: a steady rate with a bounded burst (the arithmetic:
:mod:`ratelimit_app.algorithms.gcra`; the engine's step:
:mod:`ratelimit_app.engine.leaky_bucket`)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _

from ratelimit_app.algorithms import gcra
from ratelimit_app.algorithms.rates import Rate
from ratelimit_app.config.kinds.base import Kind, register
from ratelimit_app.config.mistakes import LimitError

#: ``ratelimit_usage``'s columns of a leaky bucket: its level (fractional: it drains
#: continuously), its capacity, and the seconds until it is empty.
METER_COLUMNS = ("rate", "level", "capacity", "remaining", "empty in (s)", "state")


@register
class LeakyBucket(Kind):
    """One leak rate and a capacity (``burst``; default: the rate's count), stored as one
    theoretical arrival time per subject."""

    name = gcra.LEAKY_BUCKET
    label = _("leaky bucket")
    takes_burst = True
    burst_help = (
        f"a burst is the capacity of a leaky bucket: set the algorithm to {name!r}, or "
        "remove the burst."
    )
    state = gcra.State
    suffixes = (gcra.SUFFIX,)

    def validate(self, burst: object, static: tuple[Rate, ...] | None) -> None:
        try:
            capacity = gcra.validate_burst(burst)
        except ImproperlyConfigured as exc:
            raise LimitError("burst", str(exc)) from None
        if static is not None:
            try:
                gcra.meter(static, capacity)
            except ImproperlyConfigured as exc:
                raise LimitError("rate" if len(static) != 1 else "burst", str(exc)) from None

    def fit(self, found: tuple[Rate, ...], burst: int | None) -> None:
        gcra.meter(found, burst)

    def whole(self, found: tuple[Rate, ...], burst: int | None) -> tuple[int, str]:
        return (burst if burst is not None else found[0].count), "the bucket's capacity"

    def described(self, burst: int | None) -> dict[str, Any]:
        return {
            "algorithm": self.name,
            "burst": burst if burst is not None else "the rate's count",
        }

    def limit_of(self, rate: Rate, state: gcra.State) -> int:
        return state.meter.capacity

    def add_usage(self, usage: dict[str, Any], state: gcra.State) -> None:
        usage["level"] = round(state.level, 6)
        usage["capacity"] = state.meter.capacity

    def usage_rows(self, usage: dict[str, Any]) -> list[tuple[str, ...]]:
        return [
            METER_COLUMNS,
            (
                str(usage["rate"]),
                f"{usage['level']:.2f}",
                str(usage["capacity"]),
                str(usage["remaining"]),
                str(usage["reset"]),
                "limited" if usage["should_limit"] else "ok",
            ),
        ]
