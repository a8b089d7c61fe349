"""Sliding windows as the engine runs them (the buckets:
:mod:`ratelimit_app.algorithms.windows`)."""

from __future__ import annotations

from ratelimit_app.algorithms import windows
from ratelimit_app.algorithms.gcra import SLIDING_WINDOW
from ratelimit_app.backends.base import Op
from ratelimit_app.config.limits import Check
from ratelimit_app.engine.result import Result
from ratelimit_app.engine.step import CheckTime, Step, register
from ratelimit_app.identity.namespaces import namespace

_tuple = tuple.__new__

#: What a check of one rate makes before its round trip (its subject's namespace, the plan
#: of its fine bucket, the operation), by the check's identity: a limit keeps one counted
#: check per subject (:meth:`~ratelimit_app.config.limits.Limit.check`), so a client's
#: requests within one fine bucket find them made. Each entry holds its check (so the
#: identity is never another's while the entry lives) and the bucket it was made for; the
#: memo starts over when full (or when settings change).
_PREPARED: dict[int, tuple[Check, int, int, str, windows.Plan, Op]] = {}
READY_MEMO = 4096


def forget() -> None:
    """Forget the checks made ready (a namespace may hash to something else now):
    :mod:`ratelimit_app.runtime` calls it when the settings change."""
    _PREPARED.clear()


@register
class SlidingWindow(Step):
    """Count the write buckets and read the window's buckets in the first round trip."""

    __slots__ = ("detail", "plan")
    algorithm = SLIDING_WINDOW

    def __init__(self, check: Check, moment: CheckTime) -> None:
        # Made for every check of every request: no super() call, and the common case (one
        # rate, a fine bucket seen already) a memo's look.
        self.check, self.moment, self.undo = check, moment, False
        #: A refused check's fine buckets, read in the second round trip to time its wait.
        self.detail: windows.Plan | None = None
        rates = check.rates
        if len(rates) == 1 and check.increment and not moment.hierarchical:  # (kept checks)
            index = int(moment.t * moment.per_window // rates[0].seconds)
            ready = _PREPARED.get(id(check))
            if (
                ready is not None
                and ready[0] is check
                and ready[1] == index
                and ready[2] == moment.per_window
            ):
                self.namespace, self.plan, self.op = ready[3], ready[4], ready[5]
                return
            self._make()
            if len(_PREPARED) >= READY_MEMO:
                _PREPARED.clear()
            _PREPARED[id(check)] = (
                check,
                index,
                moment.per_window,
                self.namespace,
                self.plan,
                self.op,
            )
        else:
            self._make()

    def _make(self) -> None:
        check, moment = self.check, self.moment
        self.namespace = ns = namespace(check.scope, *check.subject)
        self.plan = plan = windows.plan(
            check.rates, moment.t, moment.per_window, moment.hierarchical
        )
        # tuple.__new__: a NamedTuple's own __new__ is a Python function.
        self.op = _tuple(Op, (ns, plan, check.increment, None, check.cost))

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
            self.detail = windows.plan(self.check.rates, m.t, m.per_window, fine_only=True)
        if not self.undo and self.detail is None:
            return None
        undo = self.plan if self.undo else None
        return Op(self.namespace, self.detail or self.plan, False, undo, self.check.cost)

    def refine(self, reply: list[int]) -> None:
        if self.detail is not None:
            usages = windows.refine(
                self.result.usages, self.detail, reply, self.moment.t, self.check.cost
            )
            self.result = Result(usages, self.namespace)

    def exact_wait(self) -> bool:
        return self.result.limited and (self.detail is not None or not self._coarse())

    @staticmethod
    def charge_op(check: Check, moment: CheckTime) -> Op:
        plan = windows.plan(check.rates, moment.t, moment.per_window, moment.hierarchical)
        return Op(namespace(check.scope, *check.subject), plan, True, None, check.cost)

    @staticmethod
    def take_back_op(check: Check, result: Result, namespace: str) -> Op | None:
        plan = result.plan
        return None if plan is None else Op(namespace, plan, False, plan, check.cost)
