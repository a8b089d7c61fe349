from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from metrics_app import rollup


class Command(BaseCommand):
    help = (
        "Fold metric buckets that outlived their retention tier into the next tier and "
        "delete expired ones (what the Celery task metrics_app.downsample does)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--series", action="append", help="Only this series (repeatable).")
        parser.add_argument("--batch-size", type=int, help="Rows per transaction.")

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = options["verbosity"]

        def progress(message: str) -> None:
            if verbosity >= 1:
                self.stdout.write(message)

        result = rollup.downsample(
            series_names=options["series"], batch_size=options["batch_size"], progress=progress
        )
        if result.skipped:
            raise CommandError("Another downsample run holds the lock; try again later.")
        self.stdout.write(
            self.style.SUCCESS(
                f"Folded {result.folded} buckets and expired {result.expired} "
                f"in {result.batches} batches."
            )
        )
