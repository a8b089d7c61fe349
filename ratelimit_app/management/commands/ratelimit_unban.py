"""``manage.py ratelimit_unban <limit> <subject>``: lift a subject's ban by one limit."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError

from ratelimit_app.management.base import LimitCommand, backend_errors, targets
from ratelimit_app.management.commands.ratelimit_bans import subject_of
from ratelimit_app.operators.operations import unban


class Command(LimitCommand):
    help = """\
Lift a subject's ban by a limit (and its ban on every path, for an address), in every process
within a second, and forget its earlier bans: the next ban is a first one. Its counters are
kept: it is admitted again as the limit's rate allows (ratelimit_reset clears them as well).
ratelimit_bans lists the bans in force.

Examples:
  manage.py ratelimit_unban login-ip 203.0.113.7
  manage.py ratelimit_unban scan 2001:db8::1
  manage.py ratelimit_unban accounts:login 203.0.113.7
"""
    verb = "lift"
    what = "ban"

    def handle(self, *args: Any, **options: Any) -> None:
        found, skipped = targets(self.limits(options), options["subject"])
        said = []
        for named, _ in found:
            try:
                with backend_errors():
                    held, lifted = unban(named.limit, options["subject"])
            except DatabaseError as exc:
                raise CommandError(f"the bans could not be read: {exc}") from exc
            for row in held:
                said.append(
                    f"Lifted the ban of {subject_of(row)} ({row.kind}"
                    f"{', on every path' if row.site else ''}) by {named}, "
                    f"until {row.until:%Y-%m-%d %H:%M:%S} UTC."
                )
            if lifted and not held:
                said.append(
                    f"No ban by {named} was in force; its memory of earlier ones is forgotten "
                    "(the next ban is a first one)."
                )
        if not said:
            names = ", ".join(str(named) for named, _ in found)
            raise CommandError(
                f"No ban of this subject by {names} is in force or remembered; "
                "ratelimit_bans lists the bans in force."
            )
        if options["verbosity"] >= 1:
            for line in said:
                self.stdout.write(line, self.style.SUCCESS)
            for line in skipped:
                self.stdout.write(line, self.style.WARNING)
