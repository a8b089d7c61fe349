"""The one place ratelimit_app reads the time.

Every bucket decision goes through :func:`now`, on every backend, so tests and benchmarks
can move through a day in milliseconds by patching this function (see
:func:`ratelimit_app.testing.frozen_clock`).
"""

from __future__ import annotations

import time


def now() -> float:
    """Seconds since the epoch, as a float."""
    return time.time()
