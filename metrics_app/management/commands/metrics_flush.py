from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from metrics_app import buffer
from metrics_app.conf import conf


class Command(BaseCommand):
    help = (
        "Flush buffered metrics to the database: this process's buffer and, with "
        "METRICS_BUFFER = 'redis', the shared Redis buffer."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        written = buffer.flush() or 0
        if conf.BUFFER == "redis":
            from metrics_app import redis_buffer

            written += redis_buffer.flush()
        self.stdout.write(f"Flushed {written} (series, minute) keys.")
