"""Signals sent by ratelimit_app.

``backend_failed(sender=BackendError, alias, error)``: a counter backend failed; the check
then failed open or closed as configured.

``ratelimited(sender, group, subject, usage, request)``: a request was over its limit;
``sender`` is None for ``@ratelimit`` / ``get_usage``, ``RatelimitMiddleware`` for rules,
which also send ``rule`` (its name), and the throttle's class for the Django REST framework
throttles of :mod:`ratelimit_app.throttling`, which send ``rule="drf:<scope>"``. ``subject``
is the hashed namespace, never the raw IP or email. A dry run's refusal is sent with
``shadow=True``.

``subject_banned(sender, limit, key, kind, until, seconds, site, request)``: a limit with a
``ban`` banned a subject (once per ban, not per banned request); ``key`` is the hashed
subject, ``until`` an aware datetime, ``seconds`` the ban's length (it doubles for a subject
banned again), ``site`` whether it applies on every path.

``ban_skipped(sender, limit, kind)``: a refusal that would have banned its subject made no
ban, because the process holds the most bans it keeps
(:data:`ratelimit_app.bans.applied.MOST`); the limit goes on refusing the subject at its rate.
The exporters count it.

``fallback_changed(sender=BackendError, alias, in_memory, error)``: a process started
counting the limits with a ``fallback`` in its own memory, because the counters of
``alias`` could not be reached (``in_memory=True``, ``error`` the failure), or stopped,
because they answered again (``in_memory=False``, ``error`` None). Sent once per change and
process, never per request (:mod:`ratelimit_app.engine.fallback`).
"""

from __future__ import annotations

import weakref
from typing import Any

from django.dispatch import Signal

#: The most senders whose receivers :class:`RefusalSignal` keeps (it starts over when full).
SENDERS_KEPT = 64


class RefusalSignal(Signal):
    """A :class:`~django.dispatch.Signal` sent on every refusal, a flood's too: the
    receivers of each sender are found once, not on every send (Django's ``use_caching``,
    kept in a plain dict: ``@ratelimit``'s sender is None, which a weak key cannot be, and
    the others are classes). Connecting or disconnecting a receiver starts the cache over,
    as Django's does.

    A sender whose receivers are all plain functions (no coroutine) is sent to straight
    from what was found: Django's ``send`` sorts them into sync and async ones and resolves
    their weak references into two new lists on every send. The first send of a sender, one
    with an async receiver, and any send after a receiver was collected are Django's own."""

    def __init__(self) -> None:
        super().__init__(use_caching=True)
        self.sender_receivers_cache = _Senders()

    def send(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        found = self.sender_receivers_cache.get(sender)
        if type(found) is not _Sync or self._dead_receivers:  # type: ignore[attr-defined]
            return super().send(sender, **named)
        responses = []
        # Each as Django keeps it: (receiver or its weak reference, ..., is async). A
        # sender held weakly in between (Django 6) is the one sending: alive.
        for entry in found:
            receiver = entry[0]
            if isinstance(receiver, weakref.ReferenceType):
                receiver = receiver()
                if receiver is None:  # (collected meanwhile: Django skips it too)
                    continue
            responses.append((receiver, receiver(signal=self, sender=sender, **named)))
        return responses


class _Sync(list[tuple[Any, ...]]):
    """A sender's receivers as Django finds them (each a tuple of the receiver or its weak
    reference first and whether it is async last), none of them async."""


class _Senders(dict[object, object]):
    """The receivers found per sender: at most :data:`SENDERS_KEPT` senders."""

    def __setitem__(self, sender: object, receivers: object) -> None:
        if len(self) >= SENDERS_KEPT:
            self.clear()
        if type(receivers) is list and not any(entry[-1] for entry in receivers):
            receivers = _Sync(receivers)
        super().__setitem__(sender, receivers)


backend_failed = Signal()
ratelimited = RefusalSignal()
subject_banned = Signal()
ban_skipped = Signal()
fallback_changed = Signal()
