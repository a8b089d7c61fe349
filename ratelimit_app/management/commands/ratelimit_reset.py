"""``manage.py ratelimit_reset <rule> <subject>``: clear a subject's counters of one limit."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from ratelimit_app.management.base import LimitCommand, backend_errors, limit_from_options
from ratelimit_app.operations import reset


class Command(LimitCommand):
    help = """\
Clear a subject's counters of a rate limit: every window of every rate starts again from
zero, so a locked-out user or client is admitted on the next request. Other subjects and
other limits are untouched.

Examples:
  manage.py ratelimit_reset login-email alice@example.com
  manage.py ratelimit_reset api 203.0.113.7
  manage.py ratelimit_reset accounts.views.login 203.0.113.7 --key ip --rate 5/m --method POST
"""
    verb = "clear"

    def handle(self, *args: Any, **options: Any) -> None:
        limit = limit_from_options(options)
        found = limit.find(options["subject"])
        with backend_errors():
            done = limit.apply(reset, options["subject"])
        if not done:  # found above: cannot happen unless the settings changed meanwhile
            raise CommandError(f"No counters found for {options['subject']!r}.")
        if options["verbosity"] >= 1:
            self.stdout.write(f"Reset {found.value} for {limit}.", self.style.SUCCESS)
