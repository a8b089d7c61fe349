"""A kind of limit, as the engine runs it: a :class:`Step` subclass per algorithm.

:func:`ratelimit_app.engine.check_many` knows no algorithm: for each check it makes the
step of the check's algorithm (:data:`STEPS`), sends each step's operation in one round
trip, lets each step decide its result, and, when a request is refused, sends what the
steps need in a second round trip (take-backs, reads that time a wait exactly). A new kind
of limit is its kind (:mod:`ratelimit_app.config.kinds`: what the configuration, the
reports and the operations ask of it), a new module with its step, registered here under
the kind's name, and its operation's encoding in each backend.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app.algorithms import gcra, windows
from ratelimit_app.config import kinds
from ratelimit_app.config.limits import Check
from ratelimit_app.engine.result import Result
from ratelimit_app.identity.namespaces import namespace


class CheckTime:
    """When the checks of one call run, and the bucket layout then in force."""

    __slots__ = ("hierarchical", "now_us", "per_window", "t")

    def __init__(self, t: float) -> None:
        self.t = t
        self.now_us = round(t * gcra.MICROS)  # gcra.micros(t), without its call
        self.per_window = windows.BUCKETS_PER_WINDOW
        self.hierarchical = windows.HIERARCHICAL


class Step:
    """One check on its way through the round trips of one call."""

    __slots__ = ("check", "moment", "namespace", "op", "result", "undo")

    #: The algorithm name checks give (``Check.algorithm``).
    algorithm: ClassVar[str]

    def __init__(self, check: Check, moment: CheckTime) -> None:
        self.check = check
        #: The subject's namespace (:func:`~ratelimit_app.identity.namespaces.namespace`).
        self.namespace = namespace(check.scope, *check.subject)
        self.moment = moment
        #: The operation of the first round trip (made with the step: an attribute, not a
        #: method, read once per check of every request).
        self.op: Any = None
        self.result: Result
        #: Its hit is taken back in the second round trip.
        self.undo = False

    def decide(self, reply: Any) -> Result:
        """The result, from the first round trip's reply."""
        raise NotImplementedError

    def take_back(self) -> None:
        """Take back this request's hit in the second round trip (a counted check only);
        its result then holds nothing more to take back."""
        if self.check.increment:
            self.undo = True
            self.result.plan = self.result.reply = None

    def follow_up(self, exact: bool) -> Any | None:
        """The operation of the second round trip (None: nothing to send). ``exact``: time
        a refusal's wait exactly when a second read can."""
        raise NotImplementedError

    def refine(self, reply: Any) -> None:
        """Learn from the second round trip's reply."""

    def exact_wait(self) -> bool:
        """True when its refusal's wait is exact (after :meth:`follow_up`): then
        remembered."""
        return self.result.limited

    @staticmethod
    def charge_op(check: Check, moment: CheckTime) -> Any:
        """The operation that adds ``check.cost`` hits to its subject whether they fit or
        not (:func:`ratelimit_app.engine.charge`)."""
        raise NotImplementedError

    @staticmethod
    def take_back_op(check: Check, result: Result, namespace: str) -> Any | None:
        """The operation that takes back the hit ``result`` holds (a failure-only limit's,
        after the view), or None."""
        raise NotImplementedError


#: Algorithm name -> its step class.
STEPS: dict[str, type[Step]] = {}


def register(step: type[Step]) -> type[Step]:
    """Make ``step`` the way checks of its algorithm run (a class decorator): the name of a
    kind of limit (:data:`ratelimit_app.config.kinds.KINDS`)."""
    if step.algorithm not in kinds.KINDS:
        raise ImproperlyConfigured(
            f"{step.__name__}: no kind of limit is named {step.algorithm!r}; register its "
            "Kind (ratelimit_app.config.kinds) first."
        )
    STEPS[step.algorithm] = step
    return step
