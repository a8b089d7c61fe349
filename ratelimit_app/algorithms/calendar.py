"""Quotas on the calendar: ``"10000/month"`` that renews at a fixed instant.

Pure logic, no I/O. A :class:`Quota` is a rate whose window is the calendar period its hit
falls in, in a time zone: a day (midnight to midnight), an ISO week (from Monday) or a month
(from the 1st). It is not a rolling span: every hit of a period counts until the period ends,
and the next period starts from nothing, so a customer blocked on the 31st is admitted on
the 1st.

A period is known by its **index** (:func:`index`), counted on the calendar of the zone: the
day's proleptic ordinal, the ordinal of the week's Monday, or ``year * 12 + month - 1``. Its
instants (:func:`bounds`) are the zone's midnights, so a change of daylight-saving time makes
a day 23 or 25 hours long and a hit is never counted in two periods nor lost between them:
which period a hit counts in depends on its local date alone. A midnight the clocks skip
starts its day when the day's clocks do; a midnight they repeat starts it the first time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from types import MappingProxyType
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app.algorithms.rates import MAX_COUNT, Rate

#: Each unit of a quota and the longest its period can be, in seconds (a day of 25 hours, a
#: week of 169, a month of 31 days and an hour): what a quota's ``seconds`` says.
UNITS = MappingProxyType({"day": 25 * 3600, "week": 169 * 3600, "month": 31 * 86400 + 3600})

_QUOTA_RE = re.compile(r"(?P<count>\d+)/(?P<unit>[a-z]+)", re.ASCII)


@dataclass(frozen=True, slots=True)
class Quota(Rate):
    """At most ``count`` events in each calendar ``unit`` of the zone ``zone`` (an IANA name:
    ``"Europe/Paris"``, ``"UTC"``). Its ``seconds`` is the longest such period (a day of 25
    hours), its text ``"10000/month (Europe/Paris)"``: a quota's counters are kept apart from
    every rate's and from the same quota in another zone."""

    unit: str = "month"
    zone: str = "UTC"

    def __post_init__(self) -> None:
        # (No zone: an override's quota, given the zone of the limit it overrides.)
        zone = f" ({self.zone})" if self.zone else ""
        object.__setattr__(self, "text", f"{self.count}/{self.unit}{zone}")
        object.__setattr__(self, "_hash", hash((self.count, self.unit, self.zone, "quota")))


def split(text: str) -> tuple[str, tuple[Quota, ...]]:
    """``text`` (``"100/m;1000000/month"``) as the text of its rates and the quotas among
    them, each without a zone (the zone of the limit they are given to): a part
    ``<count>/day``, ``/week`` or ``/month``. Raises ``ImproperlyConfigured`` for a quota
    over the largest count."""
    rest, quotas = [], []
    for part in text.split(";"):
        found = _QUOTA_RE.fullmatch(part.strip())
        if found is None or found["unit"] not in UNITS:
            rest.append(part)
            continue
        count, unit = int(found["count"]), found["unit"]
        if count > MAX_COUNT:
            raise ImproperlyConfigured(
                f"Quota {part.strip()!r:.80}: the count is over {MAX_COUNT:,}."
            )
        quotas.append(Quota(count, UNITS[unit], unit, ""))
    return ";".join(rest), tuple(quotas)


def zoned(rates: tuple[Rate, ...], zone: str | None) -> tuple[Rate, ...] | None:
    """``rates`` with each quota without a zone given ``zone`` (the overridden limit's
    quota's); with no such zone (a limit without a quota), a day's becomes a rolling day
    (``"10/day"`` as ever), and a week's or a month's cannot be: None."""
    if not any(type(r) is Quota and not r.zone for r in rates):
        return rates  # (the same tuple: what a limit's overrides share stays shared)
    out: list[Rate] = []
    for r in rates:
        if type(r) is not Quota or r.zone:
            out.append(r)
        elif zone is not None:
            out.append(Quota(r.count, r.seconds, r.unit, zone))
        elif r.unit == "day":
            out.append(Rate(r.count, 86400))
        else:
            return None
    return tuple(out)


def quota(spec: object, zone: str) -> Quota:
    """The quota ``spec`` (``"10000/month"``; units ``day``, ``week``, ``month``) in the
    zone named ``zone``. Raises ``ImproperlyConfigured`` naming what is wrong."""
    if isinstance(spec, Quota):
        return spec
    if not isinstance(spec, str):
        raise ImproperlyConfigured(f"Quota {spec!r:.80} is not a string such as '10000/month'.")
    found = _QUOTA_RE.fullmatch(spec.strip())
    if found is None or found["unit"] not in UNITS:
        raise ImproperlyConfigured(
            f"Quota {spec!r:.80} is not '<count>/day', '<count>/week' or '<count>/month'."
        )
    count = int(found["count"])
    if count > MAX_COUNT:
        raise ImproperlyConfigured(f"Quota {spec!r:.80}: the count is over {MAX_COUNT:,}.")
    zone_info(zone)  # (raises for a zone that is none)
    unit = found["unit"]
    return Quota(count, UNITS[unit], unit, zone)


def zone_info(name: str) -> ZoneInfo:
    """The zone named ``name`` (``ZoneInfo`` keeps the zones it made); ``ImproperlyConfigured``
    when there is none."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"Quota time zone {name!r:.80} is not a zone: {exc}") from None


def index(q: Quota, t: float) -> int:
    """The index of the period of ``q`` that holds the instant ``t`` (Unix seconds)."""
    moment = datetime.fromtimestamp(t, zone_info(q.zone))
    if moment.timestamp() > t:  # rounded up to the microsecond: maybe past a period's end
        moment -= timedelta(microseconds=1)
    day = moment.date()
    if q.unit == "day":
        return day.toordinal()
    if q.unit == "week":
        return day.toordinal() - day.weekday()
    return day.year * 12 + day.month - 1


def bounds(q: Quota, i: int) -> tuple[float, float]:
    """The instants (Unix seconds) where the period ``i`` of ``q`` starts and ends."""
    if q.unit == "day":
        first = date.fromordinal(i)
        after = first + timedelta(days=1)
    elif q.unit == "week":
        first = date.fromordinal(i)
        after = first + timedelta(days=7)
    else:
        first = date(i // 12, i % 12 + 1, 1)
        after = date(first.year + first.month // 12, first.month % 12 + 1, 1)
    zone = zone_info(q.zone)
    return _midnight(first, zone), _midnight(after, zone)


def _midnight(day: date, zone: ZoneInfo) -> float:
    """The instant the zone's clocks first read ``day``: its midnight, or the end of the gap
    when the clocks skip midnight (a wall time in a gap is read with the offset before it,
    which is the instant of the change)."""
    return datetime.combine(day, time(), tzinfo=zone).timestamp()


def renews(q: Quota, t: float) -> float:
    """The instant the period of ``q`` that holds ``t`` ends: when its count starts over."""
    return bounds(q, index(q, t))[1]
