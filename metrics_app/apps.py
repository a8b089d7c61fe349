from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class MetricsAppConfig(AppConfig):
    name = "metrics_app"
    verbose_name = _("Metrics")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks. Nothing starts here: the flusher thread, atexit and
        # SIGTERM hooks are installed by the first record() of each process.
        from metrics_app import checks  # noqa: F401
        from metrics_app.buffer import connect_celery_shutdown
        from metrics_app.telemetry import connect as connect_exporters

        connect_celery_shutdown()
        connect_exporters()  # when their extra is installed
