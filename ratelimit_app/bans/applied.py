"""Bans as the limiter keeps them: a row written once per ban, held by every process.

A limit with a ``ban`` (:mod:`ratelimit_app.config.bans`) counts its refusals of each
subject in the refusal's own second round trip (:mod:`ratelimit_app.engine.checking`); the
refusal that brings them to ``after`` calls :func:`impose`. A ban is a row of
:class:`~ratelimit_app.models.Ban`; every process reads the rows changed since it last looked
(:mod:`ratelimit_app.store`, within a second) into its
:class:`~ratelimit_app.bans.held.HeldBans`,
so a banned request is refused from memory, with no round trip and no query, and a new ban
costs each process one small query, whatever the number of bans in force.

Keys: a limit's ban of a subject is kept under the subject's own counter namespace (the
limit's scope, hashed with the subject: :func:`ban_key`), which the request's check computes
anyway, so looking for one costs a dictionary look-up, in the loop that builds the checks'
steps (:func:`ratelimit_app.engine.checking.check_unless_banned`); a ban on
every path is kept under :func:`site_key` of the address, with the address sealed in its row
(:mod:`ratelimit_app.identity.sealing`), so every process finds it by the address itself,
with no hash per request. A process holds at most :data:`MOST` bans;
past it, no new ban is made (logged once, signalled as
:data:`~ratelimit_app.signals.ban_skipped` for the exporters) and the limit goes on refusing
the subject at its rate: no ban in force is ever dropped early to make room.

Rows keep the subject hashed; the admin's label follows ``RATELIMIT_REFUSED_SUBJECTS`` (an
address as its /24 or /64 by default, nothing when hashed), and a row is deleted once its
memory of the ban (``max`` past its end) has passed (:func:`prune`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import math
import time
from typing import Any

from django.db import transaction

from ratelimit_app import clock
from ratelimit_app.bans.held import MOST_BANS, PRUNE_EVERY
from ratelimit_app.conf import conf
from ratelimit_app.config import bans
from ratelimit_app.config.bans import BanSpec
from ratelimit_app.config.limits import Check
from ratelimit_app.config.versions import BANS, bump
from ratelimit_app.identity import addresses
from ratelimit_app.identity.namespaces import namespace
from ratelimit_app.identity.sealing import seal
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.signals import ban_skipped, subject_banned

__all__ = [
    "MOST",
    "ban_key",
    "ban_now",
    "find",
    "impose",
    "lift",
    "prune",
    "site_key",
]

logger = logging.getLogger("ratelimit_app")

#: The most bans a process holds (:data:`ratelimit_app.bans.held.MOST_BANS`). Past it no new
#: ban is made until some end; the limits go on refusing at their rates.
MOST = MOST_BANS
#: Whether this process has logged that it holds :data:`MOST` bans (once, until below).
_full_logged = False


def ban_key(scope: str, subject: tuple[str, str]) -> str:
    """The key a ban of ``subject`` (kind, value) by a limit is kept under: the subject's
    counter namespace in the limit's ``scope`` (a check's ``scope``)."""
    return namespace(scope, *subject)


def site_key(address: str) -> str:
    """The key a ban of ``address`` (as the IP keys store it) on every path is kept under:
    a BLAKE2b of it salted from ``SECRET_KEY`` like every key. (Processes find such a ban by
    its address itself, sealed in its row: no hash per request.)"""
    salt = conf.SALT.encode()[:16]
    digest = hashlib.blake2b(address.encode(), digest_size=16, salt=salt, person=b"bucketry-ban")
    return "{" + digest.hexdigest() + "}"


def impose(limit: str, check: Check, request: Any = None) -> float:
    """Ban ``check``'s subject by its limit's ban (``limit``: its name), once (a process
    that finds it banned already, by a concurrent refusal elsewhere, leaves it): send
    :data:`~ratelimit_app.signals.subject_banned` and log it. Returns the ban's seconds
    (0: none made). A database that cannot be written is logged: the refusals go on
    counting. A process that holds :data:`MOST` bans makes none."""
    spec = check.ban
    assert spec is not None
    if _full(limit, check.subject[0]):
        return 0.0
    site = spec.site and check.subject[0] == "ip"
    key = site_key(check.subject[1]) if site else ban_key(check.scope, check.subject)
    try:
        seconds, until, new = _write(limit, spec, key, check.subject, site)
    except Exception as exc:  # no database, a table not migrated: counting goes on
        logger.error("ratelimit: could not ban a subject of %r: %s", limit, exc)
        return 0.0
    if new:
        _announce(limit, key, check.subject[0], until, seconds, site, request)
    return float(seconds)


def _full(limit: str, kind: str) -> bool:
    """True when this process holds :data:`MOST` bans: logged once, signalled each time."""
    global _full_logged
    snap = RUNTIME.snapshot  # (the configuration in force, as this process last read it)
    if snap is None or len(snap.bans) < MOST:
        _full_logged = False
        return False
    if not _full_logged:
        _full_logged = True
        logger.error(
            "ratelimit: %d bans in force, the most a process holds: no new ban until some "
            "end (the limits still refuse at their rates)",
            MOST,
        )
    ban_skipped.send(sender=Check, limit=limit, kind=kind)
    return True


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
    """A new ban (every process is told by the row's ``post_save``): a log line, the
    signal."""
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
    limit: str, scope: str, subject: tuple[str, str], seconds: int, request: Any, by: str
) -> dt.datetime:
    """Ban ``subject`` from the limit named ``limit`` (its counters' ``scope``) for
    ``seconds``, at once, as a person decided it in the admin (``by``): a ban like a
    limit's, lifted the same way; it replaces one in force. Returns its end."""
    key = ban_key(scope, subject)
    until = _store(key, limit, subject, False, _now(), seconds, 0)
    _announce(limit, key, subject[0], until, seconds, False, request, by)
    return until


def _write(
    limit: str, spec: BanSpec, key: str, subject: tuple[str, str], site: bool
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
        until = _store(key, limit, subject, site, now, seconds, spec.most)
    prune()
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
        "label": label(*subject),
        "sealed": seal(subject[1]) if site else "",
        "seconds": seconds,
        "banned_at": now,
        "until": until,
        "remembered_until": until + dt.timedelta(seconds=remembered),
    }
    Ban.objects.update_or_create(key=key, defaults=fields)
    return until


def label(kind: str, value: str) -> str:
    """What a ban row keeps in clear of its subject, for the admin: an address as
    ``RATELIMIT_REFUSED_SUBJECTS`` shows it (``"full"``: as the key stores it;
    ``"masked"``, the default: its /24 or /64; ``"hashed"`` or anything else: nothing);
    nothing of any other kind (an email, a user, a header are kept hashed only). A
    ``user_or_ip`` subject (DRF's throttles file every subject so) is an address when the
    request was anonymous, and is shown as one; a user's id stays hidden."""
    how = conf.REFUSED_SUBJECTS
    if kind not in ("ip", "user_or_ip") or how not in ("full", "masked"):
        return ""
    if how == "full":
        return value if addresses.parse_address(value) is not None else ""
    return addresses.shown_network(value) or ""  # (as *Refused lately* shows it)


def lift(scope: str, subject: tuple[str, str]) -> int:
    """Lift the bans of ``subject`` by the limit of counters' ``scope`` (and its ban on
    every path, when an address): the number lifted. Its memory of earlier bans goes too
    (the next ban is a first one). The rows are kept, ended, until :func:`prune` deletes
    them, so every process reads the change like a new ban's."""
    from ratelimit_app.models import Ban

    keys = [ban_key(scope, subject)]
    if subject[0] == "ip":
        keys.append(site_key(subject[1]))
    now = _now()
    lifted = Ban.objects.filter(key__in=keys, remembered_until__gt=now).update(
        until=now, remembered_until=now, changed=dt.datetime.now(dt.UTC)
    )
    if lifted:
        bump(BANS)
    return lifted


def lift_rows(rows: Any) -> int:
    """Lift the bans of ``rows`` (a queryset of :class:`~ratelimit_app.models.Ban`, such as
    the admin's selection) and forget them: as :func:`lift`."""
    now = _now()
    lifted: int = rows.update(until=now, remembered_until=now, changed=dt.datetime.now(dt.UTC))
    if lifted:
        bump(BANS)
    return lifted


def find(scope: str, subject: tuple[str, str]) -> Any | None:
    """The ban of ``subject`` by the limit of counters' ``scope`` in force (a
    :class:`~ratelimit_app.models.Ban`), on every path or not, or None."""
    from ratelimit_app.models import Ban

    keys = [ban_key(scope, subject)]
    if subject[0] == "ip":
        keys.append(site_key(subject[1]))
    return Ban.objects.filter(key__in=keys, until__gt=_now()).first()


def _now() -> dt.datetime:
    """The limiter's clock (:mod:`ratelimit_app.clock`: frozen in tests) as an aware time."""
    return dt.datetime.fromtimestamp(clock.now(), dt.UTC)


#: Ban rows deleted per call of :func:`prune` (an index range: a millisecond or so).
PRUNE_BATCH = 1000
_pruned = -math.inf


def prune(force: bool = False) -> int:
    """Delete the ban rows whose memory has passed (``max`` after their end), and the
    oldest ended ones past :data:`~ratelimit_app.bans.held.MOST_BANS` of them (so the table
    holds at most twice that), at most :data:`PRUNE_BATCH` of each a call and, unless
    ``force``, once every :data:`~ratelimit_app.bans.held.PRUNE_EVERY` seconds per process:
    the number deleted. Called when a ban is made and as a process looks for changes
    (:mod:`ratelimit_app.store`)."""
    global _pruned
    from ratelimit_app.models import Ban

    if not force and time.monotonic() < _pruned + PRUNE_EVERY:
        return 0
    _pruned = time.monotonic()
    now = _now()
    old = Ban.objects.filter(remembered_until__lte=now).order_by("remembered_until")
    ids = list(old.values_list("pk", flat=True)[:PRUNE_BATCH])
    # Ended bans remembered past the most a process holds: the oldest are forgotten (their
    # next ban is a first one), so a botnet cannot grow the table without bound.
    ended = Ban.objects.filter(until__lte=now, remembered_until__gt=now).order_by("-until")
    ids += ended.values_list("pk", flat=True)[MOST_BANS : MOST_BANS + PRUNE_BATCH]
    if not ids:
        return 0
    deleted, _ = Ban.objects.filter(pk__in=ids).delete()
    return deleted
