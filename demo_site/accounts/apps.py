"""App configuration of the demo's accounts."""

from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "demo_site.accounts"
    label = "accounts"
    verbose_name = "Accounts (demo)"
