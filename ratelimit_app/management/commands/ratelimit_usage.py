"""``manage.py ratelimit_usage <rule> <subject>``: a subject's counts under one limit."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ratelimit_app.config import kinds
from ratelimit_app.management.base import (
    LimitCommand,
    backend_errors,
    targets,
)
from ratelimit_app.operators.operations import Named, Target, lookup


def _rows(usage: dict[str, Any]) -> list[tuple[str, ...]]:
    """The table of ``usage``, as its kind of limit shows it (a usage without one: the
    default's, one line per rate)."""
    kind = kinds.KINDS.get(usage.get("algorithm", kinds.DEFAULT)) or kinds.KINDS[kinds.DEFAULT]
    return kind.usage_rows(usage)


def table(usage: dict[str, Any]) -> list[str]:
    """One aligned line per rate under a header line: rate, count, limit, remaining,
    reset (seconds until every counted hit has left the window), and limited or ok. For a
    leaky bucket, one line: rate, level, capacity, remaining, seconds until it is empty,
    and limited or ok."""
    rows = _rows(usage)
    columns = len(rows[0])
    widths = [max(len(row[i]) for row in rows) for i in range(columns)]
    lines = []
    for row in rows:
        cells = [
            cell.ljust(width) if i in (0, columns - 1) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


class Command(LimitCommand):
    help = """\
Show a subject's usage of a rate limit: for each rate, the hits counted in its window, the
limit, how many more it admits now, the seconds until every counted hit has left the window,
and whether the subject is limited. For a leaky bucket: its level, its capacity, how many
more it admits now and the seconds until it is empty. Counts nothing.

Examples:
  manage.py ratelimit_usage login-email alice@example.com
  manage.py ratelimit_usage api 203.0.113.7 --json
  manage.py ratelimit_usage accounts:login 203.0.113.7
  manage.py ratelimit_usage /api/send/ 42
  manage.py ratelimit_usage drf:anon 203.0.113.7
  manage.py ratelimit_usage accounts.views.login 203.0.113.7 --key ip --rate 5/m --method POST
  manage.py ratelimit_usage api.views.send 42 --key user --rate 1/s --algorithm leaky_bucket
"""
    verb = "read"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print the usage as JSON (the dict get_usage returns: count, limit, "
            "should_limit, remaining, reset, retry_after, rate, rates: one per rate, and "
            "algorithm; level and capacity for a leaky bucket). When the name stands for "
            "several limits, a list of them, each with its limit's name in 'name'.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        subject = options["subject"]
        found, skipped = targets(self.limits(options), subject)
        usages = []
        for named, where in found:
            with backend_errors():
                usage = lookup(named.limit, subject)
            if usage is None:  # found above: cannot happen unless the settings changed meanwhile
                raise CommandError(f"No counters found for {subject!r}.")
            usages.append((named, where, usage))
        if options["json"]:
            shown: Any = usages[0][2]
            if len(usages) > 1:
                shown = [{"name": named.name, **usage} for named, _, usage in usages]
            self.stdout.write(json.dumps(shown, indent=2, default=_isoformat))
            return
        for named, where, usage in usages:
            self.show(named, where, usage)
        for line in skipped:
            self.stdout.write(line, self.style.WARNING)

    def show(self, named: Named, found: Target, usage: dict[str, Any]) -> None:
        """One limit's heading, table and verdict."""
        self.stdout.write(self.heading(named, found))
        for line in table(usage):
            self.stdout.write(line)
        if usage.get("banned_until") is not None:
            where = " on every path" if usage.get("ban_site") else ""
            self.stdout.write(
                f"Banned{where} until {_isoformat(usage['banned_until'])} (a ban of "
                f"{usage['ban_seconds']} s); ratelimit_reset lifts it.",
                self.style.ERROR,
            )
        elif usage["should_limit"]:
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
    def heading(limit: Named, found: Target) -> str:
        view = f"; @ratelimit on {limit.view}" if limit.view else ""
        text = f"{limit.kind.capitalize()} {limit.name} (key {limit.limit.kind}{view}), "
        text += f"subject {found.value}"
        if len(found.kinds()) > 1:
            text += " (an IP: the requests that had no value for the key and fell back to it)"
        return text + ":"


def _isoformat(value: Any) -> str:
    """A ban's end (a datetime) as JSON and the table write it."""
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="seconds")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
