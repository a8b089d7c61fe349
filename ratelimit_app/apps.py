from __future__ import annotations

from django.apps import AppConfig, apps
from django.utils.translation import gettext_lazy as _


class RatelimitAppConfig(AppConfig):
    name = "ratelimit_app"
    verbose_name = _("Rate limits")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from ratelimit_app import checks  # noqa: F401  (registers the system checks)
        from ratelimit_app.models import AccessEntry, Ban, Override, Rule
        from ratelimit_app.store import bump
        from ratelimit_app.telemetry import connect as connect_exporters

        def changed(**kwargs: object) -> None:
            bump()

        # weak=False: ``changed`` is local to ready().
        for model in (Rule, AccessEntry, Override, Ban):
            uid = f"ratelimit_app.{model.__name__}"
            post_save.connect(changed, sender=model, weak=False, dispatch_uid=uid + ".save")
            post_delete.connect(changed, sender=model, weak=False, dispatch_uid=uid + ".delete")
        connect_exporters()  # when their extra is installed
        if apps.is_installed("metrics_app"):
            from ratelimit_app.metrics import connect

            connect()
