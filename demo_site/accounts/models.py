"""A message on the demo's board."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

MAX_MESSAGE_LENGTH = 500


class Message(models.Model):
    """A short text a signed-in user posted (one a second at most: the ``send-message`` rule)."""

    sender = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    text = models.CharField(max_length=MAX_MESSAGE_LENGTH)
    sent = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-sent", "-id"]

    def __str__(self) -> str:
        return f"{self.sender}: {self.text[:40]}"
