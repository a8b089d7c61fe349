"""System checks for every ``RATELIMIT_*`` setting and every ``@ratelimit``.

IDs are defined once, in :data:`MESSAGES`, and listed in ``docs/checks.rst`` (a test keeps the
two in step).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import ipaddress
import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ratelimit_app import clock
from ratelimit_app.algorithms import rates, windows
from ratelimit_app.backends import (
    DUMMY,
    MEMCACHED,
    REDIS,
    backend_class,
    build,
    configured_class,
    missing_cache,
)
from ratelimit_app.backends.base import Backend, Op
from ratelimit_app.conf import DEFAULTS, drf_throttles_named
from ratelimit_app.config import declared, sources

if TYPE_CHECKING:
    from ratelimit_app.config.rules import CompiledRule

MESSAGES: Mapping[str, str] = MappingProxyType(
    {
        "E001": "RATELIMIT_USE_CACHE names a cache alias that is not in CACHES.",
        "E003": "RATELIMIT_IPV4_MASK must be an integer from 0 to 32.",
        "E004": "RATELIMIT_IPV6_MASK must be an integer from 0 to 128.",
        "E005": "RATELIMIT_TRUSTED_PROXIES must be a list of IP addresses or CIDR networks.",
        "E006": "RATELIMIT_HASH_ALGORITHM must be a hash constructor or its dotted path.",
        "E007": "A RATELIMIT_* dotted path cannot be imported.",
        "E008": "RATELIMIT_CACHE_PREFIX must be a short string without "
        "spaces or control characters.",
        "E010": "A @ratelimit decorator has an invalid rate, key, algorithm or burst.",
        "E011": "RATELIMIT_IP_META_KEY must be a META key, a callable or a dotted path.",
        "E013": "The rate-limit cache has no LOCATION: no server to count on.",
        "E014": "A RATELIMIT_RULES rule is invalid.",
        "E015": "RATELIMIT_ALLOW and RATELIMIT_DENY must be lists of IPs, CIDR networks, "
        "'user:<id>' entries or email addresses.",
        "E016": "RATELIMIT_FAILURE_STATUSES must be a list of HTTP status codes (100-599).",
        "E018": "RATELIMIT_BACKEND must be a Backend subclass that can be "
        "built as cls(alias, cache).",
        "E020": "REST_FRAMEWORK names throttles of ratelimit_app.throttling, but Django REST "
        "framework is not installed.",
        "E022": 'RATELIMIT_FALLBACK must be "memory" or None.',
        "E021": "A Django REST framework throttle of ratelimit_app.throttling cannot count: a "
        "REST_FRAMEWORK setting or a view's throttle is invalid.",
        "W003": "RATELIMIT_RULES is set but RatelimitMiddleware is not in MIDDLEWARE: "
        "no rule applies.",
        "W004": "RatelimitMiddleware comes before AuthenticationMiddleware: it sees every request "
        "as anonymous, so 'user:<id>' entries of the allow and deny lists never match and rules "
        "keyed on the user fall back to the IP.",
        "W001": "The rate-limit cache is not shared between processes: each process counts alone.",
        "W002": "The rate-limit cache has no atomic increment: concurrent hits can be lost.",
        "W005": "The rate-limit cache is a DummyCache, which stores nothing: no limit is ever "
        "reached (only a rate of 0 refuses).",
        "W007": "A counter server cannot be reached: every rate-limited request fails open or "
        "closed (RATELIMIT_FAIL_OPEN).",
        "W008": "A RATELIMIT_* setting is not one of django-bucketry's: it has no effect.",
        "W009": "A RATELIMIT_RULES rule names a url_name that no URL pattern "
        "has: it never applies.",
        "W010": "A @ratelimit decorator has no rate: it limits nothing.",
        "W011": "A limit's cost is over the whole limit: every request it covers is refused.",
    }
)

_NOT_SHARED = frozenset({"django.core.cache.backends.locmem.LocMemCache"})
_NOT_ATOMIC = frozenset(
    {
        "django.core.cache.backends.filebased.FileBasedCache",
        "django.core.cache.backends.db.DatabaseCache",
    }
)


def _error(code: str, detail: str = "", hint: str | None = None) -> checks.CheckMessage:
    level = checks.Warning if code.startswith("W") else checks.Error
    msg = MESSAGES[code] + (f" {detail}" if detail else "")
    return level(msg, hint=hint, id=f"ratelimit_app.{code}")


def _setting(name: str) -> Any:
    return getattr(settings, name, DEFAULTS[name])


def _importable(value: object) -> bool:
    if not isinstance(value, str) or "." not in value:
        return True
    try:
        import_string(value)
    except ImportError:
        return False
    return True


@checks.register(checks.Tags.caches)
def check_cache(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    alias = _setting("RATELIMIT_USE_CACHE")
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        return [_error("E001", missing_cache(alias, caches))]
    backend = caches[alias].get("BACKEND", "")
    if backend in (MEMCACHED, REDIS) and not caches[alias].get("LOCATION"):
        return [_error("E013", f"({alias!r} is {backend}).")]
    if backend == DUMMY and not _setting("RATELIMIT_BACKEND"):
        return [
            _error(
                "W005",
                f"({alias!r} is {backend}).",
                hint="Fine where nothing should be limited; use LocMemCache to see the limits "
                "in development, and memcached or Redis in production.",
            )
        ]
    if backend in _NOT_SHARED:
        return [
            _error(
                "W001",
                f"({alias!r} is {backend}).",
                hint="Fine for development; use PyMemcacheCache or django-redis in production.",
            )
        ]
    if backend in _NOT_ATOMIC:
        return [_error("W002", f"({alias!r} is {backend}).", hint=f"Use {MEMCACHED} or {REDIS}.")]
    return []


#: Subjects a server check looks at per server: with several memcached servers, each is
#: then all but certain to hold one of them (a server holds the subjects that hash to it).
_LOOKS_PER_SERVER = 16
_START_A_SERVER = (
    "Start the server it names (memcached: `memcached -d`; Redis: `redis-server "
    "--daemonize yes`) and make sure every process can reach it; while developing, a "
    "local-memory cache needs none: CACHES = {'default': {'BACKEND': "
    "'django.core.cache.backends.locmem.LocMemCache'}}."
)


@checks.register(checks.Tags.caches, deploy=True)
def check_servers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Ask the counter servers once (``check --deploy`` only: a plain check never
    connects), with a look that counts nothing and the backends' short timeouts."""
    alias = _setting("RATELIMIT_USE_CACHE")
    try:
        backend = build(backend_class(alias), alias)
    except ImproperlyConfigured:
        return []  # check_cache and check_settings say what is wrong
    except Exception as exc:  # a BackendError: a server address that cannot be used
        detail = f"Cache {alias!r} has a server address that cannot be used: {_cause(exc)}."
    else:
        try:
            detail = _unreachable(backend, alias)
        finally:
            with contextlib.suppress(Exception):
                backend.close()
    return [_error("W007", detail, hint=_START_A_SERVER)] if detail else []


def _cause(exc: BaseException) -> BaseException:
    """What a BackendError wraps (its own text repeats the cache alias)."""
    return exc.__cause__ or exc


def _unreachable(backend: Backend, alias: str) -> str:
    """Which servers of ``backend`` failed a look that counts nothing ("" if none did)."""
    servers = backend.servers
    if not servers:
        return ""  # it counts in the process or through a Django cache: nothing to reach
    plan = windows.plan(rates.parse("1/m"), clock.now())
    looks = [Op(f"{{rl-check-{i}}}", plan) for i in range(_LOOKS_PER_SERVER * len(servers))]
    error: BaseException | None = None
    try:
        backend.run_many(looks)
    except Exception as exc:
        error = _cause(exc)
    # A server that failed is marked down; a failure that marked none is every server's.
    down = [s.name for s in servers if s.dead_until] or [s.name for s in servers if error]
    if not down:
        return ""
    said = f": {error}" if error else " did not answer"
    return f"Server {', '.join(down)} of cache {alias!r}{said}."


def _int_in(value: object, low: int, high: int) -> bool:
    """An int (not a bool) from ``low`` to ``high``."""
    return type(value) is int and low <= value <= high


def _masks() -> Iterable[checks.CheckMessage]:
    for name, code, top in (
        ("RATELIMIT_IPV4_MASK", "E003", 32),
        ("RATELIMIT_IPV6_MASK", "E004", 128),
    ):
        value = _setting(name)
        if not _int_in(value, 0, top):
            yield _error(code, f"Got {value!r}.")


def _proxies() -> Iterable[checks.CheckMessage]:
    proxies = _setting("RATELIMIT_TRUSTED_PROXIES")
    try:
        if isinstance(proxies, str):
            raise ValueError("a string, not a list")
        for p in proxies:
            ipaddress.ip_network(p, strict=False)
    except (TypeError, ValueError) as exc:
        yield _error("E005", f"({exc}).")


def _dotted_paths() -> Iterable[checks.CheckMessage]:
    algorithm = _setting("RATELIMIT_HASH_ALGORITHM")
    if not _importable(algorithm) or not (isinstance(algorithm, str) or callable(algorithm)):
        yield _error("E006", f"Got {algorithm!r}.")
    for name in ("RATELIMIT_VIEW", "RATELIMIT_EXCEPTION_CLASS", "RATELIMIT_BACKEND"):
        if not _importable(_setting(name)):
            yield _error("E007", f"{name} = {_setting(name)!r}.")
    backend = _setting("RATELIMIT_BACKEND")
    if backend and _importable(backend):
        try:
            configured_class(backend)
        except ImproperlyConfigured as exc:
            yield _error("E018", str(exc))


def _prefix() -> Iterable[checks.CheckMessage]:
    prefix = _setting("RATELIMIT_CACHE_PREFIX")
    if not isinstance(prefix, str) or len(prefix) > 64 or re.search(r"[\s\x00-\x1f\x7f]", prefix):
        yield _error("E008", f"Got {prefix!r}.")


def _ip_meta_key() -> Iterable[checks.CheckMessage]:
    meta = _setting("RATELIMIT_IP_META_KEY")
    # A string is a META key ("HTTP_X_REAL_IP") unless it is a dotted path to a function.
    if not (meta is None or callable(meta) or (isinstance(meta, str) and _importable(meta))):
        yield _error("E011", f"Got {meta!r}.")


def _closest(name: str, known: Iterable[str], prefix: str = "") -> str | None:
    """The known name closest to ``name``, if any is close. Compared without ``prefix``,
    which every candidate shares and which would make any two look alike."""
    stems = {k.removeprefix(prefix): k for k in known}
    close = difflib.get_close_matches(name.removeprefix(prefix), stems, n=1)
    return stems[close[0]] if close else None


def _unknown() -> Iterable[checks.CheckMessage]:
    """A ``RATELIMIT_*`` setting we do not read: most likely a typo, which would leave the
    default in force without a word."""
    known = DEFAULTS.keys()
    for name in sorted(n for n in dir(settings) if n.startswith("RATELIMIT_")):
        if name in known:
            continue
        close = _closest(name, DEFAULTS, "RATELIMIT_")
        if close:
            yield _error("W008", f"{name}: did you mean {close}?", hint=f"Rename it {close}.")
        else:
            yield _error(
                "W008",
                f"{name}.",
                hint="Check its spelling against the settings page of the docs, or remove it "
                "(another library's? add 'ratelimit_app.W008' to SILENCED_SYSTEM_CHECKS).",
            )


def _check_settings() -> Iterable[checks.CheckMessage]:
    for check in (
        _masks,
        _proxies,
        _dotted_paths,
        _prefix,
        _ip_meta_key,
        _fallback,
        _unknown,
    ):
        yield from check()


def _fallback() -> Iterable[checks.CheckMessage]:
    value = _setting("RATELIMIT_FALLBACK")
    if not (value is None or value is False or (type(value) is str and value == "memory")):
        yield _error("E022", f"RATELIMIT_FALLBACK is {value!r}.")


MIDDLEWARE_PATH = "ratelimit_app.middleware.RatelimitMiddleware"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"


def _access_lists() -> Iterable[checks.CheckMessage]:
    from ratelimit_app.config.access import compile_list

    for name in ("RATELIMIT_ALLOW", "RATELIMIT_DENY"):
        try:
            compile_list(_setting(name))
        except (ImproperlyConfigured, TypeError) as exc:
            yield _error("E015", f"{name}: {exc}")


def _statuses() -> Iterable[checks.CheckMessage]:
    statuses = _setting("RATELIMIT_FAILURE_STATUSES")
    if isinstance(statuses, str | int) or not all(_int_in(x, 100, 599) for x in statuses):
        yield _error("E016", f"Got {statuses!r}.")


def _reading_the_user(found: list[CompiledRule]) -> list[str]:
    """What would read ``request.user`` in the middleware, in sentences (none: nothing)."""
    said = []
    listed = [n for n in ("RATELIMIT_ALLOW", "RATELIMIT_DENY") if declared.access_list(n).users]
    if listed:
        said.append(f"'user:<id>' entries in {' and '.join(listed)}.")
    user_keyed = [r.name for r in found if r.key in ("user", "user_or_ip")]
    if user_keyed:
        said.append(f"Rules keyed on the user: {', '.join(map(repr, user_keyed))}.")
    else:
        said.append("Rules added in the admin may be keyed on the user.")
    return said


def _middleware_order(raw: object, found: list[CompiledRule]) -> Iterable[checks.CheckMessage]:
    middleware = list(getattr(settings, "MIDDLEWARE", None) or ())
    if raw and MIDDLEWARE_PATH not in middleware:
        yield _error("W003", hint=f"Add {MIDDLEWARE_PATH!r} to MIDDLEWARE.")
    if not (MIDDLEWARE_PATH in middleware and AUTH_MIDDLEWARE in middleware):
        return
    said = _reading_the_user(found)
    if said and middleware.index(MIDDLEWARE_PATH) < middleware.index(AUTH_MIDDLEWARE):
        yield _error(
            "W004",
            " ".join(said),
            hint="Move RatelimitMiddleware after AuthenticationMiddleware in MIDDLEWARE.",
        )


def _check_rules() -> Iterable[checks.CheckMessage]:
    from ratelimit_app.config.rules import parse_rules

    raw = _setting("RATELIMIT_RULES")
    found, errors = parse_rules(raw)
    for error in errors:
        if not error.field:  # the setting itself is no list of rules
            yield checks.Error(error.problem, id="ratelimit_app.E014")
            continue
        yield _error("E014", f"Rule {error.rule!r}, field {error.field!r}: {error.problem}")
    for rule in found:
        yield from _over_cost(rule.limit.cost_problem())
    yield from _access_lists()
    yield from _statuses()
    yield from _middleware_order(raw, found)


def _over_cost(problem: str | None) -> Iterable[checks.CheckMessage]:
    if problem is not None:
        yield _error("W011", problem, hint="Lower the cost, or raise the rate.")


def _url_names(patterns: Iterable[Any], namespace: str = "") -> Iterable[str]:
    """The names a request's URL can resolve to (``resolve(path).view_name``): each pattern's
    name, or its view's dotted path when it has none, behind its namespaces."""
    from django.urls import URLResolver

    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            yield from _url_names(pattern.url_patterns, inner)
        else:
            yield namespace + (pattern.name or pattern.lookup_str)


def _patterns() -> list[Any] | None:
    """The root URLconf's patterns (None: it cannot be loaded, which Django's own URL checks
    report). Importing it imports the views: their decorators and throttles register."""
    from django.urls import get_resolver

    with contextlib.suppress(Exception):
        return list(get_resolver().url_patterns)
    return None


def _known_url_names() -> set[str] | None:
    """Every name of the root URLconf (None: it cannot be loaded, as for :func:`_patterns`)."""
    patterns = _patterns()
    with contextlib.suppress(Exception):  # an include() that cannot be loaded
        return None if patterns is None else set(_url_names(patterns))
    return None


def _unknown_url_name(rule: str, name: str, names: set[str]) -> checks.CheckMessage:
    close = _closest(name, names)
    return _error(
        "W009",
        f"Rule {rule!r}, url_name {name!r}" + (f": did you mean {close!r}?" if close else "."),
        hint="Write the name= of a URL pattern, with its namespace ('accounts:login'), or "
        "match the rule on a 'path' prefix instead.",
    )


@checks.register(checks.Tags.urls)
def check_rule_urls(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A rule whose ``url_name`` no pattern has never applies: a typo, or a name that a
    namespace qualifies (``'accounts:login'``)."""
    from ratelimit_app.config.rules import parse_rules

    found, _ = parse_rules(_setting("RATELIMIT_RULES"))  # check_rules reports the rest
    names = _known_url_names() if any(r.url_names for r in found) else None
    if names is None:
        return []
    return [
        _unknown_url_name(rule.name, name, names)
        for rule in found
        for name in sorted(rule.url_names - names)
    ]


@checks.register()
def check_rules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return list(_check_rules())


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return list(_check_settings())


@checks.register(checks.Tags.urls)
def check_decorators(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from ratelimit_app.decorators import registry

    _patterns()  # imports the views: their decorators register
    errors = [
        _error("E010", f"{view}: {problem}")
        for view, registered in registry.items()
        for problem in registered.problems
    ]
    return (
        errors
        + [
            _error(
                "W010",
                f"{view}.",
                hint="Give it a rate: @ratelimit(key='ip', rate='5/m') (a callable rate may "
                "return None where no limit applies), or remove the decorator.",
            )
            for view, registered in registry.items()
            if registered.unlimited
        ]
        + [
            message
            for registered in registry.values()
            for message in _over_cost(registered.over_cost)
        ]
    )


@checks.register(checks.Tags.urls)
def check_throttling(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    named = drf_throttles_named()
    if importlib.util.find_spec("rest_framework") is None:
        if not named:
            return []
        return [
            _error(
                "E020",
                f"(REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES'] names {', '.join(named)}).",
                hint="pip install 'django-bucketry[drf]' (or djangorestframework), or remove "
                "them from REST_FRAMEWORK.",
            )
        ]
    patterns = _patterns() or []
    if named:
        # Named in the settings: they must load, and loading them registers their source.
        from ratelimit_app import throttling  # noqa: F401
    drf = sources.get(sources.DRF)
    if drf is None:
        return []  # no throttle of ours anywhere: nothing imports Django REST framework
    return [_error("E021", problem) for problem in drf.problems(patterns)]
