"""WSGI entry point of the gunicorn site (``gunicorn tests.reliability.site_wsgi``)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.reliability.site_settings")

application = get_wsgi_application()

# A shorter refusal memory than the constant's 5 s, so test_scale waits less for it to end.
from ratelimit_app.engine.refusals import remembered as memory  # noqa: E402
from tests.reliability.clients import REFUSAL_MEMORY  # noqa: E402

memory.REFUSAL_MEMORY = REFUSAL_MEMORY

# The metrics flusher's interval the test asks for (RELIABILITY_FLUSH_INTERVAL), else 10 s.
from metrics_app.buffer import flusher  # noqa: E402

flusher.FLUSH_INTERVAL = float(os.environ.get("RELIABILITY_FLUSH_INTERVAL", "10"))
