"""The sliding window: at most N requests in any window of each rate (the arithmetic:
:mod:`ratelimit_app.algorithms.windows`). The default kind of limit."""

from __future__ import annotations

from typing import ClassVar

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from ratelimit_app.algorithms import gcra, windows
from ratelimit_app.algorithms.rates import Rate
from ratelimit_app.config.kinds.base import Kind, register


@register
class SlidingWindow(Kind):
    """Counts requests in the buckets of each rate's window; takes no burst."""

    name = gcra.SLIDING_WINDOW
    label: ClassVar[str | Promise] = _("sliding window")

    def buckets(self, found: tuple[Rate, ...], t: float) -> list[str]:
        return sorted(windows.stored_suffixes(found, t, windows.BUCKETS_PER_WINDOW))
