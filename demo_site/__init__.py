"""A small Django project that shows django-bucketry at work (``make demo``).

The Celery app is imported here, as Celery's Django guide does, so that it is the current
app of every process of the site: the web server's queries send ``downsample_series``
through the demo's broker, not Celery's default one.
"""

from __future__ import annotations

from demo_site.celery import app as celery_app

__all__ = ["celery_app"]
