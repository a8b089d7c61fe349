"""Whether a name a person typed is a typo of a limit's name.

An override filed under a name no limit has does nothing, and says nothing: ``scam`` for the
rule ``scan`` leaves ``scan``'s subject limited. A ratio of likeness (``difflib``) misses
typos in short names (``scam`` is 0.75 like ``scan``), so a typo is counted in edits: one
character replaced, added, dropped, or two neighbours swapped (``scna``); a long name is
also a typo when it is as alike as two slips make it. Names that differ only in digits
(``api-v1``, ``api-v2``) are a series, never a typo. Pure logic.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["ALIKE", "SHORTEST", "close_to", "one_typo_away", "series", "typo_of"]

#: How alike (``difflib``'s ratio) a name must be to a known one to be a typo of it, one
#: typo away or not: two slips in a name of ten characters or more.
ALIKE = 0.8

#: Names shorter than this are not compared: one edit of ``ab`` is half of it, and ``ab``
#: and ``ac`` are as likely two names as one name mistyped.
SHORTEST = 3


def one_typo_away(typed: str, known: str) -> bool:
    """Whether ``typed`` is ``known`` with one typo: a character replaced, added or dropped,
    or two neighbours swapped. Never for equal names, for names under :data:`SHORTEST`
    characters, nor where one digit replaces another (``api-v1`` and ``api-v2`` are a
    series, not a slip)."""
    if typed == known or min(len(typed), len(known)) < SHORTEST or series(typed, known):
        return False
    if len(typed) == len(known):
        differ = [i for i, (a, b) in enumerate(zip(typed, known, strict=True)) if a != b]
        if len(differ) == 1:
            return True
        if len(differ) == 2:
            i, j = differ
            return j == i + 1 and typed[i] == known[j] and typed[j] == known[i]
        return False
    shorter, longer = sorted((typed, known), key=len)
    if len(longer) - len(shorter) != 1:
        return False
    i = next(
        (i for i, (a, b) in enumerate(zip(shorter, longer, strict=False)) if a != b), len(shorter)
    )
    return shorter[i:] == longer[i + 1 :]


def series(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ only where each has a digit (``api-v1``, ``api-v2``)."""
    if len(a) != len(b):
        return False
    return all(x == y or (x.isdigit() and y.isdigit()) for x, y in zip(a, b, strict=True))


def typo_of(typed: str, names: Iterable[str]) -> str | None:
    """The first of ``names`` that ``typed`` is one typo away from (sorted, so the answer
    does not depend on the order of a set), or None."""
    return next((n for n in sorted(names) if one_typo_away(typed, n)), None)


def close_to(typed: str, names: Iterable[str]) -> str | None:
    """The name of ``names`` that ``typed`` is a typo of: one typo away (:func:`typo_of`),
    else as alike as :data:`ALIKE` (the closest), never of a :func:`series`; or None."""
    known = sorted(set(names))
    found = typo_of(typed, known)
    if found is not None:
        return found
    alike = difflib.get_close_matches(typed, known, n=len(known) or 1, cutoff=ALIKE)
    return next((n for n in alike if n != typed and not series(typed, n)), None)
