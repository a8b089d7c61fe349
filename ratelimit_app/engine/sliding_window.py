"""Sliding windows as the engine runs them (the buckets:
:mod:`ratelimit_app.algorithms.windows`)."""

from __future__ import annotations

from ratelimit_app.algorithms import windows
from ratelimit_app.algorithms.calendar import Quota
from ratelimit_app.algorithms.gcra import SLIDING_WINDOW
from ratelimit_app.backends.base import Op
from ratelimit_app.config.limits import Check
from ratelimit_app.engine.refusals import remembered
from ratelimit_app.engine.result import Result
from ratelimit_app.engine.step import CheckTime, Step, register
from ratelimit_app.identity.namespaces import namespace
from ratelimit_app.runtime import RUNTIME

_tuple = tuple.__new__

#: Limits whose plan for the current fine bucket a process keeps (``RUNTIME.plans``, by
#: the limit's scope: every subject of a limit finds it made, a new one as a known one). The
#: memo starts over when full.
PLAN_MEMO = 1024


def plan(
    rates: tuple[windows.Rate, ...],
    t: float,
    per_window: int,
    hierarchical: bool = False,
    fine_only: bool = False,
) -> windows.Plan:
    """:func:`ratelimit_app.algorithms.windows.plan`, compiled once per rates and fine bucket
    (or whole second, hierarchical) and kept in the runtime (``RUNTIME.compiled``): every
    subject of a limit shares it, so a new client's check finds its plan made."""
    if hierarchical:
        now = int(t // 1)
        return RUNTIME.compile(
            ("hierarchical", rates, now, per_window),
            windows.hierarchical_plan,
            rates,
            now,
            per_window,
        )
    indexes = windows.indexes(rates, t, per_window)
    return RUNTIME.compile(
        ("uniform", rates, indexes, per_window, fine_only),
        windows.uniform_plan,
        rates,
        indexes,
        per_window,
        fine_only,
    )


def current_plan(scope: str, rates: tuple[windows.Rate, ...], moment: CheckTime) -> windows.Plan:
    """The plan of the limit whose counters are ``scope`` and rates ``rates`` at ``moment``:
    for one rate, a look in the limit's plan for its current fine bucket
    (``RUNTIME.plans``), whoever the subject."""
    if len(rates) == 1 and not moment.hierarchical:
        index = int(moment.t * moment.per_window // rates[0].seconds)
        memo = RUNTIME.plans
        found = memo.get(scope)
        if found is not None and found[0] == index and found[1] == moment.per_window:
            return found[2]
        made = plan(rates, moment.t, moment.per_window)
        if len(memo) >= PLAN_MEMO:
            memo.clear()
        if type(rates[0]) is not Quota:  # (a calendar period is no fine bucket)
            memo[scope] = (index, moment.per_window, made)
        return made
    return plan(rates, moment.t, moment.per_window, moment.hierarchical)


@register
class SlidingWindow(Step):
    """Count the write buckets and read the window's buckets in the first round trip."""

    __slots__ = ("detail", "plan")
    algorithm = SLIDING_WINDOW

    def __init__(self, check: Check, moment: CheckTime) -> None:
        # Made for every check of every request: no super() call, and the common case (one
        # rate) a look in the limit's plan for its fine bucket, whoever the subject.
        self.check, self.moment, self.undo = check, moment, False
        #: A refused check's fine buckets, read in the second round trip to time its wait.
        self.detail: windows.Plan | None = None
        self.namespace = ns = namespace(check.scope, *check.subject)
        self.plan = made = current_plan(check.scope, check.rates, moment)
        # tuple.__new__: a NamedTuple's own __new__ is a Python function.
        self.op = _tuple(Op, (ns, made, check.increment, None, check.cost))

    @classmethod
    def decided(cls, check: Check, moment: CheckTime, op: Op, result: Result) -> SlidingWindow:
        """The step of a check made and decided elsewhere (:mod:`.compiled`): its ``op``
        (the namespace and plan are the op's) and its ``result``."""
        step = cls.__new__(cls)
        step.check, step.moment, step.undo, step.detail = check, moment, False, None
        step.namespace, step.plan, step.op, step.result = op.namespace, op.plan, op, result
        return step

    def decide(self, reply: list[int]) -> Result:
        check = self.check
        increment = check.increment
        usages = windows.evaluate(self.plan, reply, self.moment.t, increment, check.cost)
        r = Result(usages, self.namespace)
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
            self.detail = plan(self.check.rates, m.t, m.per_window, fine_only=True)
        if not self.undo and self.detail is None:
            return None
        undo = self.plan if self.undo else None
        return Op(self.namespace, self.detail or self.plan, False, undo, self.check.cost)

    def refine(self, reply: list[int]) -> None:
        detail = self.detail
        if detail is not None:
            t, cost = self.moment.t, self.check.cost
            exact = windows.evaluate(detail, reply, t, cost=cost)
            usages = windows.refine(self.result.usages, detail, reply, t, cost, exact)
            self.result = r = Result(usages, self.namespace)
            # How long the hits already admitted keep it refused (the refusal memory holds
            # it that long while the version counters vouch for it).
            settled = remembered.SETTLED
            r.settled = windows.settled_wait(detail, reply, t, settled, cost, exact)

    def exact_wait(self) -> bool:
        return self.result.limited and (self.detail is not None or not self._coarse())

    @staticmethod
    def charge_op(check: Check, moment: CheckTime) -> Op:
        made = plan(check.rates, moment.t, moment.per_window, moment.hierarchical)
        return Op(namespace(check.scope, *check.subject), made, True, None, check.cost)

    @staticmethod
    def take_back_op(check: Check, result: Result, namespace: str) -> Op | None:
        plan = result.plan
        return None if plan is None else Op(namespace, plan, False, plan, check.cost)
