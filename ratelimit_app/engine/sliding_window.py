"""Sliding windows as the engine runs them (the buckets:
:mod:`ratelimit_app.algorithms.windows`)."""

from __future__ import annotations

from ratelimit_app.algorithms import windows
from ratelimit_app.algorithms.gcra import SLIDING_WINDOW
from ratelimit_app.backends.base import Op
from ratelimit_app.config.limits import Check
from ratelimit_app.engine.result import Result
from ratelimit_app.engine.step import Moment, Step, register

_tuple = tuple.__new__


@register
class SlidingWindow(Step):
    """Count the write buckets and read the window's buckets in the first round trip."""

    __slots__ = ("detail", "plan")
    algorithm = SLIDING_WINDOW

    def __init__(self, check: Check, namespace: str, moment: Moment) -> None:
        # Made for every check of every request: no super() call.
        self.check, self.namespace, self.moment, self.undo = check, namespace, moment, False
        self.plan = plan = windows.plan(
            check.rates, moment.t, moment.per_window, moment.hierarchical
        )
        #: A refused check's fine buckets, read in the second round trip to time its wait.
        self.detail: windows.Plan | None = None
        # tuple.__new__: a NamedTuple's own __new__ is a Python function.
        self.op = _tuple(Op, (namespace, plan, check.increment, None))

    def decide(self, reply: list[int]) -> Result:
        increment = self.check.increment
        r = Result(windows.evaluate(self.plan, reply, self.moment.t, increment), self.namespace)
        if increment:
            r.plan = self.plan
        self.result = r
        return r

    def _coarse(self) -> bool:
        """True when the first read summed coarse buckets (its waits are not exact)."""
        m = self.moment
        return m.hierarchical or windows.coarse_factor(m.per_window) > 1

    def follow_up(self, exact: bool) -> Op | None:
        # A check reads whole coarse buckets in the middle of its windows: enough to count,
        # not to know when each hit leaves. A refused check reads its fine buckets to time
        # its wait exactly; the counts stay as the check saw them. (Hierarchical: waits stay
        # conservative by up to one coarse bucket.)
        m = self.moment
        if exact and self.result.limited and self._coarse() and not m.hierarchical:
            self.detail = windows.plan(self.check.rates, m.t, m.per_window, fine_only=True)
        if not self.undo and self.detail is None:
            return None
        undo = self.plan if self.undo else None
        return Op(self.namespace, self.detail or self.plan, False, undo)

    def refine(self, reply: list[int]) -> None:
        if self.detail is not None:
            usages = windows.refine(self.result.usages, self.detail, reply, self.moment.t)
            self.result = Result(usages, self.namespace)

    def exact_wait(self) -> bool:
        return self.result.limited and (self.detail is not None or not self._coarse())

    @staticmethod
    def take_back_op(check: Check, result: Result, namespace: str) -> Op | None:
        plan = result.plan
        return None if plan is None else Op(namespace, plan, False, plan)
