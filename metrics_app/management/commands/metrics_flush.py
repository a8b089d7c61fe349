"""``manage.py metrics_flush``: write buffered counts to the database now.

It matters with the Redis buffer (``METRICS_BUFFER = "redis"``), which every process shares:
the command drains it, as the beat's ``metrics_app.flush_redis_buffer`` does. With the
memory buffer (the default) each process keeps its own counts and flushes them itself, every
10 seconds (:data:`metrics_app.buffer.flusher.FLUSH_INTERVAL`) and when it exits; this
command can reach only its own (empty) buffer, so it says so rather than leave "Flushed 0"
to be read as "nothing to flush".
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from metrics_app import buffer
from metrics_app.buffer import flusher
from metrics_app.conf import conf


class Command(BaseCommand):
    help = (
        "Drain the Redis buffer (METRICS_BUFFER = 'redis') into the database, with this "
        "process's own buffer. With the memory buffer, every web and worker process flushes "
        "its own counts every 10 seconds: this command cannot reach them."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        written = buffer.flush() or 0
        in_redis = conf.BUFFER == "redis"
        if in_redis:
            from metrics_app.buffer import shared

            written += shared.flush()
        self.stdout.write(f"Flushed {written} (series, minute) keys.")
        if options["verbosity"] >= 1:
            self.stdout.write(explain(in_redis, flusher.FLUSH_INTERVAL))


def explain(shared: bool, interval: float) -> str:
    """What the count covers, and when the counts of other processes reach the database."""
    if shared:
        return (
            'From the Redis buffer every process shares (METRICS_BUFFER = "redis"), which '
            "the Celery beat's metrics_app.flush_redis_buffer drains too."
        )
    if interval > 0:
        when = (
            f"flushes its own buffer every {interval:g} seconds and "
            f"when it exits: what they count reaches the database within {interval:g} "
            "seconds without this command"
        )
    else:
        when = (
            "keeps its own buffer until it calls metrics_app.flush() or exits "
            "(metrics_app.testing.manual_flush() starts no flusher thread)"
        )
    return (
        'Only this command\'s own buffer: with METRICS_BUFFER = "memory", every web and '
        f"worker process {when}. This command matters with the Redis buffer "
        '(METRICS_BUFFER = "redis"), which it drains.'
    )
