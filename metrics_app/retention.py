"""Retention tiers: parsing, validation and bucket alignment. Pure, no Django, no I/O.

The syntax is Graphite's (``"1m:1d,5m:2d,1h:31d,1w:1y"``: precision ``:`` how long), validated
with whisper's rules plus one of ours (the finest precision is a whole number of minutes:
:func:`metrics_app.record` counts per minute); docs/metrics.rst, "Retention", lists them.
Buckets are aligned on Monday 1970-01-05 00:00 UTC, so weeks start on Mondays and every
bucket nests in exactly one bucket of each coarser tier.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

__all__ = [
    "DEFAULT_RETENTION",
    "EPOCH_MONDAY",
    "Retention",
    "Tier",
    "align",
    "parse_retention",
]

DEFAULT_RETENTION = "1m:1d,5m:2d,1h:31d,1w:1y"

#: Seconds from the Unix epoch (a Thursday) to the first Monday, 1970-01-05 00:00 UTC.
EPOCH_MONDAY = 4 * 86400

_UNITS: tuple[tuple[str, int], ...] = (
    ("seconds", 1),
    ("minutes", 60),
    ("hours", 3600),
    ("days", 86400),
    ("weeks", 7 * 86400),
    ("years", 365 * 86400),
)
_AMOUNT = re.compile(r"^(\d+)([a-z]+)$")


def align(t: float, precision: int) -> int:
    """Start (Unix seconds) of the ``precision``-second bucket holding ``t``."""
    start = int(t // 1)
    return start - ((start - EPOCH_MONDAY) % precision)


@dataclass(frozen=True)
class Tier:
    """One retention tier: buckets of ``precision`` seconds kept for ``points`` buckets."""

    precision: int
    points: int

    @property
    def age(self) -> int:
        """Seconds this tier covers: data stays at this precision at least this long."""
        return self.precision * self.points

    def __str__(self) -> str:
        return f"{_format(self.precision)}:{_format(self.age)}"


@dataclass(frozen=True)
class Retention:
    """A validated, sorted tuple of tiers (finest first)."""

    tiers: tuple[Tier, ...]

    @property
    def finest(self) -> Tier:
        return self.tiers[0]

    @property
    def precisions(self) -> tuple[int, ...]:
        return tuple(t.precision for t in self.tiers)

    def fold_cutoff(self, index: int, now: float) -> int:
        """Buckets of tier ``index`` starting before this are due to fold into the next tier.

        A fine bucket is due as soon as it *itself* ended at least the tier's age ago
        (``start + precision <= now - age``), whatever the rest of the coarse bucket it folds
        into: a tier's age is a minimum, and a coarse period may be split between a coarse
        row (its older part) and finer rows (its younger part) until it is all folded.
        """
        tier = self.tiers[index]
        return align(now - tier.age, tier.precision)

    def content_end(self, precision: int, now: float) -> int | None:
        """Every count stored at ``precision`` lies before this (None: no bound but the row's).

        A row of tier ``i > 0`` only ever receives folded tier-``i-1`` buckets, which were
        due, so its events lie before ``fold_cutoff(i - 1, now)`` (cutoffs only grow with
        time). Queries use it to tell a coarse row holding the older part of a split period
        from one that overlaps the range asked for. It assumes that downsampling never ran
        with a clock ahead of the querying process's.
        """
        for i, tier in enumerate(self.tiers):
            if tier.precision == precision:
                return self.fold_cutoff(i - 1, now) if i else None
        return None

    def expiry_cutoff(self, now: float) -> int:
        """Buckets of the last tier starting before this have ended more than its age ago."""
        last = self.tiers[-1]
        return align(now - last.age, last.precision)

    def expected_step(self, t: float, now: float) -> int:
        """The step the retention guarantees for time ``t`` at time ``now``."""
        for tier in self.tiers:
            if t >= now - tier.age:
                return tier.precision
        return self.tiers[-1].precision

    def __str__(self) -> str:
        return ",".join(str(t) for t in self.tiers)


def _unit(name: str) -> int:
    for full, seconds in _UNITS:
        if full.startswith(name):
            return seconds
    raise ValueError(f"invalid unit {name!r} (use s, m, h, d, w or y)")


def _format(seconds: int) -> str:
    for full, size in reversed(_UNITS):
        if seconds % size == 0:
            return f"{seconds // size}{full[0]}"
    return f"{seconds}s"  # pragma: no cover  (every int is a multiple of one second)


def parse_tier(text: str) -> Tier:
    """Parse one ``precision:retention`` definition (whisper's ``parseRetentionDef``)."""
    precision_text, sep, points_text = text.strip().partition(":")
    if not sep:
        raise ValueError(
            f"invalid retention definition {text.strip()!r} (expected 'precision:age')"
        )
    if precision_text.isdigit():
        precision = int(precision_text)
    else:
        match = _AMOUNT.match(precision_text)
        if not match:
            raise ValueError(f"invalid precision specification {precision_text!r}")
        precision = int(match.group(1)) * _unit(match.group(2))
    if precision <= 0:
        raise ValueError(f"precision must be positive in {text.strip()!r}")
    if points_text.isdigit():
        points = int(points_text)
    else:
        match = _AMOUNT.match(points_text)
        if not match:
            raise ValueError(f"invalid retention specification {points_text!r}")
        points = int(match.group(1)) * _unit(match.group(2)) // precision
    if points <= 0:
        raise ValueError(f"retention {text.strip()!r} holds no point (retention < precision)")
    return Tier(precision, points)


def validate(tiers: list[Tier]) -> Retention:
    """Apply whisper's ``validateArchiveList`` rules plus metrics_app's whole-minute rule."""
    if not tiers:
        raise ValueError("at least one retention tier is required")
    tiers = sorted(tiers, key=lambda t: t.precision)
    for tier, nxt in itertools.pairwise(tiers):
        if tier.precision == nxt.precision:
            raise ValueError(f"two tiers have the same precision ({tier} and {nxt})")
        if nxt.precision % tier.precision:
            raise ValueError(
                f"each precision must divide the next: {_format(tier.precision)} does not "
                f"divide {_format(nxt.precision)}"
            )
        if nxt.age <= tier.age:
            raise ValueError(
                f"each tier must cover a longer time than the one before ({nxt} after {tier})"
            )
        if tier.points < nxt.precision // tier.precision:
            raise ValueError(
                f"tier {tier} has {tier.points} points, fewer than the "
                f"{nxt.precision // tier.precision} of its precision in one bucket of {nxt}"
            )
    if tiers[0].precision % 60:
        raise ValueError(
            f"the finest precision must be a whole number of minutes (record() counts per "
            f"minute), not {tiers[0].precision}s"
        )
    return Retention(tuple(tiers))


def parse_retention(text: str) -> Retention:
    """Parse and validate ``METRICS_RETENTION``; ``ValueError`` names the bad part."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("METRICS_RETENTION must be a non-empty string like '1m:1d,1h:31d'")
    return validate([parse_tier(part) for part in text.split(",")])
