"""A limit: what is counted (its key), how much (its rates), for which methods, and how
(its algorithm and burst), validated once into one value.

Everything that limits builds on :class:`Limit`: rules from settings and from the database
(:mod:`ratelimit_app.config.rules`), the ``@ratelimit`` decorator, ``get_usage`` /
``is_ratelimited``, and the admin's and the commands' lookups and resets
(:func:`ratelimit_app.operators.operations.target`). What a limit derives from its parts (its
scope, whether it may be checked on an event loop) is derived here, once, so those users cannot
drift apart.

Two levels of trust:

* **code** (settings, decorators, calls): a key may be a callable or a dotted path to one,
  and a rate may be a callable or a dotted path that returns one per request;
* **data** (rules saved in the admin, ``trusted=False``): only the built-in key kinds and
  literal rates. A row of the database never names code to import or call.

Pure logic: no I/O.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.utils.module_loading import import_string

from ratelimit_app import ALL
from ratelimit_app.algorithms import calendar, rates
from ratelimit_app.config import bans, kinds
from ratelimit_app.config.kinds import Kind
from ratelimit_app.config.mistakes import LimitError, Mistake, collect, raise_all
from ratelimit_app.identity import keys
from ratelimit_app.runtime import RUNTIME

__all__ = ["Check", "Limit", "LimitError", "Mistake", "build", "collect", "raise_all"]

#: Keys whose values can be read on an event loop: no database query, no user code.
ASYNC_SAFE_KEYS = ("ip", "email", "device")
ASYNC_SAFE_ACCESSORS = ("email:", "header:", "get:", "post:")

Method = str | Sequence[str | None] | None
#: What a limit's ``cost`` may be: hits, or what returns them per request.
CostSpec = int | str | Callable[[str, Any], int]


def method_set(method: Method) -> frozenset[str] | None:
    """The methods a spec names, upper case (None: every method). Accepts what
    django-ratelimit's ``method=`` takes: ``ALL``, a method, or a list of them."""
    if method is None or method == ALL:
        return None
    names = [method] if isinstance(method, str) else method
    try:
        found = frozenset(m.upper() for m in names if m)
    except (TypeError, AttributeError):
        raise LimitError(
            "method", f"Method {method!r}: expected an HTTP method, a list of them, or ALL."
        ) from None
    return found or None


def counted_methods(methods: frozenset[str] | None) -> frozenset[str] | None:
    """The methods a limit or rule naming ``methods`` counts: HEAD wherever GET is, since
    Django answers HEAD with the GET view (a HEAD request costs the view as much). Counted
    in the same counter as GET: the scope stays that of the methods named."""
    if methods is not None and "GET" in methods and "HEAD" not in methods:
        return methods | {"HEAD"}
    return methods


class Check(NamedTuple):
    """One subject's limit to check: the ``scope`` of its counters, the ``subject`` (kind,
    value), the ``rates``, whether this request counts (``increment``) or only looks, the
    ``algorithm``, a leaky bucket's ``burst`` (None: the rate's count), the request's
    ``cost`` (the hits it counts) and the limit's ``ban`` (None: it bans nobody). Made by
    :meth:`Limit.check`."""

    scope: str
    subject: tuple[str, str]
    rates: tuple[rates.Rate, ...]
    increment: bool
    algorithm: str = kinds.DEFAULT
    burst: int | None = None
    cost: int = 1
    ban: bans.BanSpec | None = None


_tuple = tuple.__new__
#: Seconds an in-flight place is held at most (its lease) unless the limit says otherwise.
DEFAULT_LEASE = 60

#: The subjects of one request, found once per key (:meth:`Limit.check`).
Subjects = dict[Any, tuple[str, str]]


@dataclass(frozen=True, slots=True, eq=False)
class Limit:
    """One validated limit (build it with :func:`build`).

    ``group`` keeps its counters apart from every other limit; ``methods`` are the methods it
    counts (None: all; a rule matches methods itself and counts every one it covers).
    """

    group: str
    key: keys.KeySpec
    rate: rates.RateSpec
    methods: frozenset[str] | None = None
    algorithm: str = kinds.DEFAULT
    #: A leaky bucket's capacity (None: the rate's count).
    burst: int | None = None
    #: The hits a request counts: an integer, or a callable (or its dotted path) called as
    #: ``fn(group, request)`` that returns one (0: the limit does not apply to it).
    cost: CostSpec = 1
    #: At most this many requests of a subject at once (None: no such limit), each holding
    #: its place for at most ``lease`` seconds.
    concurrent: int | None = None
    lease: int = DEFAULT_LEASE
    #: Who it refuses too often it bans (:mod:`ratelimit_app.config.bans`; None: nobody).
    ban: bans.BanSpec | None = None

    #: Derived once (a limit is checked on every request it covers):
    #: the rates when they do not depend on the request (else None: resolved per request),
    static_rates: tuple[rates.Rate, ...] | None = field(init=False, repr=False)
    #: the scope of its counters for those rates (:func:`scope`),
    static_scope: str | None = field(init=False, repr=False)
    #: the name its subjects are filed under (``"ip"``, ``"email"``, a callable's name),
    kind: str = field(init=False, repr=False)
    #: its kind of limit (:class:`~ratelimit_app.config.kinds.Kind`: what its algorithm
    #: means wherever it differs),
    algorithm_kind: Kind = field(init=False, repr=False)
    #: the methods as the scope spells them (upper case, sorted, comma-joined; "" for all),
    method_text: str = field(init=False, repr=False)
    #: the methods of the requests it counts (:func:`counted_methods`: HEAD with GET),
    counts: frozenset[str] | None = field(init=False, repr=False)
    #: whether its value does not depend on the group (:func:`keys.ignores_group`: the
    #: limits of one request keyed alike share it),
    shares_value: bool = field(init=False, repr=False)
    #: What finds the key's subject in a request (:func:`ratelimit_app.identity.keys.reader`),
    #: made once; a key that is none raises when a check reads it.
    subject_of: keys.Reader = field(init=False, repr=False, compare=False)
    #: its cost when it does not depend on the request (else None: asked per request),
    static_cost: int | None = field(init=False, repr=False)
    #: the limit of its requests in flight (``concurrent``), checked beside it, else None,
    inflight: Limit | None = field(init=False, repr=False)
    #: and whether it can be checked on an event loop (no database, no user code).
    async_safe: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        static = None
        if not callable(self.rate) and not rates.is_dotted_path(self.rate):
            static = rates.normalize(self.rate)
        text = ",".join(sorted(self.methods)) if self.methods else ""
        kind = keys.kind(self.key)
        set_ = functools.partial(object.__setattr__, self)
        set_("static_rates", static)
        set_("method_text", text)
        set_("counts", counted_methods(self.methods))
        set_("static_scope", None if static is None else scope(self.group, text, static))
        set_("kind", kind)
        of = kinds.KINDS[self.algorithm]
        set_("algorithm_kind", of)
        set_("shares_value", keys.ignores_group(self.key))
        try:
            set_("subject_of", keys.reader(self.key))
        except ImproperlyConfigured:  # (raised again by each check, as before)
            set_("subject_of", functools.partial(keys.subject, self.key))
        cost = self.cost if type(self.cost) is int else None
        set_("static_cost", cost)
        inflight = None
        if self.concurrent is not None and not of.holds_places:
            slots = rates.Slots(self.concurrent, self.lease)
            inflight = Limit(self.group, self.key, slots, self.methods, kinds.IN_FLIGHT)
        set_("inflight", inflight)
        set_(
            "async_safe",
            static is not None
            and cost is not None
            and self.ban is None  # (a ban is written to the database)
            and isinstance(self.key, str)
            and (self.key in ASYNC_SAFE_KEYS or self.key.startswith(ASYNC_SAFE_ACCESSORS)),
        )

    def applies_to(self, request: HttpRequest) -> bool:
        """True when the request's method is one the limit counts (HEAD where GET is)."""
        return self.counts is None or request.method in self.counts

    def rates_for(self, request: HttpRequest | None) -> tuple[rates.Rate, ...] | None:
        """The rates in force (a callable rate is asked with the request; None: no limit).
        A rate from a callable that cannot make this limit is an ``ImproperlyConfigured``."""
        if self.static_rates is not None:
            return self.static_rates
        found = rates.resolve(self.rate, self.group, request, _rates_of)
        if found:
            self.algorithm_kind.fit(found, self.burst)
        return found

    def check(
        self,
        request: HttpRequest,
        increment: bool = True,
        subject: tuple[str, str] | None = None,
        subjects: Subjects | None = None,
    ) -> Check | None:
        """This limit's check of ``request`` (None: no rate applies to it). ``subject``: one
        found by the caller (a DRF throttle's cache key); ``subjects``: the values already
        found for this request, shared by the limits keyed alike."""
        rate_list = self.static_rates
        if rate_list is None:
            rate_list = self.rates_for(request)
            if not rate_list:
                return None
            scope = self.scope_for(rate_list)
        else:
            scope = self.static_scope or self.scope_for(rate_list)
        if subject is None:
            if subjects is None or not self.shares_value:
                subject = self.subject_of(self.group, request)
            else:
                key = self.key
                subject = subjects.get(key)
                if subject is None:
                    subject = subjects[key] = self.subject_of(self.group, request)
        cost = self.static_cost
        if cost is None:
            cost = self.cost_for(request)
            if not cost:
                return None
        # tuple.__new__: a NamedTuple's own __new__ is a Python function.
        return _tuple(
            Check,
            (scope, subject, rate_list, increment, self.algorithm, self.burst, cost, self.ban),
        )

    def cost_for(self, request: HttpRequest | None) -> int:
        """The hits ``request`` counts (a callable cost is asked with the request; 0: the
        limit does not apply to it). A callable that answers anything but an integer from 0
        is an ``ImproperlyConfigured`` naming the limit."""
        spec = self.cost
        if type(spec) is int:
            return spec
        fn: Callable[[str, Any], int] = import_string(spec) if isinstance(spec, str) else spec  # type: ignore[assignment]
        return checked_cost(fn(self.group, request), f"limit {self.group!r} ({fn!r})")

    def cost_problem(self) -> str | None:
        """What is wrong with a literal cost over the whole limit (None: nothing, or the
        rates or the cost come from code): such a request is refused always."""
        cost, found = self.static_cost, self.static_rates
        if cost is None or cost == 1 or not found:
            return None
        whole, what = self.algorithm_kind.whole(found, self.burst)
        if cost <= whole:
            return None
        return f"{self.group}: cost {cost} is over {what} ({whole}): every request is refused."

    def scope_for(self, rate_list: tuple[rates.Rate, ...]) -> str:
        """The scope of the counters for ``rate_list`` (the static scope when they are the
        limit's own)."""
        if rate_list is self.static_rates and self.static_scope is not None:
            return self.static_scope
        return scope(self.group, self.method_text, rate_list)


def scope(group: str, methods: str, rate_list: tuple[rates.Rate, ...]) -> str:
    """What a limit's counters are kept apart by, as django-ratelimit keys them: its group,
    its methods (upper case, sorted, comma-joined; empty for all) and its rates (two stacked
    decorators on one view never share a counter)."""
    return f"{group}\x00{methods}\x00{';'.join([r.text for r in rate_list])}"


def _rates_of(value: object) -> tuple[rates.Rate, ...]:
    """The rates a callable rate returned, parsed once per value (kept in the runtime)."""
    try:
        return RUNTIME.compile(("rates", value, type(value)), rates.normalize, value)
    except TypeError:  # unhashable: refused by normalize itself
        return rates.normalize(value)


def build(
    group: str,
    key: object,
    rate: object,
    method: Method = ALL,
    algorithm: object = kinds.DEFAULT,
    burst: object = None,
    *,
    trusted: bool = True,
    cost: object = 1,
    concurrent: object = None,
    lease: object = None,
    ban: object = None,
    quota: object = None,
    timezone: object = None,
) -> Limit:
    """Validate a limit; raise :class:`LimitError` naming the part that is wrong (its
    ``errors`` name every part that is wrong).

    ``quota`` (``"10000/month"``, in ``timezone`` or the site's ``TIME_ZONE``) counts in
    calendar periods beside ``rate`` (both must allow), or alone: :func:`with_quota`.

    ``trusted=False`` (a rule saved in the database) accepts only the built-in key kinds and
    literal rates: nothing is imported or called to validate it.

    ``concurrent`` (with its ``lease``, a duration: ``"30s"``, ``"2m"``; default a minute)
    adds an in-flight limit (:attr:`Limit.inflight`); with no ``rate``, the limit is that
    in-flight limit alone. ``ban`` (a dict: :func:`ratelimit_app.config.bans.parse_ban`)
    bans who it refuses too often.
    """
    if quota is not None or timezone is not None:
        rate = with_quota(rate, quota, timezone, algorithm)
    spec = None
    if ban is not None:
        try:
            spec = _validate_ban(ban, key)
        except LimitError as exc:
            raise_all([exc, *_mistakes(key, rate, algorithm, burst, trusted, cost)])
    found = _build_parts(
        group, key, rate, method, algorithm, burst, trusted, cost, concurrent, lease
    )
    return found if spec is None else dataclasses.replace(found, ban=spec)


def _build_parts(
    group: str,
    key: object,
    rate: object,
    method: Method,
    algorithm: object,
    burst: object,
    trusted: bool,
    cost: object,
    concurrent: object,
    lease: object,
) -> Limit:
    """:func:`build` but the ban."""
    try:
        methods = method_set(method)
    except LimitError as exc:
        raise_all([exc, *_mistakes(key, rate, algorithm, burst, trusted, cost)])
    if concurrent is not None or lease is not None:
        return _in_flight(
            group, key, rate, methods, algorithm, burst, trusted, cost, concurrent, lease
        )
    args = (group, key, rate, methods, algorithm, burst, trusted, cost)
    # Kept in the runtime: method_decorator decorates again on every request, and get_usage
    # is called with the same limit again and again. The numbers' types are part of the key:
    # a cost of True is no cost of 1.
    try:
        return RUNTIME.compile(("limit", *args, type(burst), type(cost)), _build, *args)
    except TypeError:  # an unhashable value (a list, a dict): not kept, then refused
        return _build(*args)


def with_quota(
    rate: object, quota: object, timezone: object = None, algorithm: object = None
) -> Any:
    """The rate spec of a limit with the calendar quota ``quota`` (text such as
    ``"10000/month"``, or a :class:`~ratelimit_app.algorithms.calendar.Quota`) beside
    ``rate`` (None: the quota alone), in ``timezone`` (default: the site's ``TIME_ZONE``):
    the rates and the quota, which both must allow. Made once per arguments (kept in the
    runtime); a mistake is a :class:`LimitError` naming ``quota`` (or ``rate``, or
    ``timezone`` given without a quota: a zone alone limits nothing)."""
    if quota is None:
        if timezone is not None:
            raise LimitError(
                "timezone", f"Time zone {timezone!r:.80} without a quota: it only places a quota."
            )
        return rate
    zone = timezone if timezone is not None else (settings.TIME_ZONE or "UTC")
    try:
        return RUNTIME.compile(
            ("with-quota", rate, quota, zone, algorithm), _with_quota, rate, quota, zone, algorithm
        )
    except TypeError:  # an unhashable rate: refused below
        return _with_quota(rate, quota, zone, algorithm)


def _with_quota(rate: object, quota: object, zone: object, algorithm: object) -> Any:
    if algorithm not in (None, kinds.DEFAULT):
        raise LimitError(
            "quota",
            f"Quota {quota!r:.80}: a quota counts in calendar periods, beside sliding windows "
            f"(the default algorithm), not with algorithm {algorithm!r:.40}.",
        )
    if not isinstance(zone, str):
        raise LimitError("quota", f"Quota time zone {zone!r:.80}: expected a zone's name.")
    try:
        found = calendar.quota(quota, zone)
    except ImproperlyConfigured as exc:
        raise LimitError("quota", str(exc)) from None
    if rate is None:
        return found
    if callable(rate) or rates.is_dotted_path(rate):
        raise LimitError(
            "quota",
            f"Quota {quota!r:.80}: beside a rate from code, give the quota in the rate the "
            "code returns (a tuple of rates), or give the rate as text.",
        )
    try:
        given = rates.normalize(rate)
    except ImproperlyConfigured as exc:
        raise LimitError("rate", str(exc)) from None
    return (*given, found)


def _build(
    group: str,
    key: Any,
    rate: Any,
    methods: frozenset[str] | None,
    algorithm: Any,
    burst: Any,
    trusted: bool,
    cost: Any,
) -> Limit:
    errors = _mistakes(key, rate, algorithm, burst, trusted, cost)
    if errors:
        raise_all(errors)
    return Limit(group, key, rate, methods, algorithm, burst, cost)


def _in_flight(
    group: str,
    key: object,
    rate: object,
    methods: frozenset[str] | None,
    algorithm: object,
    burst: object,
    trusted: bool,
    cost: object,
    concurrent: object,
    lease: object,
) -> Limit:
    """A limit with an in-flight limit (``concurrent``), or that in-flight limit alone (no
    ``rate``)."""
    errors: list[LimitError] = []
    if concurrent is None:
        errors.append(
            LimitError(
                "lease",
                f"Lease {lease!r}: a lease is how long a request in flight holds its place; "
                "set concurrent too, or remove the lease.",
            )
        )
    elif type(concurrent) is not int or not 1 <= concurrent <= rates.MAX_COUNT:
        errors.append(
            LimitError(
                "concurrent",
                f"Concurrent {concurrent!r}: the requests of one subject allowed at once, an "
                f"integer from 1 to {rates.MAX_COUNT}.",
            )
        )
    seconds = collect(errors, LimitError, _validate_lease, lease)
    if rate is not None and rate != "":
        errors += _mistakes(key, rate, algorithm, burst, trusted, cost)
    else:
        collect(errors, LimitError, _validate_key, key, trusted)
    if errors or seconds is None:
        raise_all(errors)
    assert type(concurrent) is int
    if rate is None or rate == "":
        return Limit(group, key, rates.Slots(concurrent, seconds), methods, kinds.IN_FLIGHT)  # type: ignore[arg-type]
    return Limit(group, key, rate, methods, algorithm, burst, cost, concurrent, seconds)  # type: ignore[arg-type]


def _validate_ban(ban: object, key: object) -> bans.BanSpec:
    try:
        spec = bans.parse_ban(ban)
    except ImproperlyConfigured as exc:
        raise LimitError("ban", str(exc)) from None
    if spec.site and key != "ip":
        raise LimitError(
            "ban",
            f"Ban {ban!r}: a site-wide ban bans an address on every path; it takes a limit "
            f"keyed on 'ip' (this one: {key!r}). Remove 'scope', or key the limit on 'ip'.",
        )
    return spec


def _validate_lease(lease: object) -> int:
    if lease is None:
        return DEFAULT_LEASE
    try:
        return rates.duration(lease, "Lease", rates.MAX_LEASE)
    except ImproperlyConfigured as exc:
        raise LimitError("lease", str(exc)) from None


def _mistakes(
    key: object, rate: object, algorithm: object, burst: object, trusted: bool, cost: object = 1
) -> list[LimitError]:
    """Every mistake of the parts of a limit other than its methods."""
    errors: list[LimitError] = []
    collect(errors, LimitError, _validate_cost, cost, trusted)
    collect(errors, LimitError, _validate_key, key, trusted)
    static = collect(errors, LimitError, _validate_rate, rate, trusted)
    # Without a valid algorithm, a burst is judged only on whether it can be one.
    known = collect(errors, LimitError, kinds.kind, algorithm)
    collect(errors, LimitError, _validate_burst, burst, known, static)
    return errors


def checked_cost(found: object, where: str) -> int:
    """``found``, a cost asked of code for one request; ``ImproperlyConfigured`` naming
    ``where`` when it is not an integer from 0 (0: the limit does not apply)."""
    if type(found) is not int or not 0 <= found <= rates.MAX_COUNT:
        raise ImproperlyConfigured(
            f"The cost of {where}: got {found!r}; a cost is an integer from 0 (the limit does "
            f"not apply) to {rates.MAX_COUNT}."
        )
    return found


def _validate_cost(cost: object, trusted: bool) -> None:
    """A cost: an integer from 1, or (code only) a callable or a dotted path to one."""
    if type(cost) is int:
        if not 1 <= cost <= rates.MAX_COUNT:
            raise LimitError(
                "cost",
                f"Cost {cost!r}: the hits a request counts, an integer from 1 to "
                f"{rates.MAX_COUNT} (a callable may answer 0: the limit does not apply).",
            )
        return
    if trusted and (callable(cost) or rates.is_dotted_path(cost)):
        return
    if not trusted and (callable(cost) or isinstance(cost, str)):
        raise LimitError(
            "cost",
            f"Cost {cost!r}: a rule kept in the database takes an integer cost; a cost from "
            "a function is code: put such a rule in RATELIMIT_RULES.",
        )
    raise LimitError(
        "cost",
        f"Cost {cost!r}: expected an integer from 1, a callable (group, request) -> int, or "
        "a dotted path to one.",
    )


def _validate_burst(
    burst: object, kind: Kind | None, static: tuple[rates.Rate, ...] | None
) -> None:
    """``burst`` for the ``kind`` of limit and the literal rates (either None: not known)."""
    if kind is None:
        kinds.judge_burst(burst)
    else:
        kind.validate(burst, static)


def _validate_key(key: object, trusted: bool) -> None:
    if not key:
        raise LimitError("key", "Ratelimit key must be specified.")
    if not trusted and not (isinstance(key, str) and _builtin_key(key)):
        raise _not_builtin(key)
    if isinstance(key, str):
        try:
            keys.compile_key(key)
        except ImproperlyConfigured as exc:
            raise LimitError("key", str(exc)) from None
    elif not callable(key):
        raise LimitError(
            "key",
            f"Key {key!r}: expected a key string ('ip', 'user', 'email', 'header:x-api-key', "
            "...), a callable or a dotted path.",
        )


def _not_builtin(key: object) -> LimitError:
    """A database rule's key that is no built-in kind: a typo (no dot), or code."""
    builtin = (
        f"{', '.join(sorted(keys.SIMPLE_KEYS))}, or "
        f"{', '.join(f'{a}:<name>' for a in sorted(keys.ACCESSOR_KEYS))}"
    )
    if isinstance(key, str) and "." not in key:
        return LimitError("key", f"Unknown key {key!r}: use one of {builtin}{_guess(key)}.")
    return LimitError(
        "key",
        f"Key {key!r}: a rule kept in the database takes a built-in key ({builtin}); "
        "callables and dotted paths are code: put such a rule in RATELIMIT_RULES.",
    )


def _guess(key: str) -> str:
    """`` (did you mean 'ip'?)`` for a mistyped built-in key, or nothing."""
    name = key.partition(":")[2]
    known = [*keys.SIMPLE_KEYS, *(f"{a}:{name or '<name>'}" for a in keys.ACCESSOR_KEYS)]
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _builtin_key(key: str) -> bool:
    """A key of :data:`ratelimit_app.identity.keys.SIMPLE_KEYS`, or ``accessor:name`` with a
    built-in accessor: nothing to import."""
    accessor, colon, name = key.partition(":")
    return key in keys.SIMPLE_KEYS or bool(colon and name and accessor in keys.ACCESSOR_KEYS)


def _validate_rate(rate: object, trusted: bool) -> tuple[rates.Rate, ...] | None:
    """The rates when they are literal; None when they come from a callable (trusted only)."""
    if rate is None or rate == "":
        raise LimitError("rate", "Ratelimit rate must be specified.")
    if callable(rate) or rates.is_dotted_path(rate):
        if not trusted:
            raise LimitError(
                "rate",
                f"Rate {rate!r}: a rule kept in the database takes a literal rate such as "
                "'5/m' or '5/m;100/d'; a rate from a function is code: put such a rule in "
                "RATELIMIT_RULES.",
            )
        # A dotted path is imported when first used, not here: a view module may name a
        # function of its own, which does not exist yet while the decorator runs.
        return None
    try:
        return rates.normalize(rate)
    except (ImproperlyConfigured, TypeError, ValueError) as exc:
        raise LimitError("rate", str(exc)) from None
