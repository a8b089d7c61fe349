"""demo_site's settings with the Redis metrics buffer, for ``test_demo_site.py``'s second
visit-count case.

demo_site takes every server from the environment (``DATABASE_URL``, ``MEMCACHED_SERVERS``,
``REDIS_URL``, ``DEBUG``, ``ALLOWED_HOSTS``, ``SECRET_KEY``), so every other test of the module
runs ``demo_site.settings`` itself. It has no switch for ``METRICS_BUFFER``, though: its visits
stay in each web process's memory. This module changes that one setting, for the web workers
and the Celery worker alike (metrics_app's beat schedule then drains the buffer every 10 s).
The buffer goes through the django-redis cache ``"default"`` (what ``"redis"`` names), which
demo_site puts on Redis when ``REDIS_URL`` is set.
"""

from __future__ import annotations

from demo_site.settings import *  # noqa: F403 (the demo's settings, as they are)

METRICS_BUFFER = "redis"
