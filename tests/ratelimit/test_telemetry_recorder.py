"""OpenTelemetry's round-trip histogram is recorded by a thread of each process, which the
OpenTelemetry sink starts: a project process that never calls ``record_queued()`` still
exports ``bucketry_ratelimit_backend_seconds``, and so does a worker forked after start-up
(gunicorn ``--preload``).

Run in a fresh interpreter, as a project runs, so that nothing a test of this process did
(another test recording the queue by hand) can stand in for the thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROJECT = textwrap.dedent(
    """
    import json, os, sys, threading, time, uuid

    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()  # connects the exporters, as a project's start does

    # The project sets its SDK after Django has started (docs/observability.rst).
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    from django.test import RequestFactory, override_settings

    from ratelimit_app.backends import reset_backends
    from ratelimit_app.core import get_usage
    from ratelimit_app.operators.telemetry import BACKEND_SECONDS

    def recorded():
        data = reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if sm.scope.name == "bucketry" and m.name == BACKEND_SECONDS:
                        return sum(
                            p.count for p in m.data.data_points
                            if dict(p.attributes) == {"backend": "memcached"}
                        )
        return 0

    def checks(n, expected):
        group = "first-day-" + uuid.uuid4().hex
        request = RequestFactory().get("/")
        for _ in range(n):
            get_usage(request, group=group, key="ip", rate="1000/m", increment=True)
        deadline = time.monotonic() + 4
        while recorded() < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"recorded": recorded(), "threads": sorted(t.name for t in threading.enumerate())}

    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "rl": {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": sys.argv[1],
        },
    }
    with override_settings(CACHES=caches, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        found = {"parent": checks(19, 19)}
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a worker forked after start-up: its own thread, its own queue
            reset_backends()
            os.write(write, json.dumps(checks(5, 19 + 5)).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        found["child"] = json.loads(os.read(read, 65536))
    print(json.dumps(found))
    """
)


def test_round_trips_reach_opentelemetry_without_a_call_in_each_process(
    memcached_server: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROJECT, memcached_server],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["parent"]["recorded"] == 19, found
    assert "bucketry-otel" in found["parent"]["threads"], found
    # The child's SDK holds its parent's 19 (a copy of its memory) and its own 5.
    assert found["child"]["recorded"] == 19 + 5, found
    assert "bucketry-otel" in found["child"]["threads"], found
