"""Bans as the limiter keeps them: written once per ban, read from the configuration
snapshot.

A limit with a ``ban`` (:mod:`ratelimit_app.algorithms.bans`) counts its refusals of each
subject in the refusal's own second round trip (:mod:`ratelimit_app.engine.checking`); the
refusal that brings them to ``after`` calls :func:`impose`. A ban is a row of
:class:`~ratelimit_app.models.Ban` whose creation bumps the configuration's version, so every
process holds it in its snapshot within a second (:mod:`ratelimit_app.store`): a banned
request is refused from the snapshot, with no round trip and no query, and a subject never
banned costs nothing more. The subject is stored hashed (:func:`ban_key`), as its counters
are; only an address is kept in clear, for the admin.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from ratelimit_app import clock, store
from ratelimit_app.algorithms import bans, windows
from ratelimit_app.algorithms.bans import BanSpec
from ratelimit_app.config.limits import Check
from ratelimit_app.engine.result import Result
from ratelimit_app.identity.namespaces import namespace
from ratelimit_app.signals import subject_banned

__all__ = [
    "SITE_SCOPE",
    "ban_key",
    "ban_now",
    "banned",
    "find",
    "impose",
    "lift",
    "refused",
    "site_wait",
]

logger = logging.getLogger("ratelimit_app")

#: The scope of site-wide bans' keys (a limit's own bans: ``"ban:<limit name>"``).
SITE_SCOPE = "ban:site"


def ban_key(group: str, site: bool, subject: tuple[str, str]) -> str:
    """The hashed key a ban of ``subject`` (kind, value) by the limit of ``group`` (a rule's
    ``rule:<name>``, a decorator's group, ``drf:<scope>``) is kept under."""
    return namespace(SITE_SCOPE if site else "ban:" + group, *subject)


def refused(
    groups: Sequence[str], checks: Sequence[Check], now: float
) -> list[Result | None] | None:
    """The banned results of a request's checks (each limit that bans, by its ``groups``),
    from the snapshot; None when none of its subjects is banned."""
    held = store.current().bans
    found: list[Result | None] = []
    hit = False
    for group, c in zip(groups, checks, strict=True):
        spec = c.ban  # (a limit without one may hold a ban a person made in the admin)
        until = held.get(ban_key(group, False, c.subject))
        if until is None and spec is not None and spec.site:
            until = held.get(ban_key(group, True, c.subject))
        if until is None or until <= now:
            found.append(None)
            continue
        hit = True
        found.append(banned(c, until - now))
    return found if hit else None


def site_wait(subject: tuple[str, str], now: float) -> float | None:
    """Seconds a site-wide ban of ``subject`` (an address) lasts yet, or None."""
    until = store.current().bans.get(namespace(SITE_SCOPE, *subject))
    return None if until is None or until <= now else until - now


def banned(c: Check, wait: float) -> Result:
    """A check's refusal by its ban: every rate over, to be waited out until the ban ends."""
    usages = [windows.Usage(r, r.count, 0, True, wait, wait) for r in c.rates]
    found = Result(usages, namespace(c.scope, *c.subject))
    found.banned = True
    return found


def impose(limit: str, group: str, check: Check, request: Any = None) -> float:
    """Ban ``check``'s subject by its limit's ban (``limit``: its name, ``group``: its
    limit's group), once (a process that finds it banned already, by a concurrent refusal
    elsewhere, leaves it): send :data:`~ratelimit_app.signals.subject_banned` and log it.
    Returns the ban's seconds. A database that cannot be written is logged: the refusals go
    on counting."""
    spec = check.ban
    assert spec is not None
    key = ban_key(group, spec.site, check.subject)
    try:
        seconds, until, new = _write(limit, spec, key, check.subject)
    except Exception as exc:  # no database, a table not migrated: counting goes on
        logger.error("ratelimit: could not ban a subject of %r: %s", limit, exc)
        return 0.0
    if new:
        _announce(limit, key, check.subject[0], until, seconds, spec.site, request)
    return float(seconds)


def _announce(
    limit: str,
    key: str,
    kind: str,
    until: dt.datetime,
    seconds: int,
    site: bool,
    request: Any,
    by: str = "",
) -> None:
    """A new ban: every process told (the version bumped), a log line, the signal."""
    store.bump()
    logger.warning(
        "ratelimit: %s banned %s %s for %ds, until %s%s%s",
        limit,
        kind,
        key,
        seconds,
        until.isoformat(timespec="seconds"),
        " on every path" if site else "",
        f" (by {by})" if by else "",
    )
    subject_banned.send(
        sender=Check,
        limit=limit,
        key=key,
        kind=kind,
        until=until,
        seconds=seconds,
        site=site,
        request=getattr(request, "_request", request),
    )


def ban_now(
    limit: str, group: str, subject: tuple[str, str], seconds: int, request: Any, by: str
) -> dt.datetime:
    """Ban ``subject`` from the limit of ``group`` (named ``limit``) for ``seconds``, at
    once, as a person decided it in the admin (``by``): a ban like a limit's, lifted the
    same way; it replaces one in force. Returns its end."""
    key = ban_key(group, False, subject)
    until = _store(key, limit, subject, False, _now(), seconds, 0)
    _announce(limit, key, subject[0], until, seconds, False, request, by)
    return until


def _write(
    limit: str, spec: BanSpec, key: str, subject: tuple[str, str]
) -> tuple[int, dt.datetime, bool]:
    """Create or extend the ban row: (its seconds, its end, whether this call banned)."""
    from ratelimit_app.models import Ban

    now = _now()
    with transaction.atomic():
        row = Ban.objects.select_for_update().filter(key=key).first()
        if row is not None and row.until > now:
            return row.seconds, row.until, False
        last = since = None
        if row is not None and row.remembered_until > now:
            last, since = row.seconds, (now - row.until).total_seconds()
        seconds = bans.next_seconds(spec, last, since)
        until = _store(key, limit, subject, spec.site, now, seconds, spec.most)
    return seconds, until, True


def _store(
    key: str,
    limit: str,
    subject: tuple[str, str],
    site: bool,
    now: dt.datetime,
    seconds: int,
    remembered: int,
) -> dt.datetime:
    """Write the ban row of ``key``: ``seconds`` from ``now``, remembered ``remembered``
    seconds past its end (for doubling the next). Returns its end."""
    from ratelimit_app.models import Ban

    until = now + dt.timedelta(seconds=seconds)
    fields = {
        "limit": limit,
        "site": site,
        "kind": subject[0],
        "label": subject[1] if subject[0] == "ip" else "",
        "seconds": seconds,
        "banned_at": now,
        "until": until,
        "remembered_until": until + dt.timedelta(seconds=remembered),
    }
    Ban.objects.update_or_create(key=key, defaults=fields)
    return until


def lift(group: str, subject: tuple[str, str]) -> int:
    """Lift the bans of ``subject`` by the limit of ``group`` (and its site-wide one): the
    number lifted. Its memory of earlier bans goes too (the next ban is a first one)."""
    from ratelimit_app.models import Ban

    keys = [ban_key(group, False, subject), ban_key(group, True, subject)]
    deleted, _ = Ban.objects.filter(key__in=keys).delete()
    if deleted:
        store.bump()
    return deleted


def find(group: str, subject: tuple[str, str]) -> Any | None:
    """The ban of ``subject`` by the limit of ``group`` in force (a
    :class:`~ratelimit_app.models.Ban`), site-wide or not, or None."""
    from ratelimit_app.models import Ban

    keys = [ban_key(group, False, subject), ban_key(group, True, subject)]
    return Ban.objects.filter(key__in=keys, until__gt=_now()).first()


def _now() -> dt.datetime:
    """The limiter's clock (:mod:`ratelimit_app.clock`: frozen in tests) as an aware time."""
    return dt.datetime.fromtimestamp(clock.now(), dt.UTC)
