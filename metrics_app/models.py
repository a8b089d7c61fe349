"""Series, their time buckets, and the flush ledger."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import models
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from metrics_app.names import MAX_NAME_LENGTH


class Series(models.Model):
    """A named counter. ``total`` is the all-time count: retention never lowers it."""

    name = models.CharField(_("name"), max_length=MAX_NAME_LENGTH, unique=True)
    total = models.BigIntegerField(_("total"), default=0)
    first_seen = models.DateTimeField(_("first seen"), null=True, blank=True)
    last_seen = models.DateTimeField(_("last seen"), null=True, blank=True)

    class Meta:
        verbose_name = _("series")
        # The same word in English, not in every language ("série", "séries").
        verbose_name_plural = pgettext_lazy("plural", "series")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Bucket(models.Model):
    """``count`` events of ``series`` in ``[start, start + resolution)``.

    ``start`` is Unix seconds (UTC), aligned as :func:`metrics_app.retention.align` says; an
    integer keeps alignment and downsampling plain integer arithmetic on every database.
    """

    series = models.ForeignKey(
        Series, on_delete=models.CASCADE, related_name="buckets", verbose_name=_("series")
    )
    resolution = models.PositiveIntegerField(_("resolution (seconds)"))
    start = models.BigIntegerField(_("start (Unix seconds)"))
    count = models.BigIntegerField(_("count"))

    class Meta:
        verbose_name = _("bucket")
        verbose_name_plural = _("buckets")
        constraints = [
            # The additive upsert's ON CONFLICT target; also serves per-series range reads.
            models.UniqueConstraint(
                fields=["series", "resolution", "start"], name="metrics_bucket_unique"
            ),
        ]
        indexes = [
            # Downsampling scans one resolution for everything older than a cutoff.
            models.Index(fields=["resolution", "start"], name="metrics_bucket_due"),
        ]

    def __str__(self) -> str:
        return f"{self.series_id}@{self.resolution}s:{self.start}={self.count}"

    @property
    def start_datetime(self) -> datetime:
        return datetime.fromtimestamp(self.start, tz=UTC)


class FlushLedger(models.Model):
    """One row per applied flush batch, so a retried batch is never applied twice."""

    flush_id = models.CharField(_("flush id"), max_length=100, unique=True)
    created = models.DateTimeField(_("created"))

    class Meta:
        verbose_name = _("flush ledger entry")
        verbose_name_plural = _("flush ledger")

    def __str__(self) -> str:
        return self.flush_id


class TopKey(models.Model):
    """One of the most frequent keys of a named stream in a time bucket
    (:mod:`metrics_app.topk`): its count (a lower bound: the events counted while a sketch
    held the key), when it was first and last seen, and the caller's ``label`` (what a page
    shows) and ``ref`` (what a page acts on).

    Bounded: each flush keeps the :data:`~metrics_app.topk.CAPACITY` most counted keys of a
    name and bucket, and a row is deleted once ``expires`` has passed."""

    name = models.CharField(_("name"), max_length=MAX_NAME_LENGTH)
    key = models.CharField(_("key"), max_length=100)
    label = models.CharField(_("label"), max_length=200, blank=True)
    ref = models.CharField(_("reference"), max_length=320, blank=True)
    start = models.BigIntegerField(_("start (Unix seconds)"))
    count = models.BigIntegerField(_("count"))
    first_seen = models.DateTimeField(_("first seen"))
    last_seen = models.DateTimeField(_("last seen"))
    expires = models.DateTimeField(_("expires"), db_index=True)

    class Meta:
        verbose_name = _("top key")
        verbose_name_plural = _("top keys")
        constraints = [
            models.UniqueConstraint(fields=["name", "start", "key"], name="metrics_topkey_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.start}:{self.label or self.key}={self.count}"
