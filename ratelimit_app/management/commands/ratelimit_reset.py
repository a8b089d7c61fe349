"""``manage.py ratelimit_reset <rule> <subject>``: clear a subject's counters of one limit."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from ratelimit_app.management.base import (
    LimitCommand,
    backend_errors,
    targets,
)
from ratelimit_app.operators.operations import reset


class Command(LimitCommand):
    help = """\
Clear a subject's counters of a rate limit: every window of every rate starts again from
zero, so a locked-out user or client is admitted on the next request. Other subjects and
other limits are untouched.

Examples:
  manage.py ratelimit_reset login-email alice@example.com
  manage.py ratelimit_reset api 203.0.113.7
  manage.py ratelimit_reset accounts:login 203.0.113.7
  manage.py ratelimit_reset /api/send/ 42
  manage.py ratelimit_reset accounts.views.login 203.0.113.7 --key ip --rate 5/m --method POST
"""
    verb = "clear"

    def handle(self, *args: Any, **options: Any) -> None:
        subject = options["subject"]
        found, skipped = targets(self.limits(options), subject)
        for named, where in found:
            with backend_errors():
                done = reset(named.limit, subject)
            if not done:  # found above: cannot happen unless the settings changed meanwhile
                raise CommandError(f"No counters found for {subject!r}.")
            if options["verbosity"] >= 1:
                self.stdout.write(f"Reset {where.value} for {named}.", self.style.SUCCESS)
        if options["verbosity"] >= 1:
            for line in skipped:
                self.stdout.write(line, self.style.WARNING)
