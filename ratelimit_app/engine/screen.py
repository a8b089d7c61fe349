"""Who may pass before any rule is checked: the allow and deny lists, and bans on every path.

The middleware asks :func:`screen` first when the configuration in force holds lists or a
ban on every path (``Snapshot.screens``): a denied client's address or user gets a 403, an
allowed one skips every rule, and an address a limit banned on every path gets its 429,
all with no round trip. The lists' emails are a claim the request makes, not the client's
identity: they are matched against the rules keyed on an email, by the middleware.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from django.http import HttpRequest, HttpResponse

from ratelimit_app import clock, store
from ratelimit_app.conf import conf
from ratelimit_app.config.limits import Subjects
from ratelimit_app.config.rules import CompiledRule
from ratelimit_app.engine import responses
from ratelimit_app.identity import addresses, keys

__all__ = ["ALLOWED", "screen"]


#: :func:`_listed`'s answer for a client on the allow list: no rule applies.
ALLOWED = HttpResponse()


def _listed(
    request: HttpRequest,
    current: store.Snapshot,
    rules: Sequence[CompiledRule],
    address: str | None,
) -> HttpResponse | None:
    """The client's own ``address`` (None: the lists name no network) and user against the
    lists: the 403 of a denied one, :data:`ALLOWED` for an allowed one (when rules apply),
    or None."""
    allow, deny = current.allow, current.deny
    if deny.has_ip(address) or deny.has_user(request):
        return responses.denied(request)
    if rules and (allow.has_ip(address) or allow.has_user(request)):
        return ALLOWED
    return None


def screen(
    request: HttpRequest,
    current: store.Snapshot,
    rules: Sequence[CompiledRule],
    subjects: Subjects,
) -> HttpResponse | None:
    """The lists' answer (:func:`_listed`: the 403 of a denied client, :data:`ALLOWED` for
    an allowed one), else the 429 of an address banned on every path, else None. What the
    request is (its address, for the lists and the bans) is read first; the address found
    for the bans is kept in ``subjects`` for the rules keyed on it. A ban on every path is
    found by the address itself (unsealed from its row by :mod:`ratelimit_app.store`): a
    dictionary look-up, no hash."""
    banned = None
    if current.site_bans:  # (the address's subject is the "ip" key's: no reader made)
        subject = subjects.get("ip")
        if subject is None:
            try:
                subject = subjects["ip"] = ("ip", keys.client_ip(request))
            except Exception:  # no address: the rules say what to do
                subject = None
        if subject is not None:
            banned = current.bans.site.get(subject[1])
    if current.lists:
        allow, deny = current.allow, current.deny
        if allow.networks or allow.users or deny.networks or deny.users:
            address = None
            if allow.networks or deny.networks:
                address = addresses.client_address(request)
            listed = _listed(request, current, rules, address)
            if listed is not None:
                return listed
    return None if banned is None else _site_banned(request, banned)


def _site_banned(request: HttpRequest, until: float) -> HttpResponse | None:
    """The 429 of a client whose address a limit banned on every path until ``until``
    (None once it has ended)."""
    wait = until - clock.now()
    if wait <= 0:
        return None
    usage = {"retry_after": max(1, math.ceil(wait)), "banned": True}
    return responses.too_many_requests(request, conf.EXCEPTION_CLASS(), usage=usage)
