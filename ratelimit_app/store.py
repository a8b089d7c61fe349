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

:data:`overriding` says whether the snapshot in force holds overrides: the one attribute
:func:`ratelimit_app.engine.enforce.decide` tests before it looks at them. The middleware
refreshes the snapshot on every request; once it holds overrides, ``decide`` does too.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ratelimit_app.algorithms.windows import Plan
from ratelimit_app.backends import get_backend
from ratelimit_app.conf import affects_limiter, conf
from ratelimit_app.config import declared
from ratelimit_app.config.access import AccessList, merge
from ratelimit_app.config.overrides import OverrideError, Table, compile_table
from ratelimit_app.config.rules import CompiledRule, RuleError, RuleSet, parse_rule
from ratelimit_app.identity.addresses import mask_ip
from ratelimit_app.identity.namespaces import namespace

logger = logging.getLogger("ratelimit_app")

VERSION_KEY = "config-version"
#: Seconds a process uses its snapshot before it looks at the version counter again: how
#: long an admin change takes to reach every process.
CONFIG_REFRESH = 1.0


@dataclass(slots=True)
class Snapshot:
    """The rules and lists in force, and when to look again."""

    rules: RuleSet
    allow: AccessList
    deny: AccessList
    #: The version key's value this snapshot was loaded at (None: unknown).
    version: str | None = None
    #: time.monotonic() of the last look at the version counter.
    checked: float = -math.inf
    #: Unix time at which the first database entry it holds expires.
    expires: float = math.inf
    #: Rules of the database, as loaded (for the admin).
    db_rules: tuple[CompiledRule, ...] = ()
    #: The bans in force: hashed subject -> Unix time the ban ends
    #: (:mod:`ratelimit_app.engine.bans`).
    bans: dict[str, float] = field(default_factory=dict)
    #: Whether one of them is site-wide (the middleware then looks at every request).
    site_bans: bool = False
    #: Whether a request is screened before its rules: lists to match, site-wide bans (set
    #: when the snapshot is put in force, read on every request a rule covers).
    screens: bool = False
    #: time.monotonic() until which the snapshot is used without a look (see :meth:`looked`).
    deadline: float = -math.inf
    #: The overrides of the database, compiled (:mod:`ratelimit_app.config.overrides`).
    overrides: Table = field(default_factory=Table)

    def looked(self, at: float | None = None) -> Snapshot:
        """Mark a look at the version counter: good for :data:`CONFIG_REFRESH` seconds, or
        until the first entry expires."""
        self.checked = time.monotonic() if at is None else at
        until_expiry = self.expires - time.time()
        self.deadline = self.checked + min(CONFIG_REFRESH, until_expiry)
        return self

    def fresh(self) -> bool:
        return time.monotonic() < self.deadline


_snapshot: Snapshot | None = None
_loading = threading.Lock()
_warned = False
#: True while the snapshot in force holds overrides (see the module docstring).
overriding = False
#: True while the snapshot in force holds bans.
banning = False


def _publish(snap: Snapshot | None) -> None:
    """Put ``snap`` in force (None: none, load on the next request)."""
    global _snapshot, overriding, banning
    _snapshot = snap
    overriding = snap is not None and bool(snap.overrides)
    banning = snap is not None and bool(snap.bans)
    if snap is not None:
        allow, deny = snap.allow, snap.deny
        lists = allow.networks or allow.users or deny.networks or deny.users
        snap.screens = bool(lists or snap.site_bans)


def current() -> Snapshot:
    """The snapshot in force (reloaded when due; see the module docstring)."""
    snap = _snapshot
    if snap is not None and snap.fresh():
        return snap
    return _refresh(snap)


def forget() -> None:
    """Drop the snapshot (settings changed): the next request loads afresh."""
    _publish(None)


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if affects_limiter(setting):
        forget()


def bump() -> None:
    """A database rule or entry changed: a new version for every process, and this process
    reloads on its next request."""
    try:
        _version_op(increment=True)
    except Exception as exc:  # other processes catch up when the cache is back
        logger.warning("ratelimit: could not announce a configuration change: %s", exc)
    if _snapshot is not None:
        _snapshot.version = None
        _snapshot.deadline = -math.inf


#: The version is a counter in the counter backend (its timeouts and dead-server skipping
#: apply): one key, incremented by every change; an eviction changes it too (a reload).
VERSION_PLAN = Plan(writes=((":h0:0", 400 * 86400),), reads=(":h0:0",), rates=())


def _version_op(increment: bool) -> str:
    ns = namespace("ratelimit-config", VERSION_KEY, "")
    return str(get_backend().run(ns, VERSION_PLAN, increment)[0])


def _read_version() -> str | None:
    try:
        return _version_op(increment=False)
    except Exception as exc:
        logger.debug("ratelimit: could not read the configuration version: %s", exc)
        return None


def settings_only() -> Snapshot:
    return Snapshot(
        RuleSet(declared.rules()),
        declared.access_list("RATELIMIT_ALLOW"),
        declared.access_list("RATELIMIT_DENY"),
    )


def _refresh(snap: Snapshot | None) -> Snapshot:
    if not conf.DB_RULES:
        snap = settings_only()
        snap.deadline = math.inf  # settings changes clear it (forget)
        _publish(snap)
        return snap
    version = _read_version()
    if (
        snap is not None
        and version is not None
        and version == snap.version
        and time.time() < snap.expires
    ):
        return snap.looked()
    if _in_event_loop():
        _load_in_background(version)
        if snap is None:
            snap = settings_only()
            _publish(snap)
        return snap.looked()
    return _load(version)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _load_in_background(version: str | None) -> None:
    if not _loading.acquire(blocking=False):
        return  # a load is under way

    def run() -> None:
        from django.db import connections

        try:
            _load(version)
        except Exception:
            logger.exception("ratelimit: could not load the configuration")
        finally:
            connections.close_all()  # this thread's connections only
            _loading.release()

    threading.Thread(target=run, name="ratelimit-config", daemon=True).start()


def _load(version: str | None) -> Snapshot:
    """Settings and database, merged; the database's problems never stop the settings."""
    global _warned
    from django.utils import timezone

    from ratelimit_app.models import AccessEntry, Ban, Override
    from ratelimit_app.models import Rule as RuleRow

    checked = time.monotonic()
    now = timezone.now()
    try:
        rows = list(RuleRow.objects.filter(enabled=True))
        entries = _unexpired(AccessEntry.objects.all(), now)
        held = _unexpired(Override.objects.all(), now)
        banned = list(Ban.objects.filter(until__gt=now).values_list("key", "until", "site"))
    except Exception as exc:  # not migrated, no database access: the settings apply
        if not _warned:
            logger.warning("ratelimit: database rules and lists not read: %s", exc)
            _warned = True
        snap = settings_only()
        snap.version = version
        _publish(snap.looked(checked))
        return snap
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
    ends = [e.expires for e in entries] + [o.expires for o in held] + [b[1] for b in banned]
    expiries = [end.timestamp() for end in ends if end is not None]
    snap = Snapshot(
        RuleSet((*settings_rules, *db_rules)),
        allow,
        deny,
        version,
        expires=min(expiries, default=math.inf),
        db_rules=tuple(db_rules),
        overrides=_overrides(held),
        bans={key: until.timestamp() for key, until, _ in banned},
        site_bans=any(site for _, _, site in banned),
    )
    _publish(snap.looked(checked))
    return snap


def _unexpired(rows: Iterable[Any], now: Any) -> list[Any]:
    """The rows (allow/deny entries, overrides) that have not expired at ``now``."""
    return [row for row in rows if row.expires is None or row.expires > now]


def _overrides(rows: list[Any]) -> Table:
    """The overrides of ``rows`` (:class:`~ratelimit_app.models.Override`), compiled; an
    invalid one is logged and left out."""
    found = []
    for row in rows:
        try:
            found.append(row.parsed())
        except OverrideError as exc:  # saved before a validation changed
            logger.error("ratelimit: override %s: %s (left out)", row.pk, exc)
    return compile_table(found, mask_ip)
