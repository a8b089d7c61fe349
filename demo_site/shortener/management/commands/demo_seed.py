"""``manage.py demo_seed``: a year of synthetic visits to a few short links (once)."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand

from demo_site.shortener.overrides import seed_overrides
from demo_site.shortener.seed import LINKS, seed


class Command(BaseCommand):
    help = (
        "Create the demo's short links with a year of synthetic visits, written through "
        "record(), flush() and the downsampling, so every retention tier and chart has data. "
        "Adds the rate-limit overrides of docs/overrides.rst. Does nothing when the demo data "
        "is already there."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        started = time.monotonic()
        if seed_overrides():
            self.stdout.write("Added the rate-limit overrides of docs/overrides.rst.")
        result = seed(LINKS)
        keys = ", ".join(f"/s/{key}" for key in result.links)
        if not result.created:
            self.stdout.write(f"Demo data already seeded ({keys}): nothing to do.")
            return
        self.stdout.write(
            self.style.SUCCESS(
                f"Seeded {len(result.links)} links ({keys}) with a year of visits: "
                f"{result.visits:,} visits in {result.records:,} buckets, "
                f"in {time.monotonic() - started:.1f} s."
            )
        )
        folded = result.downsample
        if folded is not None and folded.skipped:
            self.stdout.write(
                "The downsample lock was held by another run: the Celery worker will fold "
                "the old buckets on its next run."
            )
        elif folded is not None:
            self.stdout.write(
                f"Downsampled: {folded.folded:,} buckets folded into coarser tiers, "
                f"{folded.expired:,} expired."
            )
