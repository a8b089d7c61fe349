"""Rules: limits configured in settings (``RATELIMIT_RULES``) instead of decorators.

A rule is a dict::

    {"name": "login-email", "path": "/accounts/login/", "methods": ["POST"],
     "key": "email", "rate": "5/m;10/d", "count": "failures"}

or, a leaky bucket (a steady rate with a bounded burst, :mod:`ratelimit_app.gcra`)::

    {"name": "api", "path": "/api/", "key": "user_or_ip", "rate": "10/s",
     "algorithm": "leaky_bucket", "burst": 50}

:func:`parse_rule` validates one (a :class:`RuleError` names the rule and the field);
:class:`RuleSet` matches requests against many, precompiled so that a request no rule covers
costs a string comparison or two. Pure logic: no I/O (URL names are resolved through Django's
resolver, cached per path).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string

from ratelimit_app import gcra, keys, rates

COUNT_ALL = "all"
COUNT_FAILURES = "failures"
#: Every field a rule may have, and what it must be (for error messages).
FIELDS: dict[str, str] = {
    "name": "a unique, non-empty string without spaces",
    "path": "a URL path prefix starting with '/', or a list of them",
    "url_name": "a URL name (e.g. 'login' or 'accounts:login'), or a list of them",
    "methods": "an HTTP method or a list of them (default: all)",
    "key": "a key as @ratelimit takes it ('ip', 'user', 'email', 'header:x-api-key', ...)",
    "rate": "a rate such as '5/m', several ('5/m;10/d'), a callable or a dotted path",
    "count": "'all' (default) or 'failures'",
    "block": "True (default) or False",
    "fail_open": "True (default) or False",
    "algorithm": "'sliding_window' (default) or 'leaky_bucket'",
    "burst": "a leaky bucket's capacity: an integer from 1 (default: the rate's count)",
}
#: Keys whose values an async request can be read for without a database query.
ASYNC_SAFE_KEYS = ("ip", "email", "device")
ASYNC_SAFE_ACCESSORS = ("email:", "header:", "get:", "post:")


class RuleError(ImproperlyConfigured):
    """A rule that cannot be used; the message names the rule and the field."""

    def __init__(self, rule: str, field: str, problem: str) -> None:
        self.rule, self.field, self.problem = rule, field, problem
        super().__init__(f"RATELIMIT_RULES rule {rule!r}, field {field!r}: {problem}")


@dataclass(frozen=True, slots=True, eq=False)
class Rule:
    """One validated rule. ``group`` keeps its counters apart from every other limit."""

    name: str
    key: keys.KeySpec
    rate: rates.RateSpec
    paths: tuple[str, ...] = ()
    url_names: frozenset[str] = frozenset()
    methods: frozenset[str] | None = None
    count: str = COUNT_ALL
    block: bool = True
    fail_open: bool = True
    #: The rates when they do not depend on the request (else None: resolved per request).
    static_rates: tuple[rates.Rate, ...] | None = None
    algorithm: str = gcra.SLIDING_WINDOW
    #: A leaky bucket's capacity (None: the rate's count).
    burst: int | None = None

    #: The group its counters are kept under (``rule:<name>``), and whether only failed
    #: requests count: derived once, read on every request.
    group: str = field(init=False, repr=False)
    failures_only: bool = field(init=False, repr=False)
    #: The scope of its counters (:func:`ratelimit_app.rates.scope`) when its rates are
    #: static (else None: made per request).
    static_scope: str | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        group = f"rule:{self.name}"
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "failures_only", self.count == COUNT_FAILURES)
        static = self.static_rates
        object.__setattr__(
            self, "static_scope", None if static is None else rates.scope(group, "", static)
        )

    @property
    def async_safe(self) -> bool:
        """True when the rule can be read on an event loop (no database, no user code)."""
        return (
            self.static_rates is not None
            and isinstance(self.key, str)
            and (self.key in ASYNC_SAFE_KEYS or self.key.startswith(ASYNC_SAFE_ACCESSORS))
        )

    def rates_for(self, request: HttpRequest | None) -> tuple[rates.Rate, ...] | None:
        """The rule's rates (a callable rate is asked with the request; None: no limit)."""
        if self.static_rates is not None:
            return self.static_rates
        return rates.resolve(self.rate, self.group, request)

    def describe(self) -> dict[str, Any]:
        """The rule as a settings dict (for the admin and ``ratelimit_usage``)."""
        out: dict[str, Any] = {"name": self.name}
        if self.paths:
            out["path"] = list(self.paths)
        if self.url_names:
            out["url_name"] = sorted(self.url_names)
        out["methods"] = sorted(self.methods) if self.methods else "ALL"
        out["key"] = keys.kind(self.key)
        out["rate"] = self.rate if isinstance(self.rate, str) else repr(self.rate)
        out.update(count=self.count, block=self.block, fail_open=self.fail_open)
        if self.algorithm != gcra.SLIDING_WINDOW:
            out["algorithm"] = self.algorithm
            out["burst"] = self.burst if self.burst is not None else "the rate's count"
        return out


def _strings(value: object, rule: str, field: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple | set | frozenset) or not items:
        raise RuleError(rule, field, f"expected {FIELDS[field]}, got {value!r}.")
    if not all(isinstance(i, str) and i for i in items):
        raise RuleError(rule, field, f"expected {FIELDS[field]}, got {value!r}.")
    return tuple(items)


def _flag(raw: Mapping[str, Any], rule: str, field: str, default: bool) -> bool:
    value = raw.get(field, default)
    if not isinstance(value, bool):
        raise RuleError(rule, field, f"expected {FIELDS[field]}, got {value!r}.")
    return value


def parse_rule(raw: object, index: int = 0) -> Rule:
    """Validate one rule dict; raise :class:`RuleError` naming the rule and the field."""
    if not isinstance(raw, Mapping):
        raise RuleError(f"#{index}", "name", f"a rule must be a dict, got {raw!r}.")
    name = raw.get("name")
    label = name if isinstance(name, str) and name else f"#{index}"
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise RuleError(label, unknown[0], f"unknown field; rules have {', '.join(FIELDS)}.")
    if not isinstance(name, str) or not name or any(c.isspace() for c in name) or len(name) > 100:
        raise RuleError(label, "name", f"expected {FIELDS['name']}, got {name!r}.")
    paths: tuple[str, ...] = ()
    url_names: frozenset[str] = frozenset()
    if "path" in raw:
        paths = _strings(raw["path"], name, "path")
        bad = [p for p in paths if not p.startswith("/")]
        if bad:
            raise RuleError(name, "path", f"a path prefix starts with '/', got {bad[0]!r}.")
    if "url_name" in raw:
        url_names = frozenset(_strings(raw["url_name"], name, "url_name"))
    if not paths and not url_names:
        raise RuleError(name, "path", "a rule needs a 'path' prefix or a 'url_name'.")
    methods = None
    if raw.get("methods") not in (None, "ALL", "all"):
        methods = frozenset(m.upper() for m in _strings(raw["methods"], name, "methods"))
    key = raw.get("key")
    if not key or not (isinstance(key, str) or callable(key)):
        raise RuleError(name, "key", f"expected {FIELDS['key']}, got {key!r}.")
    if isinstance(key, str):
        try:
            keys.compile_key(key)
        except ImproperlyConfigured as exc:
            raise RuleError(name, "key", str(exc)) from exc
    rate = raw.get("rate")
    static: tuple[rates.Rate, ...] | None = None
    if rate is None or rate == "":
        raise RuleError(name, "rate", f"expected {FIELDS['rate']}, got {rate!r}.")
    if not callable(rate) and not rates.is_dotted_path(rate):
        try:
            static = rates.normalize(rate)
        except (ImproperlyConfigured, TypeError, ValueError) as exc:
            raise RuleError(name, "rate", str(exc)) from exc
    elif isinstance(rate, str):
        try:
            import_string(rate)
        except ImportError as exc:
            raise RuleError(name, "rate", f"cannot import {rate!r}: {exc}") from exc
    count = raw.get("count", COUNT_ALL)
    if count not in (COUNT_ALL, COUNT_FAILURES):
        raise RuleError(name, "count", f"expected {FIELDS['count']}, got {count!r}.")
    algorithm, burst = _algorithm(raw, name, static)
    return Rule(
        name=name,
        key=key,
        rate=rate,
        paths=paths,
        url_names=url_names,
        methods=methods,
        count=count,
        block=_flag(raw, name, "block", True),
        fail_open=_flag(raw, name, "fail_open", True),
        static_rates=static,
        algorithm=algorithm,
        burst=burst,
    )


def _algorithm(
    raw: Mapping[str, Any], rule: str, static: tuple[rates.Rate, ...] | None
) -> tuple[str, int | None]:
    """The rule's ``algorithm`` and ``burst``, checked against its rates when they are fixed."""
    algorithm = raw.get("algorithm", gcra.SLIDING_WINDOW)
    try:
        gcra.validate_algorithm(algorithm)
    except ImproperlyConfigured:
        raise RuleError(
            rule, "algorithm", f"expected {FIELDS['algorithm']}, got {algorithm!r}."
        ) from None
    burst = raw.get("burst")
    if burst is not None and algorithm != gcra.LEAKY_BUCKET:
        raise RuleError(
            rule,
            "burst",
            "a burst is the capacity of a leaky bucket: set "
            "'algorithm': 'leaky_bucket', or remove it.",
        )
    try:
        burst = gcra.validate_burst(burst)
    except ImproperlyConfigured:
        raise RuleError(rule, "burst", f"expected {FIELDS['burst']}, got {burst!r}.") from None
    if algorithm == gcra.LEAKY_BUCKET and static is not None:
        try:
            gcra.meter(static, burst)
        except ImproperlyConfigured as exc:
            field = "rate" if len(static) != 1 else "burst"
            raise RuleError(rule, field, str(exc)) from exc
    return algorithm, burst


def parse_rules(raw: object) -> tuple[list[Rule], list[RuleError]]:
    """Every valid rule, and an error for each invalid or duplicate one."""
    if raw is None:
        return [], []
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Iterable):
        return [], [
            RuleError("RATELIMIT_RULES", "name", f"expected a list of dicts, got {raw!r}.")
        ]
    found: list[Rule] = []
    errors: list[RuleError] = []
    names: set[str] = set()
    for index, item in enumerate(raw):
        try:
            rule = parse_rule(item, index)
        except RuleError as exc:
            errors.append(exc)
            continue
        if rule.name in names:
            errors.append(RuleError(rule.name, "name", "another rule has this name."))
            continue
        names.add(rule.name)
        found.append(rule)
    return found, errors


@functools.lru_cache(maxsize=4096)
def _view_name(path: str, urlconf: str | None) -> str | None:
    # Paths repeat, resolving walks the URL patterns: remember (cleared with URL settings).
    try:
        return resolve(path, urlconf).view_name
    except Resolver404:
        return None


def clear_caches() -> None:
    """Forget resolved URL names (the URLconf changed)."""
    _view_name.cache_clear()


class RuleSet:
    """Rules precompiled for matching; immutable and shared by every request."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = tuple(rules)
        self.by_name = {r.name: r for r in self.rules}
        self._path_rules = tuple(r for r in self.rules if r.paths)
        self._prefixes = tuple(p for r in self._path_rules for p in r.paths)
        self._url_rules = tuple(r for r in self.rules if r.url_names and not r.paths)
        self._both = tuple(r for r in self.rules if r.url_names and r.paths)
        #: The prefixes of the rules that need both: a path outside them resolves nothing.
        self._both_prefixes = tuple(p for r in self._both for p in r.paths)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def match(self, request: HttpRequest) -> list[Rule]:
        """Rules that apply to ``request``, in configuration order.

        A rule applies when the path starts with one of its ``path`` prefixes or the URL
        resolves to one of its ``url_name`` names (a rule with both needs both), and the
        method is one of its ``methods``.
        """
        path = request.path_info
        if not (self._url_rules or path.startswith(self._prefixes)):
            return []  # the common case: one C-level prefix test
        method = request.method
        name: str | None = None
        if self._url_rules or (self._both and path.startswith(self._both_prefixes)):
            name = _view_name(path, getattr(request, "urlconf", None))
        return [
            r
            for r in self.rules
            if (r.methods is None or method in r.methods)
            and (not r.paths or path.startswith(r.paths))
            and (not r.url_names or name in r.url_names)
        ]


EMPTY = RuleSet(())
