"""A limit with everything that changes how it is enforced: the :class:`Policy`.

Each entry point makes its limits' policies once, with :func:`policy`: a rule when it is
compiled (settings and database alike), ``@ratelimit`` when it decorates, ``get_usage`` and
``is_ratelimited`` per call, a DRF throttle per check (DRF makes a throttle per request).
Nothing changes a policy afterwards; the engine makes each request's
:class:`~ratelimit_app.engine.enforce.Decision` from one and the request's check. What a
limit counts and how much (its key, rates, algorithm, cost, ban, in-flight places) is the
:class:`~ratelimit_app.config.limits.Limit`'s; a new option of enforcement is a field here,
not a parameter of every entry point.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app.config import kinds, limits
from ratelimit_app.config.limits import Limit
from ratelimit_app.runtime import RUNTIME

__all__ = ["MEMORY", "Policy", "fallback_option", "of_call", "policy"]


class Policy(NamedTuple):
    """A limit and how it is enforced (make one with :func:`policy`)."""

    #: What it counts, how much, by what algorithm (with its cost, ban and in-flight limit).
    limit: Limit
    #: Its label: a rule's name, ``drf:<scope>``; None for a decorator's limit (its group).
    name: str | None
    #: Its refusal refuses the request, which then counts nowhere. ``@ratelimit(block=False)``
    #: still blocks in this sense: the decorator then only marks ``request.limited``.
    blocks: bool
    #: When the counters cannot be reached: admit (True), refuse (False), or as
    #: ``RATELIMIT_FAIL_OPEN`` says at the time (None).
    fail_open: bool | None
    #: A dry run: refuses nothing, and reports what it would refuse.
    shadow: bool
    #: Counts failed requests only (its hit is provisional, taken back after the view).
    failures_only: bool
    #: Who sends its ``ratelimited`` signal (None: the entry point that decides it).
    sender: Any
    #: Its subject is the requester itself, so admitted responses show its counter (None:
    #: by the subject's kind).
    counts_requester: bool | None
    #: The policy of the limit's places in flight (``concurrent``), enforced alongside.
    places: Policy | None
    #: While the counters cannot be reached: count in this process's memory (True), never
    #: (False), or as ``RATELIMIT_FALLBACK`` says at the time (None).
    fallback: bool | None = None
    #: Its check is a sliding window's count and nothing more: the limit's own rates and
    #: cost, no ban, no places in flight, no failure-only count, no dry run (the engine then
    #: checks it on its compiled path, :mod:`ratelimit_app.engine.compiled`).
    plain: bool = False


def policy(
    limit: Limit,
    *,
    name: str | None = None,
    block: bool = True,
    fail_open: bool | None = None,
    shadow: bool = False,
    failures_only: bool = False,
    sender: Any = None,
    counts_requester: bool | None = None,
    fallback: Any = None,
) -> Policy:
    """The policy of ``limit``, and of its places in flight when it has some (their place
    is shown in the headers only when refused, and a failure-only rule's places are held by
    every request: the view runs either way)."""
    memory = fallback_option(fallback)
    places = None
    if limit.inflight is not None:
        places = Policy(
            limit.inflight, name, block, fail_open, shadow, False, sender, False, None, memory
        )
    if limit.algorithm_kind.holds_places:  # a limit of places alone: shown when refused
        counts_requester = False
    plain = (
        limit.algorithm == kinds.DEFAULT
        and limit.static_rates is not None
        and limit.static_cost is not None
        and limit.ban is None
        and places is None
        and not failures_only
        and not shadow
    )
    return Policy(
        limit,
        name,
        block,
        fail_open,
        shadow,
        failures_only,
        sender,
        counts_requester,
        places,
        memory,
        plain,
    )


#: What ``fallback`` takes: count in this process's memory while the counters are down.
MEMORY = "memory"


def fallback_option(value: Any, where: str = "fallback") -> bool | None:
    """``fallback`` as a policy holds it: ``"memory"`` is True, ``False`` (never, whatever
    ``RATELIMIT_FALLBACK`` says) is False, None (as the setting says) is None. Anything else
    is an ``ImproperlyConfigured`` that names ``where`` and the values it takes."""
    if value is None or value is False:
        return value
    if value == MEMORY and type(value) is str:
        return True
    raise ImproperlyConfigured(
        f'{where}: expected "memory" (count in this process\'s memory while the counters '
        f"are down), False (never) or None (as RATELIMIT_FALLBACK says), got {value!r}."
    )


def of_call(
    group: str,
    key: Any,
    rate: Any,
    method: Any,
    algorithm: Any,
    burst: Any,
    cost: Any,
    ban: Any,
    fail_open: bool | None,
    shadow: bool,
    fallback: Any = None,
) -> Policy:
    """The policy of a ``get_usage`` call's arguments (as :func:`limits.build
    <ratelimit_app.config.limits.build>` takes them), made once and kept in the runtime: a
    view calls it with the same arguments on every request. Arguments that cannot be kept
    (a ``ban``'s dict, a list) make it on each call."""
    args = (group, key, rate, method, algorithm, burst, cost, ban, fail_open, shadow, fallback)
    # (The numbers' types are part of the key: a cost of True is no cost of 1.)
    kept = ("policy", args, type(burst), type(cost))
    try:
        found = RUNTIME.compiled.get(kept)  # (the hit without a call: every request)
        return RUNTIME.compile(kept, _of_call, args) if found is None else found
    except TypeError:  # unhashable
        return _of_call(args)


def _of_call(args: tuple[Any, ...]) -> Policy:
    """The policy of :func:`of_call`'s arguments, made."""
    group, key, rate, method, algorithm, burst, cost, ban, fail_open, shadow, fallback = args
    limit = limits.build(group, key, rate, method, algorithm, burst, cost=cost, ban=ban)
    return policy(limit, fail_open=fail_open, shadow=shadow, fallback=fallback)
