"""A short link: a random key and the URL it redirects to."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

#: Longest URL accepted (browsers and servers handle 2,000 characters everywhere).
MAX_URL_LENGTH = 2000
#: Longest key stored (generated keys are shorter: :data:`demo_site.shortener.keys.LENGTH`).
MAX_KEY_LENGTH = 32


class Link(models.Model):
    """``/s/<key>`` redirects to ``url``; each redirect served counts in ``shorturl:<key>``."""

    key = models.CharField(max_length=MAX_KEY_LENGTH, unique=True)
    url = models.URLField(max_length=MAX_URL_LENGTH)
    created = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    #: Made by ``manage.py demo_seed`` with a year of synthetic visits (also its "done" mark).
    seeded = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"/s/{self.key} -> {self.url}"

    @property
    def series_name(self) -> str:
        """The metrics series of this link's visits."""
        return series_name(self.key)


def series_name(key: str) -> str:
    """``shorturl:<key>``: the series a short key's redirects are counted in."""
    return f"shorturl:{key}"
