"""No web request waits on the Celery broker.

Opening a chart whose series has stale fine buckets asks for ``downsample_series``
(``query.DOWNSAMPLE_ON_READ``, on by default). Here the broker does not answer: its port is closed,
or a socket listens and never replies (AMQP and Redis). The page still answers at once, and
the failure is logged once, naming the broker with its password masked.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterator

import pytest
from celery import Celery, _state
from django.core.cache import caches
from django.test import Client
from django.urls import reverse

import metrics_app
from metrics_app import query
from metrics_app.models import Series
from metrics_app.tasks import BROKER_RETRY, PUBLISH_TIMEOUT, publisher
from metrics_app.testing import FrozenClock

pytestmark = pytest.mark.django_db

DAY = 86400


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never says a word."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield server.getsockname()[1]


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on: connections are refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


BROKERS = {
    "closed-port": "redis://:s3cret@127.0.0.1:{closed}/0",
    "silent-amqp": "amqp://guest:s3cret@127.0.0.1:{silent}//",
    "silent-redis": "redis://:s3cret@127.0.0.1:{silent}/0",
}


@contextlib.contextmanager
def current_app(broker: str) -> Iterator[Celery]:
    """A Celery app on ``broker``, current in this thread (the request runs in this thread,
    as under runserver or gunicorn), with a fresh publisher."""
    app = Celery("dead-broker", broker=broker, set_as_current=False)
    before = _state._tls.current_app
    app.set_current()
    publisher.reset()
    try:
        yield app
    finally:
        publisher.join(PUBLISH_TIMEOUT * 3)
        publisher.reset()
        _state._set_current_app(before)
        app.close()


@pytest.fixture(params=BROKERS)
def dead_broker(
    request: pytest.FixtureRequest, closed_port: int, silent_port: int
) -> Iterator[str]:
    """The broker URL of the current Celery app, which does not answer."""
    url = BROKERS[request.param].format(closed=closed_port, silent=silent_port)
    with current_app(url):
        yield url


def stale_series(clock: FrozenClock, name: str) -> Series:
    """A series with minute buckets older than the finest tier keeps them: a query of it
    asks for a downsample."""
    caches["default"].delete(f"metrics_app:scheduled:{name}")  # asked at most once a minute
    metrics_app.record(name, 3, at=clock.t - 3 * DAY)
    metrics_app.record(name, 1, at=clock.t - 60)
    metrics_app.flush()
    return Series.objects.get(name=name)


def test_a_chart_never_waits_on_a_broker_that_does_not_answer(
    dead_broker: str,
    clock: FrozenClock,
    admin_client: Client,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(query, "DOWNSAMPLE_ON_READ", True)  # (the tests' default is off)
    caplog.set_level(logging.DEBUG, logger="metrics_app")
    for attempt in range(3):
        name = f"broker:stale-{attempt}"
        series = stale_series(clock, name)
        url = reverse("admin:metrics_app_series_change", args=[series.pk]) + "?period=7d"
        started = time.perf_counter()
        answer = admin_client.get(url)
        elapsed = time.perf_counter() - started
        assert answer.status_code == 200
        assert elapsed < 0.5, f"the chart took {elapsed:.2f} s"
        assert caches["default"].get(f"metrics_app:scheduled:{name}") == 1  # it did ask
        publisher.join(PUBLISH_TIMEOUT * 3)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    said = warnings[0].getMessage()
    assert (
        "metrics_app.downsample_series" in said
        and f"skip sending for {BROKER_RETRY:.0f} s" in said
    )
    assert "s3cret" not in said
    assert dead_broker.replace("s3cret", "**") in said


def test_a_failure_after_the_pause_is_not_logged_again(
    dead_broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    from metrics_app.tasks import downsample_series

    caplog.set_level(logging.DEBUG, logger="metrics_app")
    for _ in range(2):
        assert publisher.send(downsample_series, ("any",))
        publisher.join(PUBLISH_TIMEOUT * 3)
        assert not publisher.send(downsample_series, ("any",))  # paused after a failure
        publisher._retry_at = 0.0  # the pause is over
    levels = [r.levelno for r in caplog.records if "could not send" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG]


def test_a_send_is_skipped_while_one_is_in_flight(silent_port: int) -> None:
    """A broker that takes its time holds one background thread, never a request."""
    from metrics_app.tasks import downsample_series

    with current_app(f"amqp://127.0.0.1:{silent_port}//"):
        started = time.perf_counter()
        sent = [publisher.send(downsample_series, (str(i),)) for i in range(5)]
        assert time.perf_counter() - started < 0.2
        assert sent == [True, False, False, False, False]
