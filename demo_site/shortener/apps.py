"""App configuration of the demo's URL shortener."""

from __future__ import annotations

from django.apps import AppConfig


class ShortenerConfig(AppConfig):
    name = "demo_site.shortener"
    label = "shortener"
    verbose_name = "URL shortener (demo)"
