"""Operations on one subject's counters, for the admin, the management commands and the
public :func:`reset` / :func:`lookup` (also importable from :mod:`ratelimit_app.core`).

A person types a subject (an IP, an email, a user id) and names a limit as they know it: a
rule, a DRF throttle's scope (``"drf:<scope>"``) or a throttle class, a decorator's group, or
a view that carries ``@ratelimit`` by its URL name, URL path or dotted path
(:func:`find_limits`; a name that stands for nothing says what it could have meant). A group
no routed view carries is named with its decorator's key and rate. :func:`target` finds
where that subject's counts are filed, :func:`lookup` reads them counting nothing,
:func:`reset` clears them, and :func:`ban` and :func:`unban` ban it and lift its bans.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app import ALL, clock, store
from ratelimit_app.algorithms import rates, windows
from ratelimit_app.backends import get_backend
from ratelimit_app.bans import applied as bans
from ratelimit_app.config import limits, sources, views
from ratelimit_app.config.kinds import DEFAULT, fixed_suffixes
from ratelimit_app.config.limits import Limit, Method
from ratelimit_app.config.rules import CompiledRule
from ratelimit_app.config.versions import COUNTS, bump
from ratelimit_app.engine import Check, check_many, usage_dict
from ratelimit_app.engine.checking import STRIKES
from ratelimit_app.engine.refusals.remembered import refusal_key
from ratelimit_app.identity import addresses, keys
from ratelimit_app.identity.namespaces import namespace
from ratelimit_app.runtime import RUNTIME

__all__ = [
    "LimitName",
    "Named",
    "Target",
    "UnknownLimit",
    "ban",
    "filed_names",
    "find_limit",
    "find_limits",
    "known_names",
    "lookup",
    "named_limits",
    "reset",
    "target",
    "unban",
]

#: What names a limit: a rule (its name or the compiled rule), a decorator's group, a DRF
#: scope (``"drf:<scope>"``), a throttle class of :mod:`ratelimit_app.throttling`, or the limit.
LimitName = str | CompiledRule | Limit | type


#: Buckets deleted per backend call by :func:`reset`.
RESET_BATCH = 5000


@dataclass(frozen=True, slots=True)
class Target:
    """The counters of one subject of a limit, found from what a person types (for
    :func:`reset`, :func:`lookup`, the commands and the admin)."""

    limit: Limit
    #: The limit's rates (fixed: a target never depends on a request).
    rates: tuple[rates.Rate, ...]
    #: The subject as the key stores it.
    value: str
    #: The subject as a masked IP, when it is one and the key is of another kind: the
    #: counters of requests that had no value for the key and fell back to the client IP.
    fallback_ip: str | None = None

    @property
    def scope(self) -> str:
        return self.limit.scope_for(self.rates)

    def subjects(self) -> list[tuple[str, str]]:
        """``(kind, value)`` of every place the subject's counts may be filed."""
        found = [(self.limit.kind, self.value)]
        if self.fallback_ip is not None:
            found.append(("ip", self.fallback_ip))
        return found

    def kinds(self) -> set[str]:
        return {kind for kind, _ in self.subjects()}

    def checks(self) -> list[Check]:
        """A look (counting nothing) at each place the subject's counts may be filed."""
        lim = self.limit
        return [
            Check(self.scope, subject, self.rates, False, lim.algorithm, lim.burst)
            for subject in self.subjects()
        ]


class UnknownLimit(ValueError):
    """A name that is no rule, DRF scope, ``@ratelimit`` group or decorated view: its message
    lists what the name could have meant."""


@dataclass(frozen=True, slots=True)
class Named:
    """A limit as people name it: a rule, a DRF throttle's scope, or a decorator's group."""

    #: "rule", "throttle" or "group".
    kind: str
    #: The rule's name, ``drf:<scope>``, or the decorator's group.
    name: str
    limit: Limit
    #: The view a decorator's limit was found on (its URL name or route), else "".
    view: str = ""
    #: What a person calls a throttle's source (``"DRF throttle"``), else "".
    source: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"

    def describe(self) -> str:
        """``name — key ip, 5/m`` (``DRF throttle, 5/m`` for a throttle's scope, and the view a
        decorator is on), for lists and choices."""
        lim = self.limit
        rate = lim.rate if isinstance(lim.rate, str) else "callable"
        if self.kind == "throttle":
            return f"{self.name} — {self.source or 'throttle'}, {rate}"
        key = lim.key if isinstance(lim.key, str) else "callable"
        where = f"@ratelimit on {self.view}, " if self.view else ""
        return f"{self.name} — {where}key {key}, {rate}"


#: How many names of each kind an unknown name's message lists.
LISTED = 20
#: How much of an unknown name is compared with the known ones (a pasted page costs nothing).
MATCHED = 200


def _decorated(name: str) -> tuple[Named, ...]:
    """The ``@ratelimit`` limits ``name`` stands for (:func:`ratelimit_app.config.views.find`);
    ``ValueError`` when they all lack a limit, or the URLconf cannot be loaded."""
    try:
        found = views.find(name)
    except Exception as exc:  # the project's URLconf: any error of its import
        raise ValueError(f"{name!r}: the URLconf could not be loaded to find it: {exc}") from exc
    usable = tuple(
        Named("group", d.group, d.limit, "" if name == d.group else name)
        for d in found
        if d.limit is not None
    )
    if found and not usable:
        raise ValueError(" ".join(str(d.problem) for d in found))
    return usable


def find_limits(name: LimitName) -> tuple[Named, ...]:
    """Every limit ``name`` stands for: a rule (a
    :class:`~ratelimit_app.config.rules.CompiledRule`, or the name of a rule in force), a DRF
    throttle (``"drf:<scope>"`` or its class), a decorator's group, or a view that carries
    ``@ratelimit`` (by its URL name, URL path or dotted path: each of its decorators).

    Raises :class:`UnknownLimit` when there is none, ``ValueError`` when the name is a
    decorator's that makes no limit."""
    if isinstance(name, Limit):
        return (Named("group", name.group, name),)
    if isinstance(name, CompiledRule):
        return (Named("rule", name.name, name.limit),)
    # The DRF throttles' limits come from the sources registry, filled by their package
    # when the project imports it: this module never imports DRF.
    if not isinstance(name, str):
        resolved = sources.resolve(name)
        if resolved is None:
            raise ValueError(f"{name!r} is no rule, group or throttle of ours.")
        return (Named("throttle", resolved.group, resolved),)
    text = name.strip()
    rule = store.current().rules.by_name.get(text)
    if rule is not None:
        return (Named("rule", text, rule.limit),)
    # Reading the URLconf imports the views, and with them our throttles, which register
    # their source: a scope unknown before may be known after.
    found = _throttle(text) or (_decorated(text) if text else ()) or _throttle(text)
    if not found:
        raise UnknownLimit(unknown(text))
    return found


def _throttle(name: str) -> tuple[Named, ...]:
    found = sources.limit(name)
    return () if found is None else (Named("throttle", name, found),)


def named_limits() -> list[Named]:
    """Every limit that can be named: the rules in force, the DRF throttles' scopes, and the
    groups of the decorated views of the URLconf (those it can load), each once."""
    routed = _routed()  # first: it imports the views, and our throttles with them
    found = [Named("rule", r.name, r.limit) for r in store.current().rules.rules]
    found += [
        Named("throttle", n, lim, source=source.kind)
        for source in sources.registered()
        for n, lim in source.limits().items()
    ]
    seen = {n.name for n in found}
    for view in routed:
        for d in view.limits:
            if d.limit is not None and d.group not in seen:
                seen.add(d.group)
                found.append(Named("group", d.group, d.limit, view.label))
    return found


def _routed() -> list[views.View]:
    """The decorated views, none when the URLconf cannot be loaded (a lookup by a view's
    name then says why)."""
    try:
        return views.routed()
    except Exception:  # the project's URLconf: any error of its import
        return []


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED])
    return shown + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")


def unknown(name: str) -> str:
    """What to say of a name that stands for no limit: what it could have meant."""
    routed = _routed()  # first: it imports the views, and our throttles with them
    rules = sorted(store.current().rules.by_name)
    throttles = sorted(n for s in sources.registered() for n in s.limits())
    shown = name if len(name) <= 80 else name[:80] + "…"
    text = f"No rule named {shown!r}. " + (
        f"Configured rules: {_listed(rules)}." if rules else "RATELIMIT_RULES has no rules."
    )
    text += " Nor is it a DRF throttle's scope, a @ratelimit group, or a decorated view's URL "
    text += "name, path or dotted path."
    if throttles:
        text += f" DRF throttles: {_listed(throttles)}."
    if routed:
        text += f" Views with @ratelimit: {_listed([v.label for v in routed])}."
    candidates = [*rules, *throttles, *_view_names(routed)]
    close = difflib.get_close_matches(name[:MATCHED], candidates, n=1)
    return text + (f" Did you mean {close[0]!r}?" if close else "")


def _view_names(routed: list[views.View]) -> list[str]:
    return [n for v in routed for n in (v.label, v.path, *(d.group for d in v.limits))]


def known_names() -> set[str]:
    """Every name the site knows a limit by: the rules in force, the DRF scopes, and the
    decorated views' URL names (or routes), dotted paths and groups."""
    routed = _routed()  # first: it imports the views, and our throttles with them
    throttles = {n for s in sources.registered() for n in s.limits()}
    return {*store.current().rules.by_name, *throttles, *_view_names(routed)}


def filed_names(name: str) -> tuple[str, ...]:
    """The names the limits ``name`` stands for (:func:`find_limits`) are filed under, each
    once: what an override's ``limit`` and a ban row's ``limit`` hold (a rule's name,
    ``drf:<scope>``, a decorator's group: a view's URL name, path or dotted path gives its
    decorators' groups). Raises :class:`UnknownLimit` when ``name`` stands for no limit the
    site knows, ``ValueError`` as :func:`find_limits` does."""
    return tuple(dict.fromkeys(n.name for n in find_limits(name)))


def find_limit(
    rule_or_group: LimitName,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    algorithm: str = DEFAULT,
    burst: int | None = None,
) -> Limit:
    """The one limit a name stands for (see :func:`find_limits`), or, with the decorator's
    ``key`` and ``rate`` (and ``method``, ``algorithm`` and ``burst``), the limit of a
    ``@ratelimit`` group. Raises ``ValueError`` when there is none, or several."""
    if key is None:
        found = find_limits(rule_or_group)
        if len(found) > 1:
            each = "; ".join(n.describe() for n in found)
            raise ValueError(
                f"{rule_or_group!r} names {len(found)} limits ({each}): name one by its group, "
                "or give its key and rate."
            )
        return found[0].limit
    if not isinstance(rule_or_group, str):
        return find_limit(rule_or_group)
    if rate is None:
        raise ValueError(f"{rule_or_group!r}: a group needs the key and rate of its decorator.")
    try:
        return limits.build(rule_or_group, key, rate, method, algorithm, burst)
    except ImproperlyConfigured as exc:
        raise ValueError(f"{rule_or_group!r}: {exc}") from exc


def target(
    rule_or_group: LimitName,
    subject: str,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    algorithm: str = DEFAULT,
    burst: int | None = None,
) -> Target | None:
    """The counters ``subject`` has under a limit (see :func:`find_limit`). ``subject`` is
    what a person types: an IP, an email (case folded as the key does), a user id. Returns
    None when the subject is empty or invalid.

    Raises ``ValueError`` when the limit cannot be found, its rates depend on the request,
    or its algorithm, rates and burst do not make a limit.
    """
    limit = find_limit(rule_or_group, key, rate, method, algorithm, burst)
    if limit.static_rates is None:
        name = rule_or_group.name if isinstance(rule_or_group, CompiledRule) else limit.group
        raise ValueError(f"{name!r}: its rate depends on the request; pass the rate it returns.")
    value = keys.normalize_value(limit.key, subject)
    if value is None:
        return None
    fallback = None
    if limit.kind not in ("ip", "user_or_ip"):
        fallback = addresses.mask_ip(subject)
    return Target(limit, limit.static_rates, value, fallback)


def reset(
    rule_or_group: LimitName,
    subject: str,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    algorithm: str = DEFAULT,
    burst: int | None = None,
) -> bool:
    """Clear the counters of one subject (an IP, an email, a user id) of a rule or group:
    its sliding windows and its leaky bucket, whichever it has.

    Arguments as for :func:`target`. Returns False when there is nothing to reset (an empty
    or invalid subject); raises ``ValueError`` for an unknown rule and ``BackendError`` when
    the backend fails.
    """
    found = target(rule_or_group, subject, key, rate, method, algorithm, burst)
    if found is None:
        return False
    # Every kind's fixed counters (a limit whose algorithm changed leaves none behind), and
    # the buckets of its own kind.
    suffixes = fixed_suffixes()
    suffixes += found.limit.algorithm_kind.buckets(found.rates, clock.now())
    RUNTIME.refusals.forget(refusal_key(c) for c in found.checks())
    backend = get_backend()
    spec = found.limit.ban
    strikes = [] if spec is None else _strike_suffixes(spec.strikes)
    for kind, value in found.subjects():
        _delete(backend, namespace(found.scope, kind, value), suffixes)
        if strikes:  # the refusals counted toward its ban: the next ban needs them all
            _delete(backend, namespace(found.scope + STRIKES, kind, value), strikes)
        if spec is not None or store.current().banning:  # its ban, and the memory of it
            bans.lift(found.scope, (kind, value))
    bump(COUNTS)  # every process forgets its refusals within a second (counts went down)
    return True


def unban(
    rule_or_group: LimitName,
    subject: str,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    algorithm: str = DEFAULT,
    burst: int | None = None,
) -> tuple[list[Any], int]:
    """Lift the bans of one subject by a limit (and its ban on every path, for an
    address), in every process within a second (:func:`ratelimit_app.bans.applied.lift`), and
    forget the refusals counted toward its next ban, or its next refusal would ban it again.
    Its counters are kept: it is admitted as the limit's rates allow (:func:`reset` clears
    them too).

    Arguments as for :func:`target`. Returns the ban rows that were in force (a
    :class:`~ratelimit_app.models.Ban` each) and the number of rows lifted, the memory of
    ended bans included; ``([], 0)`` for an empty or invalid subject."""
    found = target(rule_or_group, subject, key, rate, method, algorithm, burst)
    if found is None:
        return [], 0
    held = {}
    for place in found.subjects():
        row = bans.find(found.scope, place)
        if row is not None:
            held[row.pk] = row
    lifted = sum(bans.lift(found.scope, place) for place in found.subjects())
    spec = found.limit.ban
    if spec is not None:
        strikes = _strike_suffixes(spec.strikes)
        backend = get_backend()
        for kind, value in found.subjects():
            _delete(backend, namespace(found.scope + STRIKES, kind, value), strikes)
    RUNTIME.refusals.forget(refusal_key(c) for c in found.checks())
    return list(held.values()), lifted


def _strike_suffixes(strikes: rates.Rate) -> list[str]:
    """The buckets a ban's strikes (``after`` per ``within``) may be counted in now."""
    return sorted(windows.stored_suffixes((strikes,), clock.now(), windows.BUCKETS_PER_WINDOW))


def _delete(backend: Any, ns: str, suffixes: list[str]) -> None:
    """Delete the buckets ``suffixes`` of namespace ``ns``, a batch a round trip."""
    for start in range(0, len(suffixes), RESET_BATCH):
        backend.delete(ns, suffixes[start : start + RESET_BATCH])


def ban(
    rule_or_group: LimitName, subject: str, seconds: int, request: Any = None, by: str = ""
) -> Any:
    """Ban one subject of a limit for ``seconds`` now, as a person decides it (the admin's
    *Refused lately*): its requests to that limit are refused until then, in every process
    within a second; a reset lifts it. Returns the ban's end (an aware datetime), or None
    for an empty or invalid subject. Arguments as for :func:`target`; ``by``: who, for the
    log."""
    if type(seconds) is not int or not 0 < seconds <= rates.MAX_SECONDS:
        raise ValueError(f"A ban lasts from 1 second to 366 days, not {seconds!r}.")
    found = target(rule_or_group, subject)
    if found is None:
        return None
    # Filed as the limiter files the bans it makes: a view's name gives its group.
    name = filed_names(rule_or_group)[0] if isinstance(rule_or_group, str) else found.limit.group
    subject_of = (found.limit.kind, found.value)
    return bans.ban_now(name, found.scope, subject_of, seconds, request, by)


def lookup(
    rule_or_group: LimitName,
    subject: str,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    algorithm: str = DEFAULT,
    burst: int | None = None,
) -> dict[str, Any] | None:
    """The usage of one subject (as :func:`get_usage` reports it, counting nothing): for a
    leaky bucket, its level, capacity and the seconds until it is empty.

    A subject its limit has banned has ``banned_until`` (an aware datetime), ``ban_seconds``
    and ``ban_site`` too.

    Arguments as for :func:`target`; None for an empty or invalid subject. An IP typed for a
    key of another kind may name the key's own counters (a header holding an address) or the
    IP fallback's: both are read, in one round trip, and the busier is reported. Raises
    ``ValueError`` for an unknown rule and ``BackendError`` when the backend fails.
    """
    found = target(rule_or_group, subject, key, rate, method, algorithm, burst)
    if found is None:
        return None
    results = check_many(found.checks())
    busiest = max(results, key=lambda r: r.binding().count)  # the first on a tie: its own
    usage = usage_dict(busiest)
    if store.current().banning:  # a limit's ban, or one a person made
        for place in found.subjects():
            ban = bans.find(found.scope, place)
            if ban is not None:
                usage.update(banned_until=ban.until, ban_seconds=ban.seconds, ban_site=ban.site)
    return usage
