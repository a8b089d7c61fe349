"""In-flight limits (``concurrent``) as the engine runs them: sliding windows of
:class:`~ratelimit_app.algorithms.rates.Slots`.

A request takes a place by counting a hit in a window as long as the lease, in the check's
own round trip, exactly as a rate is counted (so never more than N at once, whatever the
concurrency); the adapter gives it back by taking that hit back when the response is done
(:func:`ratelimit_app.engine.enforce.release`), one round trip. A worker that dies holding a
place never gives it back: its hit leaves the window on its own after the lease. A refusal
says to try again in a second, whatever the window says: a place frees when a response
ends, not when a hit ages out.
"""

from __future__ import annotations

from ratelimit_app.algorithms.gcra import IN_FLIGHT
from ratelimit_app.backends.base import Op
from ratelimit_app.config.limits import Check
from ratelimit_app.engine.result import Result
from ratelimit_app.engine.sliding_window import SlidingWindow
from ratelimit_app.engine.step import CheckTime, register

#: Seconds a refused request is told to wait (``Retry-After``), and the refusal remembered.
RETRY_AFTER = 1.0


@register
class InFlight(SlidingWindow):
    """Take a place in the first round trip; a refusal waits :data:`RETRY_AFTER`."""

    __slots__ = ()
    algorithm = IN_FLIGHT

    def decide(self, reply: list[int]) -> Result:
        r = super().decide(reply)
        if r.limited:
            r.usages = [
                u._replace(retry_after=RETRY_AFTER, reset=RETRY_AFTER) if u.limited else u
                for u in r.usages
            ]
        return r

    def follow_up(self, exact: bool) -> Op | None:
        return super().follow_up(False)  # the wait is RETRY_AFTER: nothing to time

    def exact_wait(self) -> bool:
        return self.result.limited

    @staticmethod
    def charge_op(check: Check, moment: CheckTime) -> Op:
        raise TypeError("an in-flight limit is not charged: a place is one request")
