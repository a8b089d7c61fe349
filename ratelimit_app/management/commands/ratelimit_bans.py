"""``manage.py ratelimit_bans [--limit L]``: the bans in force, as their rows keep them."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ratelimit_app import clock
from ratelimit_app.management.base import HelpFormatter
from ratelimit_app.operators.operations import UnknownLimit, filed_names

COLUMNS = ("limit", "subject", "kind", "where", "until", "left (s)")


def subject_of(row: Any) -> str:
    """What a ban row keeps of its subject (its label, per ``RATELIMIT_REFUSED_SUBJECTS``),
    or that it keeps it hashed only: the subject itself is never printed."""
    return row.label or "(hashed)"


class Command(BaseCommand):
    help = """\
List the bans in force: for each, the limit that made it, what its row keeps of the subject
(an address as RATELIMIT_REFUSED_SUBJECTS shows it, its /24 or /64 by default; "(hashed)"
for an email, a user, a header value, or any subject when that setting is "hashed"), the
kind of key, whether it holds on the limit's paths or on every path, and when it ends.
ratelimit_unban lifts one.

Examples:
  manage.py ratelimit_bans
  manage.py ratelimit_bans --limit login-ip
  manage.py ratelimit_bans --limit accounts:login
"""
    #: For incidents: must work while an unrelated system check fails.
    requires_system_checks: list[str] = []

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        kwargs.setdefault("formatter_class", HelpFormatter)
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--limit",
            help="Only the bans of this limit: a rule's name, drf:<scope>, a @ratelimit "
            "group, or a decorated view's URL name, URL path or dotted path (as for "
            "ratelimit_usage).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from ratelimit_app.models import Ban

        now = dt.datetime.fromtimestamp(clock.now(), dt.UTC)
        rows = Ban.objects.filter(until__gt=now).order_by("limit", "until", "pk")
        name = options["limit"]
        if name is not None:
            rows = rows.filter(limit__in=self.filed(name, Ban))
        try:
            found = list(rows)
        except DatabaseError as exc:
            raise CommandError(f"the bans could not be read: {exc}") from exc
        if not found:
            of = "" if name is None else f" of {name}"
            self.stdout.write(f"No bans in force{of}.")
            return
        lines = [COLUMNS]
        for row in found:
            lines.append(
                (
                    row.limit,
                    subject_of(row),
                    row.kind,
                    "every path" if row.site else "limit",
                    row.until.astimezone(dt.UTC).isoformat(timespec="seconds"),
                    str(max(0, int((row.until - now).total_seconds()))),
                )
            )
        widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
        for line in lines:
            cells = [
                cell.rjust(width) if i == len(COLUMNS) - 1 else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(line, widths, strict=True))
            ]
            self.stdout.write("  ".join(cells).rstrip())

    @staticmethod
    def filed(name: str, ban: Any) -> tuple[str, ...]:
        """The names the bans of the limit ``name`` are filed under (as the other commands
        resolve it); a name the site does not know is one only while ban rows hold it (a
        rule since removed, a group on no routed view)."""
        try:
            return filed_names(name)
        except UnknownLimit as exc:
            text = name.strip()
            if ban.objects.filter(limit=text).exists():
                return (text,)
            raise CommandError(str(exc)) from exc
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
