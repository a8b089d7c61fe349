"""WSGI entry point of the gunicorn site (``gunicorn tests.reliability.site_wsgi``)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.reliability.site_settings")

application = get_wsgi_application()
