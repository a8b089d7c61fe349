from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.apps import AppConfig, apps
from django.utils.translation import gettext_lazy as _


class RatelimitAppConfig(AppConfig):
    name = "ratelimit_app"
    verbose_name = _("Rate limits")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from ratelimit_app import (
            checks,  # noqa: F401  (registers the system checks)
            clock,
            runtime,  # noqa: F401  (forgets what the settings built when they change)
        )
        from ratelimit_app.config.versions import BANS, BANS_DELETED, CONFIG, OVERRIDES, bump
        from ratelimit_app.models import AccessEntry, Ban, Override, Rule
        from ratelimit_app.operators.telemetry import connect as connect_exporters
        from ratelimit_app.operators.telemetry import welcome_saved

        def changed(**kwargs: object) -> None:
            bump(CONFIG)

        def rule_saved(instance: Rule, **kwargs: object) -> None:
            bump(CONFIG)
            welcome_saved(instance.name)  # its series from 0, before its first decision

        def override_saved(**kwargs: object) -> None:
            bump(OVERRIDES)  # every process reads the overrides changed since it looked

        def ban_saved(**kwargs: object) -> None:
            bump(BANS)

        def ban_deleted(instance: Ban, **kwargs: object) -> None:
            # An ended one (pruned) changes nothing in force: the processes read all the
            # bans again only when one in force goes (on the limiter's clock, as bans end).
            if instance.until.timestamp() > clock.now():
                bump(BANS_DELETED)

        # weak=False: the receivers are local to ready().
        receivers: dict[Any, tuple[Callable[..., None], Callable[..., None]]] = {
            Rule: (rule_saved, changed),
            AccessEntry: (changed, changed),
            Override: (override_saved, changed),
            Ban: (ban_saved, ban_deleted),
        }
        for model, (saved, deleted) in receivers.items():
            uid = f"ratelimit_app.{model.__name__}"
            post_save.connect(saved, sender=model, weak=False, dispatch_uid=uid + ".save")
            post_delete.connect(deleted, sender=model, weak=False, dispatch_uid=uid + ".delete")
        connect_exporters()  # when their extra is installed
        if apps.is_installed("metrics_app"):
            from ratelimit_app.operators.metrics import connect

            connect()
