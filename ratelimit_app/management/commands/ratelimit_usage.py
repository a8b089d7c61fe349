"""``manage.py ratelimit_usage <rule> <subject>``: a subject's counts under one limit."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ratelimit_app.core import Target, lookup
from ratelimit_app.management.base import Limit, LimitCommand, backend_errors, limit_from_options

COLUMNS = ("rate", "count", "limit", "remaining", "reset (s)", "state")


def table(usage: dict[str, Any]) -> list[str]:
    """One aligned line per rate under a header line: rate, count, limit, remaining,
    reset (seconds until every counted hit has left the window), and limited or ok."""
    rows = [COLUMNS] + [
        (
            str(r["rate"]),
            str(r["count"]),
            str(r["limit"]),
            str(r["remaining"]),
            str(r["reset"]),
            "limited" if r["should_limit"] else "ok",
        )
        for r in usage["rates"]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = []
    for row in rows:
        cells = [
            cell.ljust(width) if i in (0, len(COLUMNS) - 1) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


class Command(LimitCommand):
    help = """\
Show a subject's usage of a rate limit: for each rate, the hits counted in its window, the
limit, how many more it admits now, the seconds until every counted hit has left the window,
and whether the subject is limited. Counts nothing.

Examples:
  manage.py ratelimit_usage login-email alice@example.com
  manage.py ratelimit_usage api 203.0.113.7 --json
  manage.py ratelimit_usage accounts.views.login 203.0.113.7 --key ip --rate 5/m --method POST
"""
    verb = "read"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print the usage as JSON (the dict get_usage returns: count, limit, "
            "should_limit, remaining, reset, retry_after, rate, and rates: one per rate).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        limit = limit_from_options(options)
        found = limit.find(options["subject"])
        with backend_errors():
            usage = lookup(
                limit.rule_or_group, options["subject"], limit.key, limit.rate, limit.method
            )
        if usage is None:  # found above: cannot happen unless the settings changed meanwhile
            raise CommandError(f"No counters found for {options['subject']!r}.")
        if options["json"]:
            self.stdout.write(json.dumps(usage, indent=2))
            return
        self.stdout.write(self.heading(limit, found))
        for line in table(usage):
            self.stdout.write(line)
        if usage["should_limit"]:
            self.stdout.write(
                f"Limited by {usage['rate']}: the next request is admitted in "
                f"{usage['retry_after']} s.",
                self.style.WARNING,
            )
        else:
            self.stdout.write(
                f"Not limited: {usage['remaining']} more admitted now ({usage['rate']}).",
                self.style.SUCCESS,
            )

    @staticmethod
    def heading(limit: Limit, found: Target) -> str:
        text = f"{limit.kind.capitalize()} {limit.name} (key {limit.key_kind}), "
        text += f"subject {found.value}"
        if len(found.kinds()) > 1:
            text += " (an IP: the requests that had no value for the key and fell back to it)"
        return text + ":"
