"""Cost-weighted hits under concurrency: 4 processes x 8 threads against one client address,
each request of cost 7 at a limit of 200: never more than ``200 // 7 = 28`` admitted.

As the DRF concurrency test does (:func:`bench.claims.drf_throttle.concurrency`), but through
``get_usage(..., cost=7)``: 320 requests (2,240 hits) within a second or two, forked
processes each with its own connections. A request of cost ``c`` adds ``c`` in one atomic
increment a bucket (memcached ``ma ... D7``, Redis ``HINCRBY ... 7``) and a refused one is
taken back by ``c``, so a refused request can only make others wait, never let one more in.
On Redis a check is one transaction, so exactly 28 are admitted; on memcached a check's
increments and read are one pipelined round trip but not one atomic step, so the contract
is "never more than 28". The leaky bucket (one leaking out every 18 s: none within the
test) takes a request of cost 7 as 7 emissions: at a capacity of 200, the same 28.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.test import RequestFactory, override_settings

from ratelimit_app.algorithms.gcra import LEAKY_BUCKET, SLIDING_WINDOW
from ratelimit_app.backends import reset_backends
from ratelimit_app.core import get_usage
from tests.ratelimit.conftest import cache_config

PROCESSES, THREADS, TRIES = 4, 8, 10
LIMIT, COST = 200, 7
#: The sliding window's rate, and the leaky bucket's (its capacity is the count).
RATES = {SLIDING_WINDOW: f"{LIMIT}/m", LEAKY_BUCKET: f"{LIMIT}/h"}


def _admitted(args: tuple[str, str]) -> int:
    """One process: ``THREADS`` threads, ``TRIES`` requests each, started together; the
    number of requests admitted."""
    group, algorithm = args
    reset_backends()  # never share a parent's sockets after fork
    factory = RequestFactory()
    start = threading.Barrier(THREADS)

    def worker(_: int) -> int:
        requests = [factory.get("/", REMOTE_ADDR="192.0.2.77") for _ in range(TRIES)]
        start.wait()
        admitted = 0
        for request in requests:
            usage = get_usage(
                request,
                group,
                key="ip",
                rate=RATES[algorithm],
                increment=True,
                algorithm=algorithm,
                cost=COST,
            )
            assert usage is not None  # None: the backend failed (fail open)
            admitted += not usage["should_limit"]
        return admitted

    with ThreadPoolExecutor(THREADS) as pool:
        return sum(pool.map(worker, range(THREADS)))


@pytest.mark.parametrize("algorithm", [SLIDING_WINDOW, LEAKY_BUCKET])
@pytest.mark.parametrize("kind", ["memcached", "redis"])
def test_never_more_than_the_limit_over_the_cost(
    kind: str,
    algorithm: str,
    request: pytest.FixtureRequest,
    record_property: Callable[[str, object], None],
) -> None:
    config: dict[str, Any] = cache_config(kind, request)
    group = f"cost-concurrency-{algorithm}-{time.time_ns()}"  # no earlier run counted it
    with override_settings(
        CACHES={"default": config, "rl": config},
        RATELIMIT_USE_CACHE="rl",
        RATELIMIT_FAIL_OPEN=True,
    ):
        reset_backends()
        with multiprocessing.get_context("fork").Pool(PROCESSES) as pool:
            admitted = sum(pool.map(_admitted, [(group, algorithm)] * PROCESSES))
        reset_backends()
    record_property("admitted", admitted)
    assert PROCESSES * THREADS * TRIES * COST > 10 * LIMIT  # far more hits than the limit
    if kind == "redis":
        assert admitted == LIMIT // COST == 28
    else:
        assert 0 < admitted <= LIMIT // COST
