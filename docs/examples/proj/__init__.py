"""The project package: ``proj/__init__.py``.

Importing the Celery app here makes it the app of every process that loads the settings,
web servers included, not only of ``celery -A proj worker``: without it, a web process
sends its tasks to Celery's default broker, ``amqp://guest@localhost//``.
"""

from __future__ import annotations

from .celery import app as celery_app

__all__ = ["celery_app"]
