"""A leaky bucket as the engine runs it (the arithmetic: :mod:`ratelimit_app.algorithms.gcra`)."""

from __future__ import annotations

from ratelimit_app.algorithms import gcra
from ratelimit_app.algorithms.gcra import LEAKY_BUCKET
from ratelimit_app.backends.base import MeterOp, MeterReply
from ratelimit_app.config.limits import Check
from ratelimit_app.engine.result import Result, meter_result
from ratelimit_app.engine.step import CheckTime, Step, register
from ratelimit_app.identity.namespaces import namespace
from ratelimit_app.runtime import RUNTIME


def _meter(check: Check) -> gcra.Meter:
    """The check's bucket, made once per rate and burst (kept in the runtime)."""
    return RUNTIME.compile(
        ("meter", check.rates, check.burst), gcra.meter, check.rates, check.burst
    )


@register
class LeakyBucket(Step):
    """Admit when one more fits, in the first round trip. A refused request stores nothing
    and its wait is exact from the start: the second round trip only takes back a request
    it admitted (when another limit refused it)."""

    __slots__ = ("admitted", "meter")
    algorithm = LEAKY_BUCKET

    def __init__(self, check: Check, moment: CheckTime) -> None:
        ns = namespace(check.scope, *check.subject)
        self.check, self.namespace, self.moment, self.undo = check, ns, moment, False
        self.meter = _meter(check)
        #: Its admitted hit, as stored (what a take-back compares against).
        self.admitted: MeterReply | None = None
        self.op = MeterOp(ns, self.meter, check.increment, None, check.cost)

    def decide(self, reply: MeterReply) -> Result:
        now_us = self.moment.now_us
        check = self.check
        state = gcra.outcome(
            self.meter, reply.read, reply.written, now_us, check.increment, check.cost
        )
        r = meter_result(state, self.namespace)
        if reply.written is not None:
            r.reply = self.admitted = reply
        self.result = r
        return r

    def follow_up(self, exact: bool) -> MeterOp | None:
        if not self.undo or self.admitted is None:
            return None
        return MeterOp(self.namespace, self.meter, take_back=self.admitted, cost=self.check.cost)

    @staticmethod
    def charge_op(check: Check, moment: CheckTime) -> MeterOp:
        meter = _meter(check)
        ns = namespace(check.scope, *check.subject)
        return MeterOp(ns, meter, True, None, check.cost, True)

    @staticmethod
    def take_back_op(check: Check, result: Result, namespace: str) -> MeterOp | None:
        reply = result.reply
        if reply is None:
            return None
        meter = _meter(check)
        return MeterOp(namespace, meter, take_back=reply, cost=check.cost)
