"""The overrides in force, applied to a request's decisions before they are checked.

:func:`apply` is called by :func:`ratelimit_app.engine.enforce.decide` only while the
configuration snapshot holds overrides (:data:`ratelimit_app.store.overriding`). A decision
whose subject has an override gets a check of its own: the same check with the override's
rates and the scope of those rates (:meth:`Limit.scope_for
<ratelimit_app.config.limits.Limit.scope_for>`), so the subject's counters under the override
are apart from its counters under the limit's own rates. An ``unlimited`` override takes the
decision out of the request: it is admitted and counts nothing.

An override changes rates, never places: a decision of an in-flight limit (a rule's
``concurrent``, filed under the rule's name beside its rate limit) is left as it is, so a
subject given ``600/h`` or ``unlimited`` still holds at most ``concurrent`` places at once.

The answer for a check is remembered (:data:`MEMO` of them, forgotten with the snapshot's
table or when the table changes in place: :attr:`Table.version
<ratelimit_app.config.overrides.Table.version>`), so
a subject's requests share one replaced :class:`Check` object, as the engine's memos expect.
An answer that depended on the user's groups is asked again after :data:`GROUPS_FOR`
seconds, and a user's groups cost one query per :data:`GROUPS_FOR` seconds at most, only
for a limit that has group overrides.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeVar

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app import store
from ratelimit_app.algorithms import gcra
from ratelimit_app.algorithms.gcra import IN_FLIGHT
from ratelimit_app.config.limits import Check, Limit
from ratelimit_app.config.overrides import UNLIMITED, Table

__all__ = ["apply", "forget"]

logger = logging.getLogger("ratelimit_app")

#: Replaced checks remembered (limit and check -> answer); starts over when full.
MEMO = 4096
#: Seconds a user's group names (and the answers they gave) are used before asking again.
GROUPS_FOR = 60.0
#: The answer of an ``unlimited`` override.
_LIFTED: Any = object()


class _Memo:
    """The answers for the snapshot's table, and users' group names."""

    __slots__ = ("answers", "groups", "of")

    def __init__(self) -> None:
        #: The table and its version the answers are for.
        self.of: tuple[Table | None, int] = (None, 0)
        #: (limit name, check) -> (replaced check, the check, or _LIFTED; ask again after).
        self.answers: dict[tuple[str, Check], tuple[Any, float]] = {}
        #: user primary key -> (group names, ask again after).
        self.groups: dict[Any, tuple[frozenset[str], float]] = {}


_memo = _Memo()


class Decided(Protocol):
    """What :func:`apply` reads of a :class:`~ratelimit_app.engine.enforce.Decision` (a
    module above this one) and the check it replaces."""

    name: str | None
    limit: Limit
    check: Check


D = TypeVar("D", bound=Decided)


def forget() -> None:
    """Forget every answer and group (tests; a snapshot change does it by itself)."""
    _memo.of = (None, 0)
    _memo.answers = {}
    _memo.groups.clear()


def apply(request: Any, decisions: Sequence[D]) -> Sequence[D]:
    """``decisions`` with the overrides in force: a replaced check where a subject has
    other rates, and without the decisions an ``unlimited`` override lifts."""
    table = store.current().overrides
    answers = _answers(table)
    kept: list[D] | None = None
    for i, d in enumerate(decisions):
        name = d.name or d.limit.group
        # An in-flight decision shares its rule's name: an override is not about it.
        if name not in table.by_limit or d.check.algorithm == IN_FLIGHT:
            if kept is not None:
                kept.append(d)
            continue
        answer = _answer(request, table, answers, name, d)
        if answer is _LIFTED:
            if kept is None:
                kept = list(decisions[:i])
            continue
        d.check = answer
        if kept is not None:
            kept.append(d)
    return decisions if kept is None else kept


def _answers(table: Table) -> dict[tuple[str, Check], tuple[Any, float]]:
    """The answers remembered for ``table`` as it is now: new ones when it is another
    table, or it changed in place. A new dict, not a cleared one: a thread still answering
    from the table as it was files its answer where no one looks any more."""
    answers, seen, version = _memo.answers, _memo.of, table.version
    if seen[0] is not table or seen[1] != version:
        answers = _memo.answers = {}
        _memo.of = (table, version)
    return answers


def _answer(
    request: Any,
    table: Table,
    answers: dict[tuple[str, Check], tuple[Any, float]],
    name: str,
    d: Decided,
) -> Any:
    """The check ``d`` is decided with (or :data:`_LIFTED`), remembered in ``answers``."""
    check = d.check
    key = (name, check)
    found = answers.get(key)
    if found is not None and (found[1] == 0.0 or found[1] > time.monotonic()):
        return found[0]
    kind, value = check.subject
    rates, by_groups = table.lookup(
        name, kind, value, lambda: _username(request), lambda: _groups(request)
    )
    if rates is None:
        answer: Any = check
    elif rates == UNLIMITED:
        answer = _LIFTED
    else:
        answer = _replaced(d, check, rates)
    if len(answers) >= MEMO:
        answers.clear()
    answers[key] = (answer, time.monotonic() + GROUPS_FOR if by_groups else 0.0)
    return answer


def _replaced(d: Decided, check: Check, rates: tuple[Any, ...]) -> Check:
    """``check`` with ``rates`` and their own scope; the check itself when a leaky bucket
    cannot take them (logged: the admin's form refuses that for a rule it knows)."""
    if check.algorithm == gcra.LEAKY_BUCKET:
        try:
            gcra.meter(rates, check.burst)
        except ImproperlyConfigured as exc:
            logger.error("ratelimit: override of %s left out: %s", d.name or d.limit.group, exc)
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
    found = _memo.groups.get(user.pk)
    if found is not None and found[1] > now:
        return found[0]
    try:
        names = frozenset(user.groups.values_list("name", flat=True))
    except Exception as exc:  # no database, or no groups on a custom user model
        logger.warning("ratelimit: the groups of user %s could not be read: %s", user.pk, exc)
        names = frozenset()
    if len(_memo.groups) >= MEMO:
        _memo.groups.clear()
    _memo.groups[user.pk] = (names, now + GROUPS_FOR)
    return names
