"""The configuration in force: settings and database rules and lists, in every process.

``RATELIMIT_RULES`` / ``RATELIMIT_ALLOW`` / ``RATELIMIT_DENY`` and the admin's
:class:`~ratelimit_app.models.Rule` and :class:`~ratelimit_app.models.AccessEntry` rows apply
together, with the :class:`~ratelimit_app.models.Override` rows (compiled into the
snapshot's ``overrides``). Each process keeps a :class:`Snapshot` of them and, at most once every
:data:`CONFIG_REFRESH` seconds (1 s), reads one **version counter** from the counter
backend; it queries the database only when that version changed (a save or delete in the
admin increments it: :func:`bump`) or when an entry it holds has expired. So a change takes
effect in every process within about a second, and a request never costs a database query.

Requests handled on an event loop never wait for the database: when a reload is due there,
it runs in a thread and the request uses the snapshot it has (at start, the settings alone).
A database that cannot be read (tables not migrated, a test without database access) is
logged once, and the settings apply alone until it can be.

The snapshot in force is the runtime's (``RUNTIME.snapshot``); its ``overriding`` says
whether it holds overrides: the one attribute :func:`ratelimit_app.engine.enforce.decide`
tests before it looks at them. The middleware
refreshes the snapshot on every request; once it holds overrides, ``decide`` does too.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import heapq
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ratelimit_app import clock
from ratelimit_app.bans.applied import prune
from ratelimit_app.bans.held import MOST_BANS, HeldBans
from ratelimit_app.config import declared
from ratelimit_app.config.access import AccessList, merge
from ratelimit_app.config.rules import CompiledRule, RuleError, RuleSet, parse_rule
from ratelimit_app.config.versions import (
    BANS,
    BANS_DELETED,
    CONFIG,
    COUNTS,
    OVERRIDES,
    Versions,
    read_version,
    seed_counts,
)
from ratelimit_app.identity.addresses import mask_ip
from ratelimit_app.overrides.table import OverrideError, Subject, Table
from ratelimit_app.overrides.table import parse as parse_override
from ratelimit_app.runtime import RUNTIME

logger = logging.getLogger("ratelimit_app")

#: Seconds a process uses its snapshot before it looks at the version counters again: how
#: long an admin change takes to reach every process.
CONFIG_REFRESH = 1.0
#: Seconds of changes read again each time (a ban or an override written by a transaction
#: that committed after a later one: its ``changed`` is older than the newest row read).
CHANGES_MARGIN = 1.0
#: Seconds between two full reads of the configuration while the version counters cannot
#: be read (the counter backend is down): the changes of bans and overrides are read each
#: second meanwhile.
BLIND_RELOAD = 30.0


@dataclass(slots=True)
class Snapshot:
    """The rules and lists in force, and when to look again."""

    rules: RuleSet
    allow: AccessList
    deny: AccessList
    #: The version counters' values this snapshot was loaded at (None: unknown).
    version: Versions | None = None
    #: time.monotonic() of the last look at the version counter.
    checked: float = -math.inf
    #: Unix time at which the first allow or deny entry it holds expires (a full read).
    expires: float = math.inf
    #: Rules of the database, as loaded (for the admin).
    db_rules: tuple[CompiledRule, ...] = ()
    #: The bans in force (:mod:`ratelimit_app.bans.applied`), kept across full reads.
    bans: HeldBans = field(default_factory=HeldBans)
    #: Whether the lists hold networks or users (the client's own address and user are
    #: matched), whether a ban on every path is held (the middleware then looks at every
    #: request), and whether a request is screened before its rules: either (all set when
    #: the snapshot is put in force or brought up to date).
    lists: bool = False
    site_bans: bool = False
    screens: bool = False
    #: Whether it holds overrides, and bans (set when put in force).
    overriding: bool = False
    banning: bool = False
    #: time.monotonic() until which the snapshot is used without a look (see :meth:`looked`).
    deadline: float = -math.inf
    #: The overrides of the database, compiled (:mod:`ratelimit_app.overrides.table`).
    overrides: Table = field(default_factory=Table)
    #: What the table holds of each override row: pk -> (limit, subject, Unix end or None,
    #: the row's ``changed``).
    override_rows: dict[Any, tuple[str, Subject, float | None, Any]] = field(default_factory=dict)
    #: (Unix end, pk) of the overrides that expire, soonest first (a heap).
    override_ends: list[tuple[float, Any]] = field(default_factory=list)
    #: The newest ``changed`` of the overrides read (the next read starts there).
    overrides_seen: Any = None
    #: time.monotonic() of the last full read.
    loaded: float = -math.inf

    def looked(self, at: float | None = None) -> Snapshot:
        """Mark a look at the version counter: good for :data:`CONFIG_REFRESH` seconds, or
        until the first entry or override expires."""
        self.checked = time.monotonic() if at is None else at
        until_expiry = min(self.expires, self._next_override_end()) - time.time()
        self.deadline = self.checked + min(CONFIG_REFRESH, until_expiry)
        return self

    def fresh(self) -> bool:
        return time.monotonic() < self.deadline

    def _next_override_end(self) -> float:
        return self.override_ends[0][0] if self.override_ends else math.inf

    def overrides_due(self, now: float) -> bool:
        """Whether an override it holds has expired."""
        return self._next_override_end() <= now


_loading = threading.Lock()
#: Held while a thread changes the snapshot in force in place (its bans, its overrides'
#: table): one at a time; look-ups in other threads go on meanwhile.
_changing = threading.Lock()
_warned = False


def _publish(snap: Snapshot | None) -> None:
    """Put ``snap`` in force (None: none, load on the next request)."""
    RUNTIME.snapshot = snap
    if snap is not None:
        snap.overriding = bool(snap.overrides)
        snap.banning = bool(snap.bans)
        allow, deny = snap.allow, snap.deny
        snap.lists = bool(allow.networks or allow.users or deny.networks or deny.users)
        snap.site_bans = bool(snap.bans.site)
        snap.screens = snap.lists or snap.site_bans


def current() -> Snapshot:
    """The snapshot in force (reloaded when due; see the module docstring)."""
    snap = RUNTIME.snapshot
    if snap is not None and snap.fresh():
        return snap
    return _refresh(snap)


def forget() -> None:
    """Drop the snapshot (settings changed): the next request loads afresh."""
    _publish(None)


def settings_only() -> Snapshot:
    return Snapshot(
        RuleSet(declared.rules()),
        declared.access_list("RATELIMIT_ALLOW"),
        declared.access_list("RATELIMIT_DENY"),
    )


def _refresh(snap: Snapshot | None) -> Snapshot:
    version = _vouch(snap, read_version())
    if snap is None or not _reads_changes(snap, version):
        work = partial(_load, version, snap)
    elif version is not None and version == snap.version and not snap.overrides_due(time.time()):
        return snap.looked()
    else:
        work = partial(_sync, snap, version)
    if _in_event_loop():
        _in_background(work)
        if snap is None:
            snap = settings_only()
            _publish(snap)
        return snap.looked()
    return work()


def _vouch(snap: Snapshot | None, version: Versions | None) -> Versions | None:
    """Tell the refusal memory what the version counters say since ``snap`` read them: no
    count lowered and no rule changed (its settled refusals are vouched for, now), or one
    was (every refusal forgotten). Returns ``version``, with :data:`COUNTS` set first when
    it reads 0 (never set, or the counters were flushed or lost: seeded, the next loss
    shows)."""
    if version is None:
        return None
    if not version[COUNTS]:
        try:
            version = seed_counts()
        except Exception as exc:  # the next look tries again; nothing is vouched for meanwhile
            logger.debug("ratelimit: could not set the counts' version: %s", exc)
            return version
    memory = RUNTIME.refusals
    old = None if snap is None else snap.version
    if memory is None or old is None:  # (nothing to compare with: the next look vouches)
        return version
    if old[COUNTS] != version[COUNTS] or old[CONFIG] != version[CONFIG]:
        memory.clear()
    memory.vouch(clock.now())
    return version


def _reads_changes(snap: Snapshot, version: Versions | None) -> bool:
    """Whether ``snap`` can be brought up to ``version`` by reading what changed (bans and
    overrides), rather than everything: the rules and lists are the same and none of its
    entries expired (blind, without a version: for :data:`BLIND_RELOAD` seconds)."""
    if snap.version is None or time.time() >= snap.expires:
        return False
    if version is None:
        return time.monotonic() < snap.loaded + BLIND_RELOAD
    return version[CONFIG] == snap.version[CONFIG]


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _in_background(work: Callable[[], Snapshot]) -> None:
    """Run ``work`` (a read of the database) in a thread, unless one is under way."""
    if not _loading.acquire(blocking=False):
        return  # a load is under way

    def run() -> None:
        from django.db import connections

        try:
            work()
        except Exception:
            logger.exception("ratelimit: could not load the configuration")
        finally:
            connections.close_all()  # this thread's connections only
            _loading.release()

    threading.Thread(target=run, name="ratelimit-config", daemon=True).start()


def _sync(snap: Snapshot, version: Versions | None) -> Snapshot:
    """Bring ``snap`` up to ``version`` by reading the bans and overrides changed since it
    last read them (each a query on an index, only when its counter moved; both when the
    counters cannot be read). Costs what changed, not what is in force."""
    if not _changing.acquire(blocking=False):
        return snap  # another thread is bringing it up to date
    try:
        return _synced(snap, version)
    finally:
        _changing.release()


def _synced(snap: Snapshot, version: Versions | None) -> Snapshot:
    checked = time.monotonic()
    old = snap.version
    try:
        if _deleted(version, old):
            snap.bans = _all_bans()
        elif _moved(version, old, BANS):
            _read_bans(snap.bans)
        if _moved(version, old, OVERRIDES):
            _read_overrides(snap)
        if snap.overrides_due(time.time()):
            _expire_overrides(snap)
    except Exception as exc:  # the database went away: the snapshot stays as it is
        logger.warning("ratelimit: could not read the changed bans and overrides: %s", exc)
        return snap.looked(checked)
    if version is not None:
        snap.version = version
    _prune()
    _publish(snap.looked(checked))
    return snap


def _moved(version: Versions | None, old: Versions | None, which: int) -> bool:
    """Whether counter ``which`` moved from ``old`` to ``version`` (or either is unknown)."""
    return version is None or old is None or version[which] != old[which]


def _deleted(version: Versions | None, old: Versions | None) -> bool:
    """Whether a ban in force was deleted between ``old`` and ``version`` (both known)."""
    return version is not None and old is not None and version[BANS_DELETED] != old[BANS_DELETED]


def _all_bans() -> HeldBans:
    """Every ban in force, read afresh."""
    held = HeldBans()
    _read_bans(held, everything=True)
    return held


def _read_bans(held: HeldBans, everything: bool = False) -> None:
    """Take the bans changed since ``held`` last read into it (``everything``: those in
    force); at :data:`~ratelimit_app.bans.applied.MOST`, the ended ones are dropped first."""
    from django.utils import timezone

    from ratelimit_app.models import Ban

    now = clock.now()  # (a ban's end is on the limiter's clock: frozen in tests)
    started = timezone.now()
    everything = everything or held.seen is None
    if everything:
        rows: Iterable[Any] = (
            Ban.objects.order_by()  # (no ordering: an index range, not a sort)
            .filter(until__gt=dt.datetime.fromtimestamp(now, dt.UTC))
            .values_list(*BAN_FIELDS)
        )
    else:
        rows = changed_since(Ban, BAN_FIELDS, held.seen - dt.timedelta(seconds=CHANGES_MARGIN))
    held.put(rows, now)
    if everything and (held.seen is None or held.seen < started):
        held.seen = started  # (rows changed long ago: the next read starts now, not then)
    if len(held) >= MOST_BANS:
        held.prune(now)


#: What is read of a ban row (:meth:`HeldBans.put <ratelimit_app.bans.held.HeldBans.put>`).
BAN_FIELDS = ("key", "until", "site", "changed", "sealed")


def changed_since(model: Any, fields: tuple[str, ...], since: dt.datetime) -> list[Any]:
    """``model.objects.filter(changed__gte=since).values_list(*fields)``, as a list of rows,
    without building the query each time: its SQL and its values' converters are made by
    Django's compiler once per model, fields and database (kept with what the runtime
    compiles), and each look runs that SQL with the one parameter, prepared by the field as
    the ORM prepares it, and converts the rows as the ORM does. A process looks every
    second while bans keep coming: building the query cost more than running it."""
    from django.db import connections, router

    alias = router.db_for_read(model)
    connection = connections[alias]
    key = ("changed-since", model._meta.label, fields, alias, connection.vendor)
    sql, converters = RUNTIME.compile(key, _changed_query, model, fields, alias)
    param = model._meta.get_field("changed").get_db_prep_value(since, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [param])
        rows = cursor.fetchall()
    if not converters:
        return rows
    converted = []
    for row in rows:
        values = list(row)
        for pos, convs, expression in converters:
            value = values[pos]
            for convert in convs:
                value = convert(value, expression, connection)
            values[pos] = value
        converted.append(tuple(values))
    return converted


def _changed_query(
    model: Any, fields: tuple[str, ...], alias: str
) -> tuple[str, list[tuple[int, list[Any], Any]]]:
    """The SQL of :func:`changed_since` (one ``%s`` for the time) and its converters:
    (position, converters, expression) for each value Django converts after reading."""
    placeholder = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    query = (
        model.objects.using(alias)
        .order_by()
        .filter(changed__gte=placeholder)
        .values_list(*fields)
        .query
    )
    compiler = query.get_compiler(using=alias)
    sql, params = compiler.as_sql()
    if len(params) != 1:  # (Django's own query: a change there is a bug here, not a guess)
        raise RuntimeError(f"changed_since: expected one parameter, got {params!r}")
    selected = [found[0] for found in compiler.select[: compiler.col_count]]
    converters = [
        (pos, list(convs), expression)
        for pos, (convs, expression) in compiler.get_converters(selected).items()
    ]
    return sql, converters


#: What is read of an override row.
OVERRIDE_FIELDS = ("pk", "limit", "subject", "rate", "expires", "changed")
OverrideRow = tuple[Any, str, str, str, Any, Any]


def _read_overrides(snap: Snapshot) -> None:
    """Take the overrides changed since ``snap`` last read them into its table."""
    from django.utils import timezone

    from ratelimit_app.models import Override

    started = timezone.now()
    everything = snap.overrides_seen is None
    if everything:
        rows: Iterable[Any] = Override.objects.order_by().values_list(*OVERRIDE_FIELDS)
    else:
        since = snap.overrides_seen - dt.timedelta(seconds=CHANGES_MARGIN)
        rows = changed_since(Override, OVERRIDE_FIELDS, since)
    now = time.time()
    for row in rows:
        changed = row[5]
        if snap.overrides_seen is None or changed > snap.overrides_seen:
            snap.overrides_seen = changed
        _take_override(snap, row, now)
    if everything and (snap.overrides_seen is None or snap.overrides_seen < started):
        snap.overrides_seen = started  # (the next read starts now)


def _take_override(snap: Snapshot, row: OverrideRow, now: float) -> None:
    """Put one override row (:data:`OVERRIDE_FIELDS`) in ``snap``'s table, replacing what
    the row held before (an expired or invalid one only leaves; one read again unchanged,
    within :data:`CHANGES_MARGIN`, is left as it is)."""
    pk, limit, subject, rate, expires, changed = row
    held = snap.override_rows.get(pk)
    if held is not None and held[3] == changed:
        return
    if held is not None:
        del snap.override_rows[pk]
        snap.overrides.drop(held[0], held[1])
    end = None if expires is None else expires.timestamp()
    if end is not None and end <= now:
        return
    try:
        found = parse_override(limit, subject, rate)
    except OverrideError as exc:  # saved before a validation changed
        logger.error("ratelimit: override %s: %s (left out)", pk, exc)
        return
    snap.overrides.put(found, mask_ip)
    snap.override_rows[pk] = (found.limit, found.subject, end, changed)
    if end is not None:
        heapq.heappush(snap.override_ends, (end, pk))


def _expire_overrides(snap: Snapshot) -> None:
    """Take the overrides that have expired out of ``snap``'s table."""
    now = time.time()
    ends = snap.override_ends
    while ends and ends[0][0] <= now:
        end, pk = heapq.heappop(ends)
        held = snap.override_rows.get(pk)
        if held is not None and held[2] == end:
            del snap.override_rows[pk]
            snap.overrides.drop(held[0], held[1])


def _prune() -> None:
    """Delete the ban rows whose memory has passed, at most once a minute per process."""
    try:
        prune()
    except Exception as exc:  # a read-only replica, a locked database: next time
        logger.debug("ratelimit: could not delete old ban rows: %s", exc)


def _load(version: Versions | None, previous: Snapshot | None = None) -> Snapshot:
    """Settings and database, merged; the database's problems never stop the settings.
    The bans held by ``previous`` are kept (and brought up to ``version``)."""
    global _warned
    from django.utils import timezone

    from ratelimit_app.models import AccessEntry
    from ratelimit_app.models import Rule as RuleRow

    checked = time.monotonic()
    now = timezone.now()
    try:
        rows = list(RuleRow.objects.filter(enabled=True))
        entries = _unexpired(AccessEntry.objects.all(), now)
        snap = _merged(rows, entries, version)
        _read_overrides(snap)
        _keep_bans(snap, previous, version)
    except Exception as exc:  # not migrated, no database access: the settings apply
        if not _warned:
            logger.warning("ratelimit: database rules and lists not read: %s", exc)
            _warned = True
        snap = settings_only()
        snap.version = version
        _publish(snap.looked(checked))
        return snap
    snap.loaded = checked
    _publish(snap.looked(checked))
    return snap


def _keep_bans(snap: Snapshot, previous: Snapshot | None, version: Versions | None) -> None:
    """``snap``'s bans: ``previous``'s, brought up to ``version``, or read afresh."""
    old = None if previous is None else previous.version
    if previous is None or _deleted(version, old):
        snap.bans = _all_bans()
    else:
        snap.bans = previous.bans
        if _moved(version, old, BANS):
            with _changing:
                _read_bans(snap.bans)


def _merged(rows: list[Any], entries: list[Any], version: Versions | None) -> Snapshot:
    """A snapshot of the settings' rules and lists with the database's ``rows`` (rules) and
    ``entries`` (allow and deny)."""
    from ratelimit_app.models import AccessEntry

    settings_rules = declared.rules()
    taken = {rule.name for rule in settings_rules}
    db_rules = []
    for row in rows:
        try:
            rule = parse_rule(row.as_dict(), trusted=False)
        except RuleError as exc:  # saved before a rule's validation changed
            logger.error("ratelimit: database %s (rule left out)", exc)
            continue
        if rule.name in taken:
            logger.error("ratelimit: database rule %r has a settings rule's name", rule.name)
            continue
        db_rules.append(rule)
    allow = merge(
        declared.access_list("RATELIMIT_ALLOW"),
        [e.value for e in entries if e.list == AccessEntry.ALLOW],
    )
    deny = merge(
        declared.access_list("RATELIMIT_DENY"),
        [e.value for e in entries if e.list == AccessEntry.DENY],
    )
    expiries = [e.expires.timestamp() for e in entries if e.expires is not None]
    return Snapshot(
        RuleSet((*settings_rules, *db_rules)),
        allow,
        deny,
        version,
        expires=min(expiries, default=math.inf),
        db_rules=tuple(db_rules),
    )


def _unexpired(rows: Iterable[Any], now: Any) -> list[Any]:
    """The rows (allow/deny entries) that have not expired at ``now``."""
    return [row for row in rows if row.expires is None or row.expires > now]
