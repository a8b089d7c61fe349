"""A limit's ``ban`` option: what it says, and how long each ban lasts (pure).

A limit with a ban (``{"after": 10, "within": "10m", "for": "1h", "max": "1d"}``) bans a
subject it refused ``after`` times within ``within`` seconds: every request of that subject
is then refused outright for ``for`` seconds. Each further ban of the same subject while the
last one is remembered (until ``max`` seconds after it ended) lasts twice the last, up to
``max``.
``"scope": "site"`` bans the subject's address on every path, not only the limit's.

No I/O; of Django only ``ImproperlyConfigured``, for a bad option. The engine counts the
refusals (a sliding window of ``after`` per ``within``), :mod:`ratelimit_app.bans` keeps
the bans.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app.algorithms.rates import MAX_COUNT, MAX_SECONDS, Rate, duration

__all__ = ["RULE", "SITE", "BanSpec", "next_seconds", "parse_ban"]

#: Where a ban applies: the limit's own requests, or every request of the address.
RULE = "rule"
SITE = "site"
#: The keys a ban spec may have, and what each must be (for error messages).
KEYS = MappingProxyType(
    {
        "after": "the refusals that ban, an integer from 1",
        "within": "the time those refusals are counted in, such as '10m'",
        "for": "how long the first ban lasts, such as '1h'",
        "max": "the longest ban, reached by doubling (default: the first ban's length)",
        "scope": "'rule' (default: the limit's own requests) or 'site' (every path; IP keys)",
    }
)


@dataclass(frozen=True, slots=True)
class BanSpec:
    """A validated ban: ``after`` refusals within ``within`` seconds ban for ``seconds``,
    doubling up to ``most`` seconds; ``site``: on every path."""

    after: int
    within: int
    seconds: int
    most: int
    site: bool = False

    @property
    def strikes(self) -> Rate:
        """The window the refusals are counted in: ``after`` per ``within``."""
        return Rate(self.after, self.within)

    def describe(self) -> dict[str, object]:
        """The spec as written in a rule (seconds as ``"<n>s"``)."""
        out: dict[str, object] = {
            "after": self.after,
            "within": f"{self.within}s",
            "for": f"{self.seconds}s",
            "max": f"{self.most}s",
        }
        if self.site:
            out["scope"] = SITE
        return out


def parse_ban(raw: object) -> BanSpec:
    """Validate a ban spec (a dict, or a :class:`BanSpec`); ``ImproperlyConfigured`` naming
    the key that is wrong."""
    if isinstance(raw, BanSpec):
        return raw
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(
            f"Ban {raw!r}: expected a dict such as "
            "{'after': 10, 'within': '10m', 'for': '1h', 'max': '1d'}."
        )
    unknown = sorted(str(k) for k in set(raw) - set(KEYS))
    if unknown:
        raise ImproperlyConfigured(
            f"Ban key {unknown[0]!r}: unknown; a ban has {', '.join(KEYS)}."
        )
    missing = [k for k in ("after", "within", "for") if k not in raw]
    if missing:
        raise ImproperlyConfigured(f"Ban: {missing[0]!r} is missing: {KEYS[missing[0]]}.")
    after = raw["after"]
    if type(after) is not int or not 1 <= after <= MAX_COUNT:
        raise ImproperlyConfigured(f"Ban 'after' {after!r}: expected {KEYS['after']}.")
    within = duration(raw["within"], "Ban 'within'")
    seconds = duration(raw["for"], "Ban 'for'")
    most = duration(raw["max"], "Ban 'max'") if "max" in raw else seconds
    if most < seconds:
        raise ImproperlyConfigured(
            f"Ban 'max' {raw['max']!r}: the longest ban is at least the first ({raw['for']!r})."
        )
    scope = raw.get("scope", RULE)
    if scope not in (RULE, SITE):
        raise ImproperlyConfigured(f"Ban 'scope' {scope!r}: expected {KEYS['scope']}.")
    return BanSpec(after, within, seconds, most, scope == SITE)


def next_seconds(spec: BanSpec, last: int | None, since_last: float | None) -> int:
    """How long a new ban lasts: ``spec.seconds``, or twice the ``last`` ban (up to
    ``spec.most``) when that one ended ``since_last`` seconds ago, less than ``most``."""
    if last is None or since_last is None or since_last >= spec.most:
        return spec.seconds
    return min(max(last, spec.seconds) * 2, spec.most, MAX_SECONDS)
