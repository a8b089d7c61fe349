"""What the limiter builds from the settings in a process, and the one place that forgets it.

A process keeps what it built from the settings, so that a request reads none of them:
the values read (:mod:`ratelimit_app.conf`), the trusted proxies and the namespaces made
(:mod:`ratelimit_app.identity`), the settings' rules and lists compiled
(:mod:`ratelimit_app.config.declared`), the URL names resolved
(:mod:`ratelimit_app.config.rules`), the counter backends (:mod:`ratelimit_app.backends`),
the configuration in force (:mod:`ratelimit_app.store`), the refusals remembered and the
checks made ready (:mod:`ratelimit_app.engine`), and the templates and translated messages
of the answers (:mod:`ratelimit_app.engine.responses`).

Django's ``setting_changed`` (``override_settings``, pytest-django's ``settings`` fixture)
reaches one receiver, here, which forgets what the changed setting may change, the lowest
layer first: each part is built again, from the new settings, when next used. The app
connects it when it starts (``ratelimit_app.apps``).
"""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ratelimit_app import backends, conf, store
from ratelimit_app.config import declared, rules
from ratelimit_app.engine import memory, responses, sliding_window
from ratelimit_app.identity import addresses, namespaces

__all__ = ["forget"]

#: The settings the answers' templates come from.
TEMPLATE_SETTINGS = frozenset({"TEMPLATES", "INSTALLED_APPS"})
#: The settings the answers' translated messages come from.
LANGUAGE_SETTINGS = frozenset({"LANGUAGE_CODE", "LANGUAGES", "LOCALE_PATHS", "INSTALLED_APPS"})


def forget(setting: str | None = None) -> None:
    """Forget what the limiter built from ``setting`` (None: from every setting), the
    lowest layer first; each part is built again when next used."""
    if setting is None or conf.affects_limiter(setting):
        conf.forget()
        addresses.forget()
        namespaces.forget()
        declared.forget()
        backends.reset_backends()
        store.forget()
        memory.forget()
        sliding_window.forget()
    if setting is None or setting == "ROOT_URLCONF":
        rules.clear_caches()
    if setting is None or setting in TEMPLATE_SETTINGS:
        responses.forget_templates()
    if setting is None or setting in LANGUAGE_SETTINGS:
        responses.forget_messages()


@receiver(setting_changed, dispatch_uid="ratelimit_app.runtime")
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    forget(setting)
