"""What ``ratelimit_usage`` and ``ratelimit_reset`` share: naming a limit and a subject.

A limit is named as a person knows it (a rule, ``drf:<scope>``, a decorator's group, a
decorated view's URL name, path or dotted path:
:func:`ratelimit_app.operators.operations.find_limits`), or, for a decorator no routed view
carries, by its group with the decorator's ``key`` and ``rate`` (and ``method``, ``algorithm`` and
``burst``). A view may carry several limits: the commands take each. Every mistake a person
can make on the command line becomes a :class:`~django.core.management.CommandError` that says
what to type instead, never a traceback, and a name that stands for nothing is one too, never
a silent zero.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import (
    BaseCommand,
    CommandError,
    CommandParser,
    DjangoHelpFormatter,
)

from ratelimit_app import ALL, UNSAFE
from ratelimit_app.algorithms import rates
from ratelimit_app.config import kinds, limits
from ratelimit_app.config.limits import LimitError, Method
from ratelimit_app.config.rules import parse_rules
from ratelimit_app.exceptions import BackendError
from ratelimit_app.identity import addresses
from ratelimit_app.operators.operations import Named, Target, UnknownLimit, find_limits, target

#: Shared by both commands' ``--help``.
LIMIT_EPILOG = """\
A limit is named as a person knows it: a rule of RATELIMIT_RULES or of the admin, a DRF
throttle's scope (drf:<scope>), a @ratelimit decorator's group (group=, or by default the
view's "module.qualname"), or a view that carries @ratelimit, by its URL name
(accounts:login), its URL path (/accounts/login/) or its dotted path: then each of its
decorators. A name that stands for nothing is an error that lists what it could have meant.

A @ratelimit group of a view the URLconf does not route is named with --key and --rate
(and --method when the decorator has method=), exactly as the decorator has them; a
leaky-bucket group also needs --algorithm leaky_bucket (and --burst when its decorator has
burst=). With --key, a name the site knows is resolved as without it (a view's name gives
its decorator's group), and a name it does not know is said on stderr before it is read as
a raw group. A limit whose rate a function returns per request needs --rate: the rate it
returns for this subject.

The subject is what the limit counts, typed as a person would: an IP address (masked as
RATELIMIT_IPV4_MASK / RATELIMIT_IPV6_MASK mask it), an email address (case and spaces do
not matter), a user id, a header value, what a key function returns. An IP typed for a key
of another kind (email, user, ...) addresses the counters of requests that had no such
value and fell back to the IP.
"""


class HelpFormatter(argparse.RawDescriptionHelpFormatter, DjangoHelpFormatter):
    """Django's order of the options; the description and the examples keep their lines."""


def find_target(named: Named, subject: str) -> Target:
    """The counters of ``subject`` under one limit; CommandError when there are none."""
    kind = named.limit.kind
    if not subject.strip():
        raise CommandError(
            "The subject is empty: give the IP address, email address or user id whose "
            f"counters to use ({named} is keyed by {kind})."
        )
    if kind == "ip" and addresses.mask_ip(subject) is None:
        raise CommandError(f"{subject!r} is not an IP address, and {named} is keyed by IP.")
    try:
        found = target(named.limit, subject)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    if found is None:
        raise CommandError(
            f"{subject!r} is not a subject {named} can count (key {kind}): nothing is left "
            "of it once control characters and surrounding spaces are removed."
        )
    return found


def targets(found: Sequence[Named], subject: str) -> tuple[list[tuple[Named, Target]], list[str]]:
    """The counters of ``subject`` under each limit that can count it, and why the others
    cannot; CommandError when none can (the first limit's reason)."""
    kept, skipped = [], []
    for named in found:
        try:
            kept.append((named, find_target(named, subject)))
        except CommandError as exc:
            if len(found) == 1:
                raise
            skipped.append(f"Skipped {named}: {exc}")
    if not kept:
        raise CommandError(" ".join(skipped))
    return kept, skipped


def parse_method(text: str) -> Method:
    """``--method``: ``POST``, ``GET,POST``, ``UNSAFE`` or ``ALL``, as the decorator's."""
    names = [m.strip().upper() for m in text.split(",") if m.strip()]
    if names == ["ALL"]:
        return ALL
    if names == ["UNSAFE"]:
        return list(UNSAFE)
    bad = [m for m in names if not m.isalpha() or m in ("ALL", "UNSAFE")]
    if not names or bad:
        raise CommandError(
            f"--method {text!r}: expected an HTTP method, several separated by commas "
            "(GET,POST), UNSAFE or ALL, as the decorator's method= argument."
        )
    return names[0] if len(names) == 1 else names


def _parse_rate(text: str) -> tuple[rates.Rate, ...]:
    if rates.is_dotted_path(text):
        raise CommandError(
            f"--rate {text!r} names a function: pass the rate it returns for this subject, "
            "such as '5/m'."
        )
    try:
        return rates.parse(text)
    except ImproperlyConfigured as exc:
        raise CommandError(f"--rate: {exc}") from exc


def _invalid_rule(name: str) -> CommandError | None:
    """The error of a rule of that name left out of RATELIMIT_RULES, if there is one."""
    _, errors = parse_rules(getattr(settings, "RATELIMIT_RULES", ()))
    for error in errors:
        if error.rule == name:
            return CommandError(
                f"Rule {name!r} is invalid and is left out of RATELIMIT_RULES: {error.problem} "
                f"(field {error.field!r})."
            )
    return None


def limit_from_options(
    options: dict[str, Any], warn: Callable[[str], None] = lambda line: None
) -> list[Named]:
    """The limits the positional ``rule`` and ``--key``/``--rate``/``--method`` name;
    ``warn``: what to tell of a name the site does not know, read as a raw group."""
    name: str = options["rule"]
    key: str | None = options["key"]
    algorithm: str | None = options.get("algorithm")
    burst: int | None = options.get("burst")
    if key is None and (algorithm is not None or burst is not None):
        raise CommandError(
            "--algorithm and --burst are for a @ratelimit group (with --key and --rate): a "
            "named limit has its own."
        )
    if key is not None:
        return [_group(name, key, options["rate"], options["method"], algorithm, burst, warn)]
    if options["method"] is not None:
        raise CommandError(
            "--method is for a @ratelimit group (with --key and --rate): a rule counts every "
            "method it covers in one counter, and a named group has its own."
        )
    return _named(name, options["rate"])


def _group(
    name: str,
    key: str,
    rate: str | None,
    method: str | None,
    algorithm: str | None,
    burst: int | None,
    warn: Callable[[str], None],
) -> Named:
    """A ``@ratelimit`` group, named with its decorator's arguments. A name the site knows
    (:func:`~ratelimit_app.operators.operations.find_limits`) is resolved as without ``--key``: a
    view's URL name, path or dotted path gives its decorator's group; any other name is
    used as typed, after a warning that the site knows no limit of that name."""
    if rate is None:
        raise CommandError(
            f"--key needs --rate: the counters of group {name!r} are found by the key, "
            "rate and method of its @ratelimit decorator."
        )
    _parse_rate(rate)
    bursting = [n for n in kinds.names() if kinds.KINDS[n].takes_burst]
    if burst is not None and algorithm not in bursting:
        raise CommandError(f"--burst is for --algorithm {' or '.join(bursting)}.")
    known = _known_as(name.strip())
    if not known:
        limit = _build(name, key, rate, method, algorithm, burst)
        warn(
            f"Warning: {name!r} is no rule, DRF throttle scope, @ratelimit group or decorated "
            f"view this site knows: read as the raw group {name!r} with --key {key} --rate "
            f"{rate} (a decorator that has exactly these arguments)."
        )
        return Named("group", name, limit)
    # The limit of the name whose arguments these are (of a view with several, that one).
    fitting: dict[tuple[str, str | None], Named] = {}
    for theirs in known:
        given = _build(theirs.limit.group, key, rate, method, algorithm, burst)
        if _alike(given, theirs.limit):
            own = theirs.limit if theirs.limit.static_rates is not None else given
            found = dataclasses.replace(theirs, limit=own)
            fitting.setdefault((theirs.name, own.static_scope), found)
    if len(fitting) == 1:
        return next(iter(fitting.values()))
    described = "; ".join(n.describe() for n in known)
    groups = list(dict.fromkeys(n.name for n in known))
    if len(groups) > 1 or fitting:
        raise CommandError(
            f"{name!r} names {len(known)} limits ({described}): name one by its group."
        )
    warn(
        f"Warning: {name!r} is {described}: --key {key} --rate {rate} read other counters "
        "than its own (drop --key and --rate to read those)."
    )
    return Named("group", groups[0], _build(groups[0], key, rate, method, algorithm, burst))


def _known_as(name: str) -> tuple[Named, ...]:
    """The limits the site knows ``name`` by (none for a name it does not know)."""
    try:
        return find_limits(name)
    except ValueError:  # unknown, a URLconf that cannot load, a decorator without a rate
        return ()


def _alike(given: limits.Limit, theirs: limits.Limit) -> bool:
    """Whether ``given`` (the options' limit, of ``theirs``'s group) has the arguments of
    ``theirs``: its key, algorithm, burst, methods and rates (a rate ``theirs`` takes from the
    request: any)."""
    if (given.kind, given.algorithm, given.burst) != (theirs.kind, theirs.algorithm, theirs.burst):
        return False
    mine = given.static_rates
    assert mine is not None  # (--rate is a literal)
    fixed = theirs.static_rates
    return given.method_text == theirs.method_text and fixed in (None, mine)


def _build(
    group: str,
    key: str,
    rate: str,
    method: str | None,
    algorithm: str | None,
    burst: int | None,
) -> limits.Limit:
    try:
        return limits.build(
            group,
            key,
            rate,
            parse_method(method) if method is not None else ALL,
            algorithm or kinds.DEFAULT,
            burst,
        )
    except LimitError as exc:
        prefix = f"--{exc.field}: " if exc.field in ("key", "rate", "method") else ""
        raise CommandError(f"{prefix}{exc}") from exc


def _named(name: str, rate: str | None) -> list[Named]:
    """The limits a name stands for (:func:`~ratelimit_app.operators.operations.find_limits`);
    ``rate`` only for those whose rate depends on the request."""
    try:
        found = find_limits(name)
    except UnknownLimit as exc:
        raise _invalid_rule(name) or CommandError(
            f"{exc} For a @ratelimit group of a view the URLconf does not route, pass --key "
            "and --rate as the decorator has them."
        ) from exc
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    given = None if rate is None else _parse_rate(rate)
    dynamic = [n for n in found if n.limit.static_rates is None]
    return [_with_rate(n, rate, given, bool(dynamic)) for n in found]


def _with_rate(
    named: Named, rate: str | None, given: tuple[rates.Rate, ...] | None, dynamic: bool
) -> Named:
    """``named``, with the ``--rate`` given when its rate depends on the request. ``dynamic``:
    some limit of the same name takes the rate (a fixed one then ignores it)."""
    limit = named.limit
    fixed = limit.static_rates
    if fixed is not None:
        if given is not None and given != fixed and not dynamic:
            raise CommandError(
                f"{named.kind.capitalize()} {named.name!r} has the fixed rate "
                f"{';'.join(map(str, fixed))}: drop --rate (it is only for a limit whose rate "
                "depends on the request)."
            )
        return named
    if rate is None:
        raise CommandError(
            f"{named.kind.capitalize()} {named.name!r} has a rate that depends on the request "
            f"({limit.rate!r}): pass --rate with the rate it returns for this subject, such as "
            "'5/m'."
        )
    try:
        methods = sorted(limit.methods) if limit.methods else ALL
        given_limit = limits.build(
            limit.group, limit.key, rate, methods, limit.algorithm, limit.burst
        )
    except LimitError as exc:
        raise CommandError(f"--rate: {exc}") from exc
    return dataclasses.replace(named, limit=given_limit)


@contextlib.contextmanager
def backend_errors() -> Iterator[None]:
    """A failed or misconfigured counter backend as a CommandError."""
    try:
        yield
    except BackendError as exc:
        raise CommandError(f"counter backend failed: {exc}") from exc
    except ImproperlyConfigured as exc:
        raise CommandError(f"counter backend is misconfigured: {exc}") from exc


class LimitCommand(BaseCommand):
    """A command about one subject of one limit (see the module docstring)."""

    #: These commands are for incidents (a locked-out user, a suspicious client): they must
    #: work while an unrelated system check fails, and report their own problems.
    requires_system_checks: list[str] = []
    #: Printed after the options by ``--help``.
    epilog = ""
    #: What the command does with the subject, for the subject's help ("read", "clear").
    verb = "read"
    #: What of the subject it works on, for the subject's help ("counters", "ban").
    what = "counters"

    def warn(self, line: str) -> None:
        """A line on stderr, for what the command goes on despite."""
        self.stderr.write(line, self.style.WARNING)

    def limits(self, options: dict[str, Any]) -> list[Named]:
        """The limits the options name (:func:`limit_from_options`), warnings on stderr."""
        return limit_from_options(options, self.warn)

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("epilog", (self.epilog + "\n" + LIMIT_EPILOG).strip("\n"))
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "rule",
            help="The limit: a rule's name, drf:<scope>, a @ratelimit group, or a decorated "
            "view's URL name, URL path or dotted path (see below).",
        )
        parser.add_argument(
            "subject",
            help=f"Whose {self.what} to {self.verb}: an IP address, an email address, a user "
            "id...",
        )
        parser.add_argument(
            "--key",
            help="A @ratelimit group's key ('ip', 'user', 'email', 'header:x-api-key', ...): "
            "RULE is then the group's name. Needs --rate.",
        )
        parser.add_argument(
            "--rate",
            help="The group's rate as its decorator has it ('5/m', '5/m;100/d'); for a rule "
            "whose rate depends on the request, the rate it returns for this subject.",
        )
        parser.add_argument(
            "--method",
            help="The group's decorator method= argument: POST, GET,POST, UNSAFE or ALL "
            "(default: ALL).",
        )
        parser.add_argument(
            "--algorithm",
            choices=kinds.names(),
            help=f"The group's decorator algorithm= argument (default: {kinds.DEFAULT}).",
        )
        parser.add_argument(
            "--burst",
            type=int,
            help="The group's decorator burst= argument (a leaky bucket's capacity; default: "
            "the rate's count).",
        )
