"""The overrides in force, applied to a request's decisions before they are checked.

:func:`apply` is called by :func:`ratelimit_app.engine.enforce.decide` only while the
configuration snapshot holds overrides (its ``overriding``). A decision
whose subject has an override gets a check of its own: the same check with the override's
rates and the scope of those rates (:meth:`Limit.scope_for
<ratelimit_app.config.limits.Limit.scope_for>`), so the subject's counters under the override
are apart from its counters under the limit's own rates. An ``unlimited`` override takes the
decision out of the request: it is admitted and counts nothing.

An override changes rates, never places: a decision of an in-flight limit (a rule's
``concurrent``, filed under the rule's name beside its rate limit) is left as it is, so a
subject given ``600/h`` or ``unlimited`` still holds at most ``concurrent`` places at once.

A request whose subjects no override names passes by the table: ``enforce.decide`` asks
:func:`prefilter` once and looks each subject's value up in :attr:`Table.known
<ratelimit_app.overrides.table.Table.known>` (every value, email and address any override
names, under any limit), in the loop that gathers the checks; only a subject found there, or
of a kind always asked about (a user's, an address while networks are in force), calls
:func:`apply`, which asks the limit's table: a dictionary look-up or a few (one a prefix
length for networks). So a crowd of subjects seen once costs the same as one subject seen
often, and nothing is remembered of a subject without an override. A
replaced check is remembered (:data:`MEMO` of them, forgotten with the snapshot's table or
when the table changes in place: :attr:`Table.version
<ratelimit_app.overrides.table.Table.version>`), so a subject's requests share one replaced
:class:`Check` object, as the engine's memos expect. A user's groups cost one query per
:data:`GROUPS_FOR` seconds at most, only for a limit that has group overrides.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeVar

from ratelimit_app.algorithms import calendar
from ratelimit_app.algorithms.calendar import Quota
from ratelimit_app.config.limits import Check, Limit
from ratelimit_app.overrides.table import UNLIMITED, USER_KINDS, Table, by_address
from ratelimit_app.runtime import RUNTIME

__all__ = ["apply", "forget", "prefilter"]

logger = logging.getLogger("ratelimit_app")

#: Replaced checks remembered (limit and check -> answer); starts over when full.
MEMO = 4096
#: Seconds a user's group names are used before asking again.
GROUPS_FOR = 60.0
#: The answer of an ``unlimited`` override.
_LIFTED: Any = object()


class _Memo:
    """The answers for the snapshot's table, and users' group names (a part of the
    runtime)."""

    __slots__ = ("answers", "groups", "of")

    def __init__(self) -> None:
        #: The table and its version the answers are for.
        self.of: tuple[Table | None, int] = (None, 0)
        #: (limit name, check) -> (replaced check, the check, or _LIFTED; ask again after).
        #: ``{(limit, check): (the override's rates, the check they make)}``.
        self.answers: dict[tuple[str, Check], tuple[Any, Check]] = {}
        #: user primary key -> (group names, ask again after).
        self.groups: dict[Any, tuple[frozenset[str], float]] = {}


class Decided(Protocol):
    """What :func:`apply` reads of a :class:`~ratelimit_app.engine.enforce.Decision` (a
    module above this one) and the check it replaces."""

    name: str | None
    limit: Limit
    check: Check


D = TypeVar("D", bound=Decided)


def forget() -> None:
    """Forget every answer and group (tests; a snapshot change does it by itself)."""
    RUNTIME.drop(_Memo)


def prefilter() -> tuple[dict[str, int], frozenset[str]]:
    """What tells, in one look-up or two, that a subject has no override under any limit:
    every value the table names (:attr:`Table.known`), and the key kinds to ask about
    whatever their value (:attr:`Table.asks`). A caller with a subject whose value is not
    in the first and whose kind is not in the second needs no :func:`apply`."""
    snap = RUNTIME.snapshot  # (the request's first layer looked at the version)
    if snap is None:  # none in force yet: no override either
        return {}, frozenset()
    table = snap.overrides
    return table.known, table.asks


def apply(request: Any, decisions: Sequence[D]) -> Sequence[D]:
    """``decisions`` with the overrides in force: a replaced check where a subject has
    other rates, and without the decisions an ``unlimited`` override lifts."""
    snap = RUNTIME.snapshot  # (the request's first layer looked at the version)
    if snap is None:  # none in force yet: no override either
        return decisions
    table = snap.overrides
    by_limit = table.by_limit
    kept: list[D] | None = None
    for i, d in enumerate(decisions):
        found = by_limit.get(d.name or d.limit.group)
        check = d.check
        # An in-flight decision shares its rule's name: an override is not about it.
        if found is not None and not d.limit.algorithm_kind.holds_places:
            kind, value = check.subject
            if kind == "ip":  # an address, a network
                rates = by_address(found, value)
            elif kind == "email" or kind.startswith(("email:", "post:", "get:", "header:")):
                rates = (found.values if kind[0] != "e" else found.folded).get(value)
            else:
                rates = _rates(request, table, d.name or d.limit.group, kind, value)
            if rates is not None:
                answer = _answer(table, d, rates)
                if answer is _LIFTED:
                    if kept is None:
                        kept = list(decisions[:i])
                    continue
                d.check = answer
        if kept is not None:
            kept.append(d)
    return decisions if kept is None else kept


def _rates(request: Any, table: Table, name: str, kind: str, value: str) -> Any:
    """The rates the table gives ``value`` of ``kind`` under the limit ``name``, or None."""
    if kind in USER_KINDS:
        rates, _ = table.lookup(
            name, kind, value, lambda: _username(request), lambda: _groups(request)
        )
    else:
        rates, _ = table.lookup(name, kind, value, _nobody, _no_groups)
    return rates


def _answers(table: Table) -> dict[tuple[str, Check], tuple[Any, Check]]:
    """The answers remembered for ``table`` as it is now: new ones when it is another
    table, or it changed in place. A new dict, not a cleared one: a thread still answering
    from the table as it was files its answer where no one looks any more."""
    memo = RUNTIME.part(_Memo)
    answers, seen, version = memo.answers, memo.of, table.version
    if seen[0] is not table or seen[1] != version:
        answers = memo.answers = {}
        memo.of = (table, version)
    return answers


def _answer(table: Table, d: Decided, rates: tuple[Any, ...]) -> Any:
    """The check ``d`` is decided with under an override of ``rates`` (or :data:`_LIFTED`),
    remembered for the table as it is now, so a subject's requests share one."""
    if rates == UNLIMITED:
        return _LIFTED
    answers = _answers(table)
    key = (d.name or d.limit.group, d.check)
    found = answers.get(key)
    if found is None or found[0] is not rates:  # (new rates: the table changed in place)
        found = (rates, _replaced(d, d.check, rates))
        if len(answers) >= MEMO:
            answers.clear()
        answers[key] = found
    return found[1]


def _nobody() -> None:
    return None


def _no_groups() -> tuple[str, ...]:
    return ()


def _replaced(d: Decided, check: Check, rates: tuple[Any, ...]) -> Check:
    """``check`` with ``rates`` and their own scope; the check itself when its kind of limit
    cannot take them (a leaky bucket takes one rate; logged: the admin's form refuses that
    for a rule it knows)."""
    own = [r.zone for r in check.rates if type(r) is Quota]
    fitted = calendar.zoned(rates, own[0] if own else None)
    why: str | None
    if fitted is None:
        why = "a quota by the week or the month overrides a limit's quota; this one has none"
    else:
        rates = fitted
        why = d.limit.algorithm_kind.unfit(rates, check.burst)
    if why is not None:
        logger.error("ratelimit: override of %s left out: %s", d.name or d.limit.group, why)
        return check
    return check._replace(scope=d.limit.scope_for(rates), rates=rates)


def _user(request: Any) -> Any:
    user = getattr(request, "user", None)
    return user if user is not None and user.is_authenticated else None


def _username(request: Any) -> str | None:
    user = _user(request)
    return None if user is None else str(user.get_username())


def _groups(request: Any) -> Iterable[str]:
    """The signed-in user's group names: one query per :data:`GROUPS_FOR` seconds at most."""
    user = _user(request)
    if user is None:
        return ()
    now = time.monotonic()
    groups = RUNTIME.part(_Memo).groups
    found = groups.get(user.pk)
    if found is not None and found[1] > now:
        return found[0]
    try:
        names = frozenset(user.groups.values_list("name", flat=True))
    except Exception as exc:  # no database, or no groups on a custom user model
        logger.warning("ratelimit: the groups of user %s could not be read: %s", user.pk, exc)
        names = frozenset()
    if len(groups) >= MEMO:
        groups.clear()
    groups[user.pk] = (names, now + GROUPS_FOR)
    return names
