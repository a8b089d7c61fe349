"""Celery tasks, the beat schedule, and how a web request sends a task.

Wire them into your Celery app once its configuration is read (``docs/celery.rst``,
"Wiring"; the demo's ``demo_site/celery.py`` does the same)::

    @app.on_after_configure.connect
    def add_metrics_schedule(sender, **kwargs):
        from metrics_app.tasks import beat_schedule

        sender.conf.beat_schedule = {**sender.conf.beat_schedule, **beat_schedule()}

Every task is also a plain function: ``downsample()`` runs in-process.

A web request never waits on the broker: :data:`publisher` sends the read-triggered
``downsample_series`` from a background thread (:class:`Publisher` says why and how).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from celery import shared_task

from metrics_app.conf import conf

logger = logging.getLogger("metrics_app")

#: Downsample every 5 minutes; drain the Redis buffer every 10 seconds.
BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    "metrics-downsample": {"task": "metrics_app.downsample", "schedule": 300.0},
    "metrics-flush-redis-buffer": {"task": "metrics_app.flush_redis_buffer", "schedule": 10.0},
}


def beat_schedule() -> dict[str, dict[str, Any]]:
    """:data:`BEAT_SCHEDULE`, without the Redis flush unless ``METRICS_BUFFER = "redis"``."""
    schedule = {k: dict(v) for k, v in BEAT_SCHEDULE.items()}
    if conf.BUFFER != "redis":
        schedule.pop("metrics-flush-redis-buffer")
    return schedule


@shared_task(name="metrics_app.downsample")
def downsample() -> dict[str, Any]:
    """Fold and expire everything due, for every series (one run at a time)."""
    from metrics_app import rollup

    return rollup.downsample().as_dict()


@shared_task(name="metrics_app.downsample_series")
def downsample_series(name: str) -> dict[str, Any]:
    """Fold and expire everything due for one series (sent by queries that find it due)."""
    from metrics_app import rollup

    return rollup.downsample(series_names=[name]).as_dict()


@shared_task(name="metrics_app.flush_redis_buffer")
def flush_redis_buffer() -> int:
    """Drain the shared Redis buffer into the database; returns the keys written."""
    from metrics_app.buffer import shared

    return shared.flush()


#: Longest a publish from a web process may take to connect and to hear back, in seconds.
PUBLISH_TIMEOUT = 2.0
#: After a publish failed, sends from web requests are skipped for this many seconds.
BROKER_RETRY = 60.0
#: Options that bound a publish whatever the transport: no reconnection retries (kombu
#: otherwise retries for seconds), and the socket timeouts of Redis (``socket_*``) and of
#: AMQP (``read_timeout``, ``write_timeout``; its handshake waits ``connect_timeout``).
#: Each transport ignores the options that are not its own.
BOUNDED: dict[str, Any] = {
    "max_retries": 0,
    "socket_connect_timeout": PUBLISH_TIMEOUT,
    "socket_timeout": PUBLISH_TIMEOUT,
    "read_timeout": PUBLISH_TIMEOUT,
    "write_timeout": PUBLISH_TIMEOUT,
}


class Publisher:
    """Sends tasks for web requests without ever making a request wait on the broker.

    A read that finds stale buckets asks for a downsample, and that read may serve a page;
    the broker may be down, silent or Celery's default (kombu retries for seconds). So
    :meth:`send` publishes from a daemon thread, one at a time, with short timeouts and no
    retries (:data:`BOUNDED`), and skips sends for :data:`BROKER_RETRY` seconds after a
    failure: the beat's ``metrics_app.downsample`` does the same work anyway. The first
    failure per broker is a WARNING (password masked), later ones DEBUG.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything: nothing in flight, nothing failed, nothing logged (a forked
        child starts so, and tests)."""
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._retry_at = 0.0
        self._warned: set[str] = set()

    def send(self, task: Any, args: tuple[Any, ...]) -> bool:
        """Publish ``task`` with ``args`` from the background; False when skipped."""
        # The app is resolved here, in the request's thread: Celery's current app is
        # per thread, and the background thread has none of its own.
        app, name = task.app, task.name
        with self._lock:
            busy = self._thread is not None and self._thread.is_alive()
            if busy or time.monotonic() < self._retry_at:
                return False
            thread = threading.Thread(
                target=self._publish, args=(app, name, args), name="metrics-publish", daemon=True
            )
            self._thread = thread
        thread.start()
        return True

    def join(self, timeout: float | None = None) -> None:
        """Wait for the publish in flight, if any (for tests and shutdown)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _publish(self, app: Any, name: str, args: tuple[Any, ...]) -> None:
        url = str(app.conf.broker_url)
        try:
            with app.connection_for_write(
                connect_timeout=PUBLISH_TIMEOUT, transport_options=BOUNDED
            ) as connection:
                url = connection.as_uri()  # the password masked
                app.tasks[name].apply_async(
                    args, connection=connection, retry=False, ignore_result=True
                )
        except Exception as exc:  # anything the transport raises: never out of the thread
            self._failed(name, url, exc)

    def _failed(self, name: str, url: str, exc: Exception) -> None:
        with self._lock:
            self._retry_at = time.monotonic() + BROKER_RETRY
            first = url not in self._warned
            self._warned.add(url)
        logger.log(
            logging.WARNING if first else logging.DEBUG,
            "metrics: could not send %s to the Celery broker %s (%s: %s); web requests skip "
            "sending for %d s (logged once per process: is CELERY_BROKER_URL set, and does "
            "the project's __init__.py import its Celery app?)",
            name,
            url,
            type(exc).__name__,
            exc,
            BROKER_RETRY,
        )


#: The publisher of this process.
publisher = Publisher()
os.register_at_fork(after_in_child=publisher.reset)
