"""What ``ratelimit_usage`` and ``ratelimit_reset`` share: naming a limit and a subject.

A limit is either a rule of ``RATELIMIT_RULES`` (by its name) or the group of a
``@ratelimit`` decorator, named with the decorator's ``key`` and ``rate`` (and ``method``,
``algorithm`` and ``burst``):
:func:`ratelimit_app.operations.target` finds the counters either way. Every mistake a person can
make on the command line becomes a :class:`~django.core.management.CommandError` that says
what to type instead, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import (
    BaseCommand,
    CommandError,
    CommandParser,
    DjangoHelpFormatter,
)

from ratelimit_app import ALL, UNSAFE, store
from ratelimit_app.algorithms import gcra, rates
from ratelimit_app.config import limits
from ratelimit_app.config.limits import Limit, LimitError, Method
from ratelimit_app.config.rules import parse_rules
from ratelimit_app.exceptions import BackendError
from ratelimit_app.identity import addresses
from ratelimit_app.operations import Target, target

#: Shared by both commands' ``--help``.
LIMIT_EPILOG = """\
A rule is named as in RATELIMIT_RULES. A @ratelimit decorator's counters are named by its
group (the view's "module.qualname" when the decorator has no group=) with --key and
--rate (and --method when the decorator has method=), exactly as the decorator has them.

A leaky-bucket group also needs --algorithm leaky_bucket (and --burst when its decorator
has burst=).

The subject is what the limit counts, typed as a person would: an IP address (masked as
RATELIMIT_IPV4_MASK / RATELIMIT_IPV6_MASK mask it), an email address (case and spaces do
not matter), a user id, a header value. An IP typed for a key of another kind (email, user,
...) addresses the counters of requests that had no such value and fell back to the IP.
"""

T = TypeVar("T")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, DjangoHelpFormatter):
    """Django's order of the options; the description and the examples keep their lines."""


@dataclass(frozen=True, slots=True)
class Named:
    """A rule or a ``@ratelimit`` group, as the command line named it, and its limit."""

    #: "rule" or "group".
    kind: str
    name: str
    limit: Limit

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"

    @property
    def key_kind(self) -> str:
        """The kind of the limit's key ("ip", "email", ...)."""
        return self.limit.kind

    def apply(self, fn: Callable[[Limit, str], T], subject: str) -> T:
        """``fn(limit, subject)``: :func:`~ratelimit_app.operations.target`,
        :func:`~ratelimit_app.operations.lookup` or :func:`~ratelimit_app.operations.reset`."""
        return fn(self.limit, subject)

    def find(self, subject: str) -> Target:
        """The counters of ``subject`` under this limit; CommandError when there are none."""
        if not subject.strip():
            raise CommandError(
                "The subject is empty: give the IP address, email address or user id whose "
                f"counters to use ({self} is keyed by {self.key_kind})."
            )
        if self.key_kind == "ip" and addresses.mask_ip(subject) is None:
            raise CommandError(f"{subject!r} is not an IP address, and {self} is keyed by IP.")
        try:
            found = self.apply(target, subject)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if found is None:
            raise CommandError(
                f"{subject!r} is not a subject {self} can count (key {self.key_kind}): "
                "nothing is left of it once control characters and surrounding spaces are "
                "removed."
            )
        return found


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


def _unknown_rule(name: str) -> CommandError:
    _, errors = parse_rules(getattr(settings, "RATELIMIT_RULES", ()))
    for error in errors:
        if error.rule == name:
            return CommandError(
                f"Rule {name!r} is invalid and is left out of RATELIMIT_RULES: {error.problem} "
                f"(field {error.field!r})."
            )
    names = sorted(store.current().rules.by_name)
    configured = (
        f"Configured rules: {', '.join(names)}." if names else "RATELIMIT_RULES has no rules."
    )
    return CommandError(
        f"No rule named {name!r}. {configured} For a @ratelimit group, pass --key and --rate "
        "as the decorator has them."
    )


def limit_from_options(options: dict[str, Any]) -> Named:
    """The limit the positional ``rule`` and ``--key``/``--rate``/``--method`` name."""
    name: str = options["rule"]
    key: str | None = options["key"]
    algorithm: str | None = options.get("algorithm")
    burst: int | None = options.get("burst")
    if key is None and (algorithm is not None or burst is not None):
        raise CommandError(
            "--algorithm and --burst are for a @ratelimit group (with --key and --rate): a "
            "rule has its own."
        )
    if key is not None:
        return _group(name, key, options["rate"], options["method"], algorithm, burst)
    if options["method"] is not None:
        raise CommandError(
            "--method is for a @ratelimit group (with --key and --rate): a rule counts every "
            "method it covers in one counter."
        )
    return _rule(name, options["rate"])


def _group(
    name: str,
    key: str,
    rate: str | None,
    method: str | None,
    algorithm: str | None,
    burst: int | None,
) -> Named:
    """A ``@ratelimit`` group, named with its decorator's arguments."""
    if rate is None:
        raise CommandError(
            f"--key needs --rate: the counters of group {name!r} are found by the key, "
            "rate and method of its @ratelimit decorator."
        )
    _parse_rate(rate)
    if burst is not None and algorithm != gcra.LEAKY_BUCKET:
        raise CommandError("--burst is for --algorithm leaky_bucket.")
    try:
        limit = limits.build(
            name,
            key,
            rate,
            parse_method(method) if method is not None else ALL,
            algorithm or gcra.SLIDING_WINDOW,
            burst,
        )
    except LimitError as exc:
        prefix = f"--{exc.field}: " if exc.field in ("key", "rate", "method") else ""
        raise CommandError(f"{prefix}{exc}") from exc
    return Named("group", name, limit)


def _rule(name: str, rate: str | None) -> Named:
    """A rule in force; ``rate`` only for one whose rate depends on the request."""
    rule = store.current().rules.by_name.get(name)
    if rule is None:
        raise _unknown_rule(name)
    fixed = rule.static_rates
    if rate is None:
        if fixed is None:
            raise CommandError(
                f"Rule {name!r} has a rate that depends on the request ({rule.rate!r}): "
                "pass --rate with the rate it returns for this subject, such as '5/m'."
            )
        return Named("rule", name, rule.limit)
    given = _parse_rate(rate)
    if fixed is not None:
        if given != fixed:
            raise CommandError(
                f"Rule {name!r} has the fixed rate {';'.join(map(str, fixed))}: drop --rate (it "
                "is only for a rule whose rate depends on the request)."
            )
        return Named("rule", name, rule.limit)
    # A rule whose rate depends on the request: its limit with the rate given.
    limit = rule.limit
    try:
        given_limit = limits.build(limit.group, limit.key, rate, ALL, limit.algorithm, limit.burst)
    except LimitError as exc:
        raise CommandError(f"--rate: {exc}") from exc
    return Named("rule", name, given_limit)


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

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("epilog", (self.epilog + "\n" + LIMIT_EPILOG).strip("\n"))
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "rule",
            help="The name of a rule in RATELIMIT_RULES or, with --key, a @ratelimit group.",
        )
        parser.add_argument(
            "subject",
            help=f"Whose counters to {self.verb}: an IP address, an email address, a user id...",
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
            choices=gcra.ALGORITHMS,
            help="The group's decorator algorithm= argument (default: sliding_window).",
        )
        parser.add_argument(
            "--burst",
            type=int,
            help="The group's decorator burst= argument (a leaky bucket's capacity; default: "
            "the rate's count).",
        )
