"""Rates: parse and validate ``'5/m'``, ``'100/10s'``, ``'5/m;10/d'`` and ``(count, seconds)``.

Pure logic, no I/O. Parsing is strict but takes every unit word django-ratelimit users write:
django-ratelimit reads only a unit's first letter (``'10/minute'`` is ten a minute, and so,
by accident, are ``'10/mo'`` and ``'10/ms'``; ``'10/M'`` is ten a *second*). Here the words of
:data:`UNITS` mean what they say and anything else is refused with the string named.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

PERIODS = MappingProxyType({"s": 1, "m": 60, "h": 3600, "d": 86400})
#: Every unit a rate may be written with, lower case only: the letters of :data:`PERIODS`
#: and the words django-ratelimit users write (it reads only their first letter).
UNITS = MappingProxyType(
    {
        word: PERIODS[word[0]]
        for word in (
            *("s", "sec", "second", "seconds"),
            *("m", "min", "minute", "minutes"),
            *("h", "hour", "hours"),
            *("d", "day", "days"),
        )
    }
)
#: The longest window we accept: memcached reads TTLs over 30 days as timestamps, and a
#: limit over a year is a quota, not a rate.
MAX_SECONDS = 366 * 86400
MAX_COUNT = 10**9

_RATE_RE = re.compile(r"(?P<count>\d+)/(?P<multi>\d*)(?P<unit>[a-z]*)", re.ASCII)


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` events in any window of ``seconds`` seconds."""

    count: int
    seconds: int
    #: The rate as text (``"5/m"``), made once: every check's usage shows it.
    text: str = field(init=False, repr=False, compare=False)
    #: Its hash, made once: the memos of every check hash its rates.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", _text(self.count, self.seconds))
        object.__setattr__(self, "_hash", hash((self.count, self.seconds)))

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        return self.text


#: What a limit's rate may be: text, ``(count, seconds)``, a rate, or what returns one.
RateSpec = str | tuple[int, int] | Rate | Callable[..., Any] | None


@dataclass(frozen=True, slots=True)
class Slots(Rate):
    """At most ``count`` requests of a subject at once (in flight), each holding its place
    for at most ``seconds`` (its lease): counted as a rate whose hits are taken back when
    the response is done, so a place a worker that died never gave back leaves the window
    on its own. Its text (``"5 in flight"``) keeps its counters apart from any rate's."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", f"{self.count} in flight")
        object.__setattr__(self, "_hash", hash((self.count, self.seconds, "in flight")))


#: The longest lease of an in-flight place: an hour.
MAX_LEASE = 3600
_DURATION_RE = re.compile(r"(?P<multi>\d{1,9})(?P<unit>[a-z]*)", re.ASCII)


def duration(value: object, what: str, longest: int = MAX_SECONDS) -> int:
    """Seconds of a duration as people write one (``"5s"``, ``"2m"``, ``"1h"``, ``"1d"``,
    or whole seconds); ``ImproperlyConfigured`` naming ``what`` when it is not one from 1
    second to ``longest``."""
    seconds = None
    if type(value) is int:
        seconds = value
    elif isinstance(value, str):
        match = _DURATION_RE.fullmatch(value.strip(" "))
        if match is not None and match["unit"] in ("", *UNITS):
            seconds = int(match["multi"]) * UNITS[match["unit"] or "s"]
    if seconds is None or not 0 < seconds <= longest:
        span = _text(1, longest).partition("/")[2]
        span = span if span[0].isdigit() else "1" + span
        raise ImproperlyConfigured(
            f"{what} {value!r}: expected a duration from 1s to {span}, such as '5s', '2m' or "
            "'1h', or a whole number of seconds."
        )
    return seconds


def _text(count: int, seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            multi = seconds // size
            return f"{count}/{'' if multi == 1 else multi}{unit}"
    return f"{count}/{'' if seconds == 1 else seconds}s"


def _validated(count: int, seconds: int, text: object) -> Rate:
    if not 0 <= count <= MAX_COUNT:
        raise ImproperlyConfigured(f"Rate {text!r}: the count must be between 0 and {MAX_COUNT}.")
    if not 0 < seconds <= MAX_SECONDS:
        raise ImproperlyConfigured(
            f"Rate {text!r}: the period must be between 1 second and {MAX_SECONDS // 86400} days."
        )
    return Rate(count, seconds)


def parse(spec: str) -> tuple[Rate, ...]:
    """Parse ``'5/m'`` or ``'5/m;10/d'`` into rates; raise ``ImproperlyConfigured`` if bad."""
    if not isinstance(spec, str):
        raise ImproperlyConfigured(f"Rate {spec!r} is not a string.")
    parts = spec.split(";")
    rates = []
    for part in parts:
        text = part.strip(" ")
        match = _RATE_RE.fullmatch(text)
        if (
            match is None
            or not (match["multi"] or match["unit"])
            or (match["unit"] and match["unit"] not in UNITS)
        ):
            raise ImproperlyConfigured(
                f"Invalid rate {spec!r}: expected 'count/period' such as '5/m', '100/10s' or "
                f"'5/m;100/d' (units s, sec, second(s); m, min, minute(s); h, hour(s); d, "
                f"day(s); lower case, no spaces around '/')."
            )
        if len(match["count"]) > 10 or len(match["multi"]) > 9:  # int() of 5000 digits raises
            bad = "count" if len(match["count"]) > 10 else "period"
            raise ImproperlyConfigured(
                f"Rate {spec!r}: the {bad} must be between "
                + (
                    f"0 and {MAX_COUNT}."
                    if bad == "count"
                    else f"1 second and {MAX_SECONDS // 86400} days."
                )
            )
        multi = int(match["multi"]) if match["multi"] else 1
        seconds = UNITS[match["unit"] or "s"] * multi
        rates.append(_validated(int(match["count"]), seconds, spec))
    return tuple(sorted(set(rates), key=lambda r: (r.seconds, r.count)))


def normalize(value: object) -> tuple[Rate, ...]:
    """Rates from a resolved value: a rate string or a ``(count, seconds)`` tuple."""
    if isinstance(value, Rate):
        return (value,)
    if isinstance(value, tuple):
        if len(value) == 2 and all(type(v) is int for v in value):
            return (_validated(value[0], value[1], value),)
        if value and all(isinstance(v, Rate) for v in value):  # rates made already
            return value
        raise ImproperlyConfigured(
            f"Rate {value!r:.200}: a tuple must be (count, seconds) integers, or rates."
        )
    if isinstance(value, str):
        return parse(value)
    raise ImproperlyConfigured(f"Rate {value!r} is neither a string nor a (count, seconds) tuple.")


def is_dotted_path(spec: object) -> bool:
    """A rate string that names a function (``'myapp.rates.for_user'``), not a rate."""
    return isinstance(spec, str) and "/" not in spec and "." in spec


def resolve(
    spec: RateSpec,
    group: str,
    request: Any,
    normalize: Callable[[object], tuple[Rate, ...]] = normalize,
) -> tuple[Rate, ...] | None:
    """The rates in force for this request, or ``None`` when there is no limit.

    A callable or dotted path is called as ``fn(group, request)`` (django-ratelimit's contract)
    and may return a rate, a tuple, or ``None`` for "no limit"; ``normalize`` makes rates of
    what it returns (a caller that keeps them passes its own).
    """
    if spec is None:
        return None
    if callable(spec):
        value = spec(group, request)
    elif is_dotted_path(spec):
        value = import_string(spec)(group, request)  # type: ignore[arg-type]
    else:
        value = spec
    if value is None:
        return None
    return normalize(value)
