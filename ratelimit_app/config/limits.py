"""A limit: what is counted (its key), how much (its rates), for which methods, and how
(its algorithm and burst), validated once into one value.

Everything that limits builds on :class:`Limit`: rules from settings and from the database
(:mod:`ratelimit_app.config.rules`), the ``@ratelimit`` decorator, ``get_usage`` /
``is_ratelimited``, and the admin's and the commands' lookups and resets
(:func:`ratelimit_app.operations.target`). What a limit derives from its parts (its scope, whether
it may be checked on an event loop) is derived here, once, so those users cannot drift apart.

Two levels of trust:

* **code** (settings, decorators, calls): a key may be a callable or a dotted path to one,
  and a rate may be a callable or a dotted path that returns one per request;
* **data** (rules saved in the admin, ``trusted=False``): only the built-in key kinds and
  literal rates. A row of the database never names code to import or call.

Pure logic: no I/O.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, NoReturn, Self, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from ratelimit_app import ALL, keys
from ratelimit_app.algorithms import gcra, rates

__all__ = ["Check", "Limit", "LimitError", "Mistake", "build"]

#: Keys whose values can be read on an event loop: no database query, no user code.
ASYNC_SAFE_KEYS = ("ip", "email", "device")
ASYNC_SAFE_ACCESSORS = ("email:", "header:", "get:", "post:")

Method = str | Sequence[str | None] | None


class Mistake(ImproperlyConfigured):
    """A configuration mistake, found together with the others of the same limit or rule.

    Validation goes on past the first mistake, so one run of the system checks reports every
    mistake at once; ``errors`` holds them all, this one first (the one raised)."""

    errors: tuple[Self, ...]

    def __init__(self: Self, message: str) -> None:
        super().__init__(message)
        self.errors = (self,)


M = TypeVar("M", bound=Mistake)
T = TypeVar("T")


def collect(errors: list[M], kind: type[M], check: Callable[..., T], *args: Any) -> T | None:
    """``check(*args)``, or None with its mistakes (of class ``kind``) added to ``errors``."""
    try:
        return check(*args)
    except kind as exc:
        errors.extend(exc.errors)
        return None


def raise_all(errors: Sequence[M]) -> NoReturn:
    """Raise the first of ``errors``, carrying all of them in its ``errors``."""
    first = errors[0]
    first.errors = tuple(errors)
    raise first


class LimitError(Mistake):
    """A limit that cannot be used; ``field`` names the part that is wrong (``key``,
    ``rate``, ``method``, ``algorithm`` or ``burst``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


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
    ``algorithm``, and a leaky bucket's ``burst`` (None: the rate's count). Made by
    :meth:`Limit.check`."""

    scope: str
    subject: tuple[str, str]
    rates: tuple[rates.Rate, ...]
    increment: bool
    algorithm: str = gcra.SLIDING_WINDOW
    burst: int | None = None


_tuple = tuple.__new__
#: Counted checks a limit keeps, one per recent subject (:meth:`Limit.check`).
CHECK_MEMO = 1024

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
    algorithm: str = gcra.SLIDING_WINDOW
    #: A leaky bucket's capacity (None: the rate's count).
    burst: int | None = None

    #: Derived once (a limit is checked on every request it covers):
    #: the rates when they do not depend on the request (else None: resolved per request),
    static_rates: tuple[rates.Rate, ...] | None = field(init=False, repr=False)
    #: the scope of its counters for those rates (:func:`ratelimit_app.algorithms.rates.scope`),
    static_scope: str | None = field(init=False, repr=False)
    #: the name its subjects are filed under (``"ip"``, ``"email"``, a callable's name),
    kind: str = field(init=False, repr=False)
    #: the methods as the scope spells them (upper case, sorted, comma-joined; "" for all),
    method_text: str = field(init=False, repr=False)
    #: the methods of the requests it counts (:func:`counted_methods`: HEAD with GET),
    counts: frozenset[str] | None = field(init=False, repr=False)
    #: whether its value does not depend on the group (:func:`keys.ignores_group`: the
    #: limits of one request keyed alike share it),
    shares_value: bool = field(init=False, repr=False)
    #: and whether it can be checked on an event loop (no database, no user code).
    async_safe: bool = field(init=False, repr=False)
    #: Its counted checks of recent subjects (static rates only): a client's requests
    #: share one :class:`Check`, made once. Starts over when it holds :data:`CHECK_MEMO`.
    _checks: dict[tuple[str, str], Check] = field(init=False, repr=False, compare=False)

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
        set_("static_scope", None if static is None else rates.scope(self.group, text, static))
        set_("kind", kind)
        set_("shares_value", keys.ignores_group(self.key))
        set_("_checks", {})
        set_(
            "async_safe",
            static is not None
            and isinstance(self.key, str)
            and (self.key in ASYNC_SAFE_KEYS or self.key.startswith(ASYNC_SAFE_ACCESSORS)),
        )

    @property
    def metered(self) -> bool:
        """True for a leaky bucket."""
        return self.algorithm == gcra.LEAKY_BUCKET

    def applies_to(self, request: HttpRequest) -> bool:
        """True when the request's method is one the limit counts (HEAD where GET is)."""
        return self.counts is None or request.method in self.counts

    def rates_for(self, request: HttpRequest | None) -> tuple[rates.Rate, ...] | None:
        """The rates in force (a callable rate is asked with the request; None: no limit).
        A rate from a callable that cannot make this limit is an ``ImproperlyConfigured``."""
        if self.static_rates is not None:
            return self.static_rates
        found = rates.resolve(self.rate, self.group, request)
        if found and self.metered:
            gcra.meter(found, self.burst)
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
                subject = keys.subject(self.key, self.group, request)
            else:
                key = self.key
                subject = subjects.get(key)
                if subject is None:
                    subject = subjects[key] = keys.subject(key, self.group, request)
        if not increment or rate_list is not self.static_rates:
            return _tuple(
                Check, (scope, subject, rate_list, increment, self.algorithm, self.burst)
            )
        memo = self._checks
        found = memo.get(subject)
        if found is None:
            if len(memo) >= CHECK_MEMO:
                memo.clear()
            # tuple.__new__: a NamedTuple's own __new__ is a Python function.
            found = memo[subject] = _tuple(
                Check, (scope, subject, rate_list, True, self.algorithm, self.burst)
            )
        return found

    def scope_for(self, rate_list: tuple[rates.Rate, ...]) -> str:
        """The scope of the counters for ``rate_list`` (the static scope when they are the
        limit's own)."""
        if rate_list is self.static_rates and self.static_scope is not None:
            return self.static_scope
        return rates.scope(self.group, self.method_text, rate_list)


def build(
    group: str,
    key: object,
    rate: object,
    method: Method = ALL,
    algorithm: object = gcra.SLIDING_WINDOW,
    burst: object = None,
    *,
    trusted: bool = True,
) -> Limit:
    """Validate a limit; raise :class:`LimitError` naming the part that is wrong (its
    ``errors`` name every part that is wrong).

    ``trusted=False`` (a rule saved in the database) accepts only the built-in key kinds and
    literal rates: nothing is imported or called to validate it.
    """
    try:
        methods = method_set(method)
    except LimitError as exc:
        raise_all([exc, *_mistakes(key, rate, algorithm, burst, trusted)])
    args = (group, key, rate, methods, algorithm, burst, trusted)
    try:
        return _build(*args)
    except TypeError:  # an unhashable value (a list, a dict): not memoised, then refused
        return _build.__wrapped__(*args)


@functools.lru_cache(maxsize=1024)
def _build(
    group: str,
    key: Any,
    rate: Any,
    methods: frozenset[str] | None,
    algorithm: Any,
    burst: Any,
    trusted: bool,
) -> Limit:
    # Memoised: method_decorator decorates again on every request, and get_usage is called
    # with the same limit again and again.
    errors = _mistakes(key, rate, algorithm, burst, trusted)
    if errors:
        raise_all(errors)
    return Limit(group, key, rate, methods, algorithm, burst)


def _mistakes(
    key: object, rate: object, algorithm: object, burst: object, trusted: bool
) -> list[LimitError]:
    """Every mistake of the parts of a limit other than its methods."""
    errors: list[LimitError] = []
    collect(errors, LimitError, _validate_key, key, trusted)
    static = collect(errors, LimitError, _validate_rate, rate, trusted)
    # Without a valid algorithm, a burst is judged only on whether it can be a capacity.
    known = collect(errors, LimitError, _validate_algorithm, algorithm)
    collect(errors, LimitError, _validate_burst, burst, known, static)
    return errors


def _validate_algorithm(algorithm: object) -> str:
    if not isinstance(algorithm, str) or algorithm not in gcra.ALGORITHMS:
        raise LimitError(
            "algorithm",
            f"Unknown algorithm {algorithm!r}: expected {gcra.SLIDING_WINDOW!r} (default) or "
            f"{gcra.LEAKY_BUCKET!r}.",
        )
    return algorithm


def _validate_burst(
    burst: object, algorithm: str | None, static: tuple[rates.Rate, ...] | None
) -> None:
    """``burst`` for ``algorithm`` and the literal rates (either None: not known)."""
    if burst is not None and algorithm == gcra.SLIDING_WINDOW:
        raise LimitError(
            "burst",
            f"Burst {burst!r}: a burst is the capacity of a leaky bucket: set the algorithm "
            f"to {gcra.LEAKY_BUCKET!r}, or remove the burst.",
        )
    try:
        capacity = gcra.validate_burst(burst)
    except ImproperlyConfigured as exc:
        raise LimitError("burst", str(exc)) from None
    if algorithm == gcra.LEAKY_BUCKET and static is not None:
        try:
            gcra.meter(static, capacity)
        except ImproperlyConfigured as exc:
            raise LimitError("rate" if len(static) != 1 else "burst", str(exc)) from None


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
    """A key of :data:`ratelimit_app.keys.SIMPLE_KEYS`, or ``accessor:name`` with a built-in
    accessor: nothing to import."""
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
