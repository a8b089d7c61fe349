"""One subject's check through the engine, for tests that drive the engine directly."""

from __future__ import annotations

from ratelimit_app.algorithms import rates
from ratelimit_app.algorithms.gcra import SLIDING_WINDOW
from ratelimit_app.config.limits import Check
from ratelimit_app.engine import Result, check_many


def check(
    scope: str,
    subject: tuple[str, str],
    rate_list: tuple[rates.Rate, ...],
    increment: bool,
    algorithm: str = SLIDING_WINDOW,
    burst: int | None = None,
) -> Result:
    """Count (if ``increment``) and read one subject's windows, or meter its leaky bucket."""
    return check_many([Check(scope, subject, rate_list, increment, algorithm, burst)])[0]
