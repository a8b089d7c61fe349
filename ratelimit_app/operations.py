"""Operations on one subject's counters, for the admin, the management commands and the
public :func:`reset` / :func:`lookup` (also importable from :mod:`ratelimit_app.core`).

A person types a subject (an IP, an email, a user id) and names a rule, a decorator's group
(with its key and rate), a DRF throttle's scope (``"drf:<scope>"``) or a throttle class;
:func:`target` finds where that subject's counts are filed, :func:`lookup` reads them
counting nothing, and :func:`reset` clears them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app import ALL, clock, keys, store
from ratelimit_app.algorithms import gcra, rates, windows
from ratelimit_app.algorithms.gcra import SLIDING_WINDOW
from ratelimit_app.backends import get_backend
from ratelimit_app.config import limits, sources
from ratelimit_app.config.limits import Limit, Method
from ratelimit_app.config.rules import CompiledRule
from ratelimit_app.engine import REFUSALS, Check, check_many, refusal_key, usage_dict
from ratelimit_app.identity import addresses
from ratelimit_app.identity.namespaces import namespace

__all__ = ["LimitName", "Target", "find_limit", "lookup", "reset", "target"]

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


def find_limit(
    rule_or_group: LimitName,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    algorithm: str = SLIDING_WINDOW,
    burst: int | None = None,
) -> Limit:
    """The limit a rule (a :class:`~ratelimit_app.config.rules.CompiledRule`, or the name of
    a rule in force), a decorator's group (with the decorator's ``key``, ``rate``, ``method``,
    ``algorithm`` and ``burst``) or a DRF throttle (``"drf:<scope>"`` or its class) counts
    with. Raises ``ValueError`` when there is none."""
    if isinstance(rule_or_group, Limit):
        return rule_or_group
    if isinstance(rule_or_group, CompiledRule):
        return rule_or_group.limit
    # The DRF throttles' limits come from the sources registry, filled by their package
    # when the project imports it: this module never imports DRF.
    if not isinstance(rule_or_group, str):
        resolved = sources.resolve(rule_or_group)
        if resolved is None:
            raise ValueError(f"{rule_or_group!r} is no rule, group or throttle of ours.")
        return resolved
    if key is None:
        found = store.current().rules.by_name.get(rule_or_group)
        named = found.limit if found is not None else sources.limit(rule_or_group)
        if named is None:
            raise ValueError(
                f"No rule named {rule_or_group!r} in RATELIMIT_RULES; for a @ratelimit group "
                f"pass its key and rate."
            )
        return named
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
    algorithm: str = SLIDING_WINDOW,
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
    algorithm: str = SLIDING_WINDOW,
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
    suffixes = [gcra.SUFFIX]
    if not found.limit.metered:
        now = clock.now()
        suffixes += sorted(windows.stored_suffixes(found.rates, now, windows.BUCKETS_PER_WINDOW))
    REFUSALS.forget(refusal_key(c) for c in found.checks())
    backend = get_backend()
    for kind, value in found.subjects():
        ns = namespace(found.scope, kind, value)
        for start in range(0, len(suffixes), RESET_BATCH):
            backend.delete(ns, suffixes[start : start + RESET_BATCH])
    return True


def lookup(
    rule_or_group: LimitName,
    subject: str,
    key: keys.KeySpec | None = None,
    rate: rates.RateSpec = None,
    method: Method = ALL,
    algorithm: str = SLIDING_WINDOW,
    burst: int | None = None,
) -> dict[str, Any] | None:
    """The usage of one subject (as :func:`get_usage` reports it, counting nothing): for a
    leaky bucket, its level, capacity and the seconds until it is empty.

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
    return usage_dict(busiest)
