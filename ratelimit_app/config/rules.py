"""Rules: limits configured in settings (``RATELIMIT_RULES``) instead of decorators.

A rule is a dict::

    {"name": "login-email", "path": "/accounts/login/", "methods": ["POST"],
     "key": "email", "rate": "5/m;10/d", "count": "failures"}

or, a leaky bucket (a steady rate with a bounded burst, :mod:`ratelimit_app.algorithms.gcra`)::

    {"name": "api", "path": "/api/", "key": "user_or_ip", "rate": "10/s",
     "algorithm": "leaky_bucket", "burst": 50}

:func:`parse_rule` validates one (a :class:`RuleError` names the rule and the field);
:class:`RuleSet` matches requests against many, precompiled so that a request no rule covers
costs a string comparison or two. Pure logic: no I/O (URL names are resolved through Django's
resolver, cached per path).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string

from ratelimit_app.algorithms import rates
from ratelimit_app.algorithms.calendar import Quota
from ratelimit_app.config import kinds, limits
from ratelimit_app.config.limits import Limit, LimitError, Mistake, collect, raise_all
from ratelimit_app.config.policy import Policy, fallback_option, policy
from ratelimit_app.identity import keys
from ratelimit_app.runtime import RUNTIME

COUNT_ALL = "all"
COUNT_FAILURES = "failures"
#: Every field a rule may have, and what it must be (for error messages).
FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "name": "a unique, non-empty string without spaces",
        "path": "a URL path prefix starting with '/', or a list of them",
        "url_name": "a URL name (e.g. 'login' or 'accounts:login'), or a list of them",
        "methods": "an HTTP method or a list of them (default: all)",
        "key": "a key as @ratelimit takes it ('ip', 'user', 'email', 'header:x-api-key', ...)",
        "rate": "a rate such as '5/m', several ('5/m;10/d'), a callable or a dotted path (or "
        "none, for a rule that only limits requests in flight)",
        "count": "'all' (default) or 'failures'",
        "block": "True (default) or False",
        "fail_open": "True (default) or False",
        "algorithm": kinds.expected(),
        "burst": "a leaky bucket's capacity: an integer from 1 (default: the rate's count)",
        "cost": "the hits each request counts: an integer from 1 (default 1), a callable or a "
        "dotted path",
        "shadow": "False (default) or True: a dry run, refusing nothing",
        "concurrent": "the requests of one subject allowed at once: an integer from 1",
        "lease": "how long a request in flight holds its place at most: a duration from 1s to "
        "1h (default '1m')",
        "ban": "a dict such as {'after': 10, 'within': '10m', 'for': '1h', 'max': '1d'}: ban a "
        "subject refused that often",
        "quota": "a quota on the calendar such as '10000/month' (units day, week, month), alone "
        "or beside the rate (both must allow)",
        "timezone": "the zone of the quota's periods, such as 'Europe/Paris' (default: TIME_ZONE)",
        "fallback": "'memory' (count in each process's memory while the counters are down) or "
        "False (never; default: RATELIMIT_FALLBACK)",
    }
)


class RuleError(Mistake):
    """A rule that cannot be used; the message names the rule and the field (``errors``:
    every mistake of the rule, each naming its field)."""

    def __init__(self, rule: str, field: str, problem: str) -> None:
        # No field: the mistake is the setting itself, which the problem names.
        self.rule, self.field, self.problem = rule, field, problem
        super().__init__(
            f"RATELIMIT_RULES rule {rule!r}, field {field!r}: {problem}" if field else problem
        )


@dataclass(frozen=True, slots=True, eq=False)
class CompiledRule:
    """One validated rule: which requests it covers (paths, URL names, methods), the
    :class:`~ratelimit_app.config.limits.Limit` that counts them (group ``rule:<name>``), and what
    happens over it."""

    name: str
    limit: Limit
    paths: tuple[str, ...] = ()
    url_names: frozenset[str] = frozenset()
    methods: frozenset[str] | None = None
    count: str = COUNT_ALL
    block: bool = True
    fail_open: bool = True
    #: A dry run: it refuses nothing, and reports what it would refuse.
    shadow: bool = False
    #: While the counters are down: count in memory (True), never (False), or as
    #: ``RATELIMIT_FALLBACK`` says (None).
    fallback: bool | None = None

    #: Derived once, read on every request: whether only failed requests count,
    failures_only: bool = field(init=False, repr=False)
    #: the methods of the requests it matches (HEAD with GET:
    #: :func:`ratelimit_app.config.limits.counted_methods`),
    matches: frozenset[str] | None = field(init=False, repr=False)
    #: whether it limits requests in flight (``concurrent``): its requests hold a place,
    holds: bool = field(init=False, repr=False)
    #: how it is enforced (:mod:`ratelimit_app.config.policy`),
    policy: Policy = field(init=False, repr=False, compare=False)
    #: and whether its check is a sliding window's count and nothing more (its policy's
    #: ``plain``: the engine then checks it on its compiled path).
    plain: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "failures_only", self.count == COUNT_FAILURES)
        object.__setattr__(self, "matches", limits.counted_methods(self.methods))
        lim = self.limit
        holds = lim.inflight is not None or lim.algorithm_kind.holds_places
        object.__setattr__(self, "holds", holds)
        enforced = policy(
            lim,
            name=self.name,
            block=self.block,
            fail_open=self.fail_open,
            shadow=self.shadow,
            failures_only=self.failures_only,
            fallback="memory" if self.fallback else self.fallback,
        )
        object.__setattr__(self, "policy", enforced)
        object.__setattr__(self, "plain", enforced.plain)

    # The limit's parts, for readers of a rule (the admin, the commands).
    @property
    def group(self) -> str:
        return self.limit.group

    @property
    def key(self) -> keys.KeySpec:
        return self.limit.key

    @property
    def rate(self) -> rates.RateSpec:
        return self.limit.rate

    @property
    def algorithm(self) -> str:
        return self.limit.algorithm

    @property
    def burst(self) -> int | None:
        return self.limit.burst

    @property
    def static_rates(self) -> tuple[rates.Rate, ...] | None:
        return self.limit.static_rates

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
        quotas = [r for r in self.limit.static_rates or () if isinstance(r, Quota)]
        if quotas:  # (its rate is then its rates and the quota: each as the settings say it)
            rest = [r.text for r in self.limit.static_rates or () if not isinstance(r, Quota)]
            out["rate"] = ";".join(rest)
            out["quota"], out["timezone"] = f"{quotas[0].count}/{quotas[0].unit}", quotas[0].zone
        out.update(count=self.count, block=self.block, fail_open=self.fail_open)
        out.update(_fallback_described(self.fallback))
        out.update(self.limit.algorithm_kind.described(self.burst))
        cost = self.limit.cost
        if cost != 1:
            out["cost"] = cost if isinstance(cost, int | str) else repr(cost)
        inflight = self.limit.inflight or (
            self.limit if self.limit.algorithm_kind.holds_places else None
        )
        if inflight is not None:
            slots = inflight.static_rates[0]  # type: ignore[index]
            out["concurrent"], out["lease"] = slots.count, f"{slots.seconds}s"
            if inflight is self.limit:
                out["rate"] = ""
        if self.shadow:
            out["shadow"] = True
        if self.limit.ban is not None:
            out["ban"] = self.limit.ban.describe()
        return out


def _strings(value: object, rule: str, field: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple | set | frozenset) or not items:
        raise RuleError(rule, field, f"expected {FIELDS[field]}, got {value!r}.")
    if not all(isinstance(i, str) and i for i in items):
        raise RuleError(rule, field, f"expected {FIELDS[field]}, got {value!r}.")
    return tuple(items)


def _paths(value: object, rule: str) -> tuple[str, ...]:
    paths = _strings(value, rule, "path")
    bad = [p for p in paths if not p.startswith("/")]
    if bad:
        raise RuleError(rule, "path", f"a path prefix starts with '/', got {bad[0]!r}.")
    return paths


def _flag(raw: Mapping[str, Any], rule: str, field: str, default: bool) -> bool:
    value = raw.get(field, default)
    if not isinstance(value, bool):
        raise RuleError(rule, field, f"expected {FIELDS[field]}, got {value!r}.")
    return value


def parse_rule(raw: object, index: int = 0, *, trusted: bool = True) -> CompiledRule:
    """Validate one rule dict; raise :class:`RuleError` naming the rule and the field.

    Every field is checked, whatever the others hold: the error raised is the first mistake,
    and its ``errors`` are all of them (the system checks report each one).

    ``trusted=False`` for a rule kept in the database: only built-in keys and literal rates
    (:func:`ratelimit_app.config.limits.build`).
    """
    if not isinstance(raw, Mapping):
        raise RuleError(f"#{index}", "name", f"a rule must be a dict, got {raw!r}.")
    name = raw.get("name")
    label = name if isinstance(name, str) and name else f"#{index}"
    errors = _name_errors(raw, label)
    paths, url_names = _where(raw, label, errors)
    methods = _methods(raw, label, errors)
    count = raw.get("count", COUNT_ALL)
    if count not in (COUNT_ALL, COUNT_FAILURES):
        errors.append(RuleError(label, "count", f"expected {FIELDS['count']}, got {count!r}."))
    limit = collect(errors, RuleError, _limit, raw, label, trusted)
    block = collect(errors, RuleError, _flag, raw, label, "block", True)
    fail_open = collect(errors, RuleError, _flag, raw, label, "fail_open", True)
    shadow = collect(errors, RuleError, _flag, raw, label, "shadow", False)
    fallback = collect(errors, RuleError, _fallback, raw, label)
    if errors or limit is None or block is None or fail_open is None or shadow is None:
        raise_all(errors)
    return CompiledRule(
        name=label,
        limit=limit,
        paths=paths,
        url_names=url_names,
        methods=methods,
        count=count,
        block=block,
        fail_open=fail_open,
        shadow=shadow,
        fallback=fallback,
    )


def _fallback_described(fallback: bool | None) -> dict[str, Any]:
    """A rule's ``fallback`` as the settings write it (nothing when it has none)."""
    return {} if fallback is None else {"fallback": "memory" if fallback else False}


def _fallback(raw: Mapping[str, Any], rule: str) -> bool | None:
    """A rule's ``fallback`` as its policy holds it (:func:`~.policy.fallback_option`)."""
    value = raw.get("fallback")
    try:
        return fallback_option(value)
    except ImproperlyConfigured:
        expected = f"expected {FIELDS['fallback']}, got {value!r}."
        raise RuleError(rule, "fallback", expected) from None


def _name_errors(raw: Mapping[str, Any], rule: str) -> list[RuleError]:
    """The fields a rule cannot have, and a name that is not one."""
    errors = [
        RuleError(rule, field, f"unknown field; rules have {', '.join(FIELDS)}.")
        for field in sorted(set(raw) - set(FIELDS))
    ]
    name = raw.get("name")
    if not isinstance(name, str) or not name or any(c.isspace() for c in name) or len(name) > 100:
        errors.append(RuleError(rule, "name", f"expected {FIELDS['name']}, got {name!r}."))
    return errors


def _where(
    raw: Mapping[str, Any], rule: str, errors: list[RuleError]
) -> tuple[tuple[str, ...], frozenset[str]]:
    """The path prefixes and URL names a rule covers (it needs one or the other)."""
    if "path" not in raw and "url_name" not in raw:
        errors.append(RuleError(rule, "path", "a rule needs a 'path' prefix or a 'url_name'."))
        return (), frozenset()
    paths = collect(errors, RuleError, _paths, raw["path"], rule) if "path" in raw else None
    names = None
    if "url_name" in raw:
        names = collect(errors, RuleError, _strings, raw["url_name"], rule, "url_name")
    return paths or (), frozenset(names or ())


def _methods(raw: Mapping[str, Any], rule: str, errors: list[RuleError]) -> frozenset[str] | None:
    """The methods a rule covers, upper case (None: every one)."""
    if raw.get("methods") in (None, "ALL", "all"):
        return None
    found = collect(errors, RuleError, _strings, raw["methods"], rule, "methods")
    return frozenset(m.upper() for m in found or ())


def _limit(raw: Mapping[str, Any], rule: str, trusted: bool) -> Limit:
    """The rule's limit. Its methods are the rule's to match: a rule counts every method it
    covers in one counter."""
    key, rate = raw.get("key"), raw.get("rate")
    errors: list[RuleError] = []
    found = None
    try:
        found = limits.build(
            f"rule:{rule}",
            key,
            rate,
            algorithm=raw.get("algorithm", kinds.DEFAULT),
            burst=raw.get("burst"),
            trusted=trusted,
            cost=raw.get("cost", 1),
            concurrent=raw.get("concurrent"),
            lease=raw.get("lease"),
            ban=raw.get("ban"),
            quota=raw.get("quota"),
            timezone=raw.get("timezone"),
        )
    except LimitError as exc:
        errors = [_rule_error(raw, rule, error) for error in exc.errors]
    if (
        trusted
        and isinstance(rate, str)
        and rates.is_dotted_path(rate)
        and not any(e.field == "rate" for e in errors)
    ):
        try:
            import_string(rate)
        except ImportError as exc:
            errors.append(RuleError(rule, "rate", f"cannot import {rate!r}: {exc}"))
    if errors or found is None:
        raise_all(errors)
    return found


def _rule_error(raw: Mapping[str, Any], rule: str, error: LimitError) -> RuleError:
    """A mistake of the limit, said as a mistake of the rule's field."""
    value = raw.get(error.field)
    missing = error.field in ("key", "rate") and not value
    if missing or (error.field == "key" and not (isinstance(value, str) or callable(value))):
        return RuleError(rule, error.field, f"expected {FIELDS[error.field]}, got {value!r}.")
    return RuleError(rule, error.field, str(error))


def parse_rules(raw: object) -> tuple[list[CompiledRule], list[RuleError]]:
    """Every valid rule, and an error for each invalid or duplicate one."""
    if raw is None:
        return [], []
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Iterable):
        got = "a dict" if isinstance(raw, Mapping) else f"{type(raw).__name__} {raw!r}"
        return [], [
            RuleError(
                "RATELIMIT_RULES",
                "",
                f"RATELIMIT_RULES must be a list of rule dicts (got {got}): write "
                "RATELIMIT_RULES = [{...}, ...], one dict per rule.",
            )
        ]
    found: list[CompiledRule] = []
    errors: list[RuleError] = []
    names: set[str] = set()
    for index, item in enumerate(raw):
        try:
            rule = parse_rule(item, index)
        except RuleError as exc:
            errors.extend(exc.errors)
            continue
        if rule.name in names:
            errors.append(RuleError(rule.name, "name", "another rule has this name."))
            continue
        names.add(rule.name)
        found.append(rule)
    return found, errors


#: (path, method) pairs a rule set remembers the matching rules of, and the URL names of
#: paths resolved; the longest path either remembers (a client chooses paths: each memo
#: holds at most about 256 KiB of them) and the longest method (a client chooses that too).
MATCH_MEMO = 1024
MATCH_MEMO_PATH = 256
MATCH_MEMO_METHOD = 16


def url_names() -> dict[tuple[str, str | None], str | None]:
    """The URL name of each (path, URLconf) resolved lately (a part of the runtime:
    forgotten with the URLconf; starts over when it holds ``MATCH_MEMO``)."""
    return RUNTIME.part(_url_names)


def _url_names() -> dict[tuple[str, str | None], str | None]:
    return {}


def _view_name(path: str, urlconf: str | None) -> str | None:
    """The URL name ``path`` resolves to (None: none), remembered unless longer than
    ``MATCH_MEMO_PATH``: paths repeat, and resolving walks the URL patterns.
    :meth:`RuleSet.match` reads the memo first."""
    try:
        found = resolve(path, urlconf).view_name
    except Resolver404:
        found = None
    if len(path) <= MATCH_MEMO_PATH:
        names = url_names()
        if len(names) >= MATCH_MEMO:
            names.clear()
        names[path, urlconf] = found
    return found


class RuleSet:
    """Rules precompiled for matching; shared by every request (the rules never change: a
    new configuration is a new rule set)."""

    def __init__(self, rules: Sequence[CompiledRule]) -> None:
        self.rules = tuple(rules)
        self.by_name = {r.name: r for r in self.rules}
        #: One of them limits requests in flight: their places are given back after the view.
        self.holds = any(r.holds for r in self.rules)
        self._path_rules = tuple(r for r in self.rules if r.paths)
        self._prefixes = tuple(p for r in self._path_rules for p in r.paths)
        self._url_rules = tuple(r for r in self.rules if r.url_names and not r.paths)
        self._both = tuple(r for r in self.rules if r.url_names and r.paths)
        #: The prefixes of the rules that need both: a path outside them resolves nothing.
        self._both_prefixes = tuple(p for r in self._both for p in r.paths)
        #: The rules of each (path, method) seen lately that needs no URL name. A client
        #: chooses paths: the memo starts over when full.
        self._matched: dict[tuple[str, str | None], tuple[CompiledRule, ...]] = {}

    def __bool__(self) -> bool:
        return bool(self.rules)

    def match(self, request: HttpRequest) -> tuple[CompiledRule, ...]:
        """Rules that apply to ``request``, in configuration order.

        A rule applies when the path starts with one of its ``path`` prefixes or the URL
        resolves to one of its ``url_name`` names (a rule with both needs both), and the
        method is one of its ``methods`` (HEAD where GET is: Django answers HEAD with the
        GET view).
        """
        path = request.path_info
        if not (self._url_rules or path.startswith(self._prefixes)):
            return ()  # the common case: one C-level prefix test
        method = request.method
        if self._url_rules or (self._both and path.startswith(self._both_prefixes)):
            urlconf = getattr(request, "urlconf", None)
            try:
                name = url_names()[path, urlconf]
            except KeyError:
                name = _view_name(path, urlconf)
            return self._select(path, method, name)
        # No URL name needed: the path and the method decide, and paths repeat.
        matched = self._matched
        found = matched.get((path, method))
        if found is None:
            found = self._select(path, method, None)
            if len(path) <= MATCH_MEMO_PATH and len(method or "") <= MATCH_MEMO_METHOD:
                if len(matched) >= MATCH_MEMO:
                    matched.clear()
                matched[path, method] = found
        return found

    def _select(self, path: str, method: str | None, name: str | None) -> tuple[CompiledRule, ...]:
        return tuple(
            r
            for r in self.rules
            if (r.matches is None or method in r.matches)
            and (not r.paths or path.startswith(r.paths))
            and (not r.url_names or name in r.url_names)
        )


EMPTY = RuleSet(())
