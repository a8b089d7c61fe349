"""The one place metrics_app reads the time.

Every timestamp (the minute a :func:`metrics_app.record` call is counted in, what is due for
downsampling, the default step of a query) comes from :func:`now`, so tests and benchmarks can
travel through a year in milliseconds with :func:`metrics_app.testing.frozen_clock`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: Seconds since the epoch, as a float: :func:`time.time` itself, not a function calling it,
#: because :func:`metrics_app.record` reads it on every counted request.
now: Callable[[], float] = time.time
