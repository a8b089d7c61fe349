"""Refused requests in ``metrics_app``: counted per limit, and who they were lately.

* Each limit's refusals are the metrics series ``ratelimit:<limit>``, and those a dry run
  would refuse ``ratelimit-shadow:<limit>``; ``<limit>`` is a rule's name, ``drf:<scope>``,
  or a decorator's group. The admin charts them like any other series.
* The subjects a limit refuses feed a bounded top-k per limit (:mod:`metrics_app.topk`),
  which the admin's *Refused lately* page reads (:mod:`ratelimit_app.operators.refused`). A row
  keeps the hashed subject, and of its value what ``RATELIMIT_REFUSED_SUBJECTS`` allows
  (:func:`shown`), for :data:`RETENTION_DAYS` days after its last refusal.

Connected when ``metrics_app`` is installed: a few in-memory increments per refused request,
nothing per admitted one. A failure here never fails the request: it is logged.
"""

from __future__ import annotations

import logging
from typing import Any

from django.http import HttpRequest

from ratelimit_app import request_state, store
from ratelimit_app.conf import conf
from ratelimit_app.config import sources, views
from ratelimit_app.identity import addresses, keys
from ratelimit_app.signals import ratelimited

logger = logging.getLogger("ratelimit_app")

SERIES_PREFIX = "ratelimit:"
#: The series of what a dry run would refuse.
SHADOW_PREFIX = "ratelimit-shadow:"

#: What the *Refused lately* page may show of a subject (``RATELIMIT_REFUSED_SUBJECTS``).
FULL, MASKED, HASHED = "full", "masked", "hashed"
MODES = (FULL, MASKED, HASHED)
#: Days a refused subject's rows are kept after its last refusal.
RETENTION_DAYS = 7


def series_name(limit: str, shadow: bool = False) -> str:
    """The metrics series of a limit's refused requests (``shadow``: of those its dry run
    would refuse); ``limit`` is a rule's name, ``drf:<scope>`` or a decorator's group."""
    return (SHADOW_PREFIX if shadow else SERIES_PREFIX) + limit


def _count(
    sender: Any, group: str = "", rule: str | None = None, shadow: bool = False, **kwargs: Any
) -> None:
    import metrics_app  # (not ``from``: a package's from-import runs Python on every call)

    try:
        metrics_app.record(series_name(rule or group, shadow))
    except ValueError:  # a group too long to name a series: not charted
        logger.warning("ratelimit: limit %.80r has too long a name to be charted", rule or group)


def mode() -> str:
    """``RATELIMIT_REFUSED_SUBJECTS``, or :data:`HASHED` (the least shown) when it is none
    of :data:`MODES` (the *Refused lately* page then says so)."""
    value = conf.REFUSED_SUBJECTS
    return value if value in MODES else HASHED


def limit_key(rule: str | None, group: str, request: HttpRequest | None) -> keys.KeySpec | None:
    """The key of the limit that refused: a rule's or a DRF scope's by name, a decorator's
    from the view the request was routed to (None when it cannot be found)."""
    if rule is None:
        match = getattr(request, "resolver_match", None)
        found = views.attached(match.func) if match is not None else ()
        return next((d.limit.key for d in found if d.group == group and d.limit), None)
    if rule.startswith("drf:"):
        limit = sources.limit(rule)
        return limit.key if limit is not None else None
    compiled = store.current().rules.by_name.get(rule)
    return compiled.limit.key if compiled is not None else None


def _user_name(request: HttpRequest, value: str) -> str | None:
    """The signed-in user's name, when ``value`` is that user's id."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or str(user.pk) != value:
        return None
    return str(user.get_username())


#: The /24 (IPv4) or /64 (IPv6) network of an address as the key stores it, or None.
masked_ip = addresses.shown_network


def shown(kind: str, value: str, request: HttpRequest, how: str) -> tuple[str, str]:
    """``(label, ref)`` of a subject: what the page shows, and what its usage lookup and
    reset are given ("" when ``how`` hides it). A user is shown by name (and acted on by
    id) unless hashed; masked, an address is its /24 or /64 and an email its domain, and
    any other value is hidden."""
    if how == HASHED:
        return "", ""
    if kind in ("user", "user_or_ip"):
        name = _user_name(request, value)
        if name is not None:
            return name, value
    if how == FULL:
        return value, value
    if kind in ("ip", "user_or_ip"):
        network = masked_ip(value)
        if network is None:
            return "", ""
        # Acted on when the key stores no more of the address than is shown.
        return network, value if network.partition("/")[0] == value else ""
    if keys.is_email_kind(kind) and "@" in value:
        return "…@" + value.rpartition("@")[2], ""
    return "", ""


def _remember(
    sender: Any,
    group: str = "",
    subject: str = "",
    request: HttpRequest | None = None,
    rule: str | None = None,
    shadow: bool = False,
    **kwargs: Any,
) -> None:
    if shadow or not subject:
        return
    import metrics_app  # (as _count's)

    label = ref = ""
    how = mode()
    try:
        if how != HASHED and request is not None:
            found = _signalled(request, rule, group)
            if found is not None:
                label, ref = shown(*found, request, how)
        metrics_app.record_top(
            series_name(rule or group), subject, label, ref, keep=RETENTION_DAYS * 86400
        )
    except Exception:  # never the request's failure: the page misses one refusal
        logger.exception("ratelimit: a refusal of %.80r was not kept for the admin", rule or group)


def _signalled(request: HttpRequest, rule: str | None, group: str) -> tuple[str, str] | None:
    """``(kind, value)`` of the refused subject: as the engine left it on the request while
    it signals (:attr:`~ratelimit_app.request_state.RequestState.signalled`), else read
    again with the refusing limit's key (None: that limit cannot be found)."""
    kept = request_state.of(request)
    if kept is not None and kept.signalled is not None:
        return kept.signalled
    spec = limit_key(rule, group, request)
    return None if spec is None else keys.subject(spec, group, request)


def connect() -> None:
    ratelimited.connect(_count, dispatch_uid="ratelimit_app.operators.metrics")
    ratelimited.connect(_remember, dispatch_uid="ratelimit_app.operators.metrics.refused")
