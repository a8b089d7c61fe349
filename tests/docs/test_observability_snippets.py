"""docs/observability.rst's set-ups, run as printed.

Each runs where a project runs it: OpenTelemetry's global meter provider can be set once per
process, so the two OpenTelemetry set-ups run in a process of their own, configured with the
test settings plus what the page sets. The proofs:

* OpenTelemetry to Prometheus (block 0): after ``get_wsgi_application()``, the page's exporter
  serves a scrape holding the limiter's decisions under the name of the page's instruments
  table, with the right counts, and ``promtool check metrics`` accepts it;
* gunicorn's ``child_exit`` (block 1): a dead worker's live gauge files are removed, so the
  buffered keys of the living workers alone add up in a multiprocess scrape;
* OTLP over HTTP (block 2): a collector (a tiny HTTP server of the test) receives, on
  ``/v1/metrics``, the decisions' counter with the right counts;
* the bearer-token view (block 3): a request without the token, or with a wrong one, is
  refused; the scraper's token gets the exposition.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.test import Client, RequestFactory, override_settings
from django.urls import path
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from ratelimit_app.core import get_usage
from tests.conftest import start_or_skip
from tests.docs.snippets import ROOT, Snippet, snippet
from tests.servers import free_port, require_binary

RUNS: list[tuple[str, int]] = [
    ("observability", 0),
    ("observability", 1),
    ("observability", 2),
    ("observability", 3),
]

#: The instrument of the decisions, as the page's table names it.
REQUESTS = "bucketry_ratelimit_requests_total"
#: Three requests of one address under "2/m": two admitted, one refused.
DECISIONS = {"admitted": 2, "refused": 1}

#: What each process below starts with: Django configured with the test settings plus the
#: settings a block prints, and the decisions of a limit.
PRELUDE = '''
import json
import os
import sys


def configure(code: str, where: str) -> None:
    """The test settings, plus what ``code`` (a settings.py part) sets."""
    from django.conf import settings

    import tests.settings as base

    values = {name: getattr(base, name) for name in dir(base) if name.isupper()}
    exec(compile(code, where, "exec"), values)
    settings.configure(**{name: v for name, v in values.items() if name.isupper()})


def decide(group: str) -> None:
    """Three requests of one address through a "2/m" limit: admitted, admitted, refused."""
    from django.test import RequestFactory

    from ratelimit_app.core import get_usage

    for _ in range(3):
        request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.9")
        get_usage(request, group=group, key="ip", rate="2/m", increment=True)


def forget_buffered() -> None:
    """The refusal counted as a metric has no database here: no final flush to fail."""
    from metrics_app import buffer

    buffer.reset()


job = json.loads(sys.argv[1])
'''

#: Block 0: settings part, ``get_wsgi_application()``, the wsgi part, decisions, a scrape.
PROMETHEUS_EXPORT = (
    PRELUDE
    + """
import urllib.request

configure(job["settings"], job["where"])
from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
exec(compile(job["wsgi"], job["where"], "exec"), {"__name__": "wsgi"})
decide("docs-otel")
with urllib.request.urlopen(f"http://127.0.0.1:{job['port']}/metrics", timeout=10) as scrape:
    sys.stdout.write(scrape.read().decode())
forget_buffered()
"""
)

#: Block 2: Django started, then the block, decisions, and wait (the reader exports every
#: OTEL_METRIC_EXPORT_INTERVAL) until the test closes stdin.
OTLP_EXPORT = (
    PRELUDE
    + """
configure('RATELIMIT_TELEMETRY = "otel"', "<the test>")
import django

django.setup()
exec(compile(job["code"], job["where"], "exec"), {"__name__": "settings"})
decide("docs-otlp")
forget_buffered()
sys.stdin.read()
"""
)

#: A gunicorn worker of block 1's set-up, its gauges written by a flush: its database is
#: unreachable (no tables here), so its counts stay buffered and its gauges say how many.
WORKER = (
    PRELUDE
    + """
configure('RATELIMIT_TELEMETRY = "prometheus"', "<the test>")
import django

django.setup()
import metrics_app

for i in range(job["keys"]):
    metrics_app.record(f"worker:{i}")
assert metrics_app.flush(raise_errors=False) is None, "the flush was meant to fail"
forget_buffered()
print(os.getpid())
"""
)

#: gunicorn's arbiter with block 1's gunicorn.conf.py, told that a worker exited.
ARBITER = """
import json
import sys
from types import SimpleNamespace

job = json.loads(sys.argv[1])
conf = {"__name__": "gunicorn.conf"}
exec(compile(job["code"], job["where"], "exec"), conf)
conf["child_exit"](SimpleNamespace(), SimpleNamespace(pid=job["pid"]))
"""


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without OpenTelemetry's and prometheus-client's variables
    (a developer's own would redirect the exports), plus ``extra``."""
    kept = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_") and k.upper() != "PROMETHEUS_MULTIPROC_DIR"
    }
    kept.pop("DJANGO_SETTINGS_MODULE", None)
    return {**kept, "PYTHONPATH": str(ROOT), **extra}


def python(script: str, job: dict[str, Any], env: dict[str, str]) -> str:
    """Run ``script`` with ``job`` in a new interpreter; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(job)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def aligned(block: Snippet, part: str) -> str:
    """``part`` of ``block``, preceded by blank lines so that its lines keep their numbers."""
    before = block.code[: block.code.index(part)]
    return "\n" * before.count("\n") + part


def decisions(samples: list[tuple[dict[str, str], float]], limit: str) -> dict[str, float]:
    return {labels["decision"]: value for labels, value in samples if labels["limit"] == limit}


# -- block 0: OpenTelemetry to Prometheus --------------------------------------------------


@pytest.fixture(scope="module")
def otel_scrape() -> str:
    """The page's set-up run on a free port, three decisions made: what its exporter serves."""
    block = snippet("observability", 0, 'RATELIMIT_TELEMETRY = "otel"', "start_http_server(9464)")
    settings_part, mark, wsgi_part = block.code.partition("# wsgi.py")
    assert mark, f"{block.where} no longer marks its wsgi.py part"
    port = free_port()
    wsgi = aligned(block, mark + wsgi_part).replace(
        "start_http_server(9464)", f"start_http_server({port})"
    )
    return python(
        PROMETHEUS_EXPORT,
        {"settings": settings_part, "wsgi": wsgi, "where": block.where, "port": port},
        environment(),
    )


def test_the_opentelemetry_prometheus_exporter_serves_the_decisions(otel_scrape: str) -> None:
    """The scrape counts the decisions under the instruments table's name, once."""
    families = {f.name: f for f in text_string_to_metric_families(otel_scrape)}
    counter = families.get(REQUESTS.removesuffix("_total"))
    assert counter is not None, f"no {REQUESTS} in the scrape:\n{otel_scrape}"
    assert counter.type == "counter"
    samples = [(s.labels, s.value) for s in counter.samples if s.name == REQUESTS]
    assert decisions(samples, "docs-otel") == DECISIONS
    # "otel" alone: one set of instruments, so each name has one HELP line.
    assert otel_scrape.count(f"# HELP {REQUESTS} ") == 1


def test_promtool_accepts_the_opentelemetry_scrape(otel_scrape: str) -> None:
    """``promtool check metrics`` finds the exporter's scrape valid."""
    promtool = start_or_skip(lambda: require_binary("promtool"))
    checked = subprocess.run(
        [promtool, "check", "metrics"],
        input=otel_scrape,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


# -- block 1: gunicorn's child_exit ---------------------------------------------------------


def buffered_keys(directory: Path) -> float | None:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return registry.get_sample_value("bucketry_metrics_buffered_keys")


def test_child_exit_drops_a_dead_workers_live_gauges(tmp_path: Path) -> None:
    """Two workers buffer 2 and 3 keys; once gunicorn reports the first one exited, the
    scrape adds up the living one's alone. Counters of the dead worker stay."""
    directory = tmp_path / "bucketry-prom"
    directory.mkdir()
    env = environment(PROMETHEUS_MULTIPROC_DIR=str(directory))
    gone, living = (int(python(WORKER, {"keys": keys}, env)) for keys in (2, 3))
    for pid in (gone, living):
        for mode in ("livesum", "livemax"):
            assert (directory / f"gauge_{mode}_{pid}.db").exists()
    assert buffered_keys(directory) == 5
    block = snippet("observability", 1, "def child_exit(server, worker)", "mark_process_dead")
    python(ARBITER, {"code": block.code, "where": block.where, "pid": gone}, env)
    assert not list(directory.glob(f"gauge_live*_{gone}.db"))
    assert len(list(directory.glob(f"gauge_live*_{living}.db"))) == 2
    assert (directory / f"counter_{gone}.db").exists()
    assert buffered_keys(directory) == 3


# -- block 2: OTLP over HTTP ----------------------------------------------------------------


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP collector that keeps what it is sent: ``(path, content type, body)``."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Receive)
        self.posts: list[tuple[str, str, bytes]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Receive(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.posts.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def exported(body: bytes, name: str, limit: str) -> tuple[bool, dict[str, int]]:
    """Whether the export ``body`` holds the monotonic sum ``name``, and its values for
    ``limit`` by decision."""
    request = ExportMetricsServiceRequest.FromString(body)
    found, values = False, {}
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if scope.scope.name != "bucketry" or metric.name != name:
                    continue
                found = metric.HasField("sum") and metric.sum.is_monotonic
                for point in metric.sum.data_points:
                    labels = {a.key: a.value.string_value for a in point.attributes}
                    if labels.get("limit") == limit:
                        values[labels["decision"]] = point.as_int
    return found, values


def test_otlp_over_http_reaches_the_collector(collector: Collector) -> None:
    """The page's reader and exporter, configured by the environment, after Django has
    started: the collector receives the decisions' counter on /v1/metrics."""
    block = snippet("observability", 2, "OTLPMetricExporter()", "PeriodicExportingMetricReader")
    env = environment(
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint, OTEL_METRIC_EXPORT_INTERVAL="200"
    )
    job = json.dumps({"code": block.code, "where": block.where})
    process = subprocess.Popen(
        [sys.executable, "-c", OTLP_EXPORT, job],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    counts: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 20
        while counts != DECISIONS and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            for _, _, body in list(collector.posts):
                found, values = exported(body, REQUESTS, "docs-otlp")
                counts = values if found else counts
    finally:
        _, errors = process.communicate("", timeout=30)
    assert process.returncode == 0, errors
    assert counts == DECISIONS, (counts, errors)
    paths = {(p, kind) for p, kind, _ in collector.posts}
    assert paths == {("/v1/metrics", "application/x-protobuf")}


# -- block 3: the view behind a bearer token -------------------------------------------------

TOKEN = "scrape-8c1e0f4b2d"


def token_view() -> ModuleType:
    """A URLconf with the page's view at /metrics."""
    block = snippet("observability", 3, "def metrics(request)", "hmac.compare_digest")
    names: dict[str, Any] = {"__name__": "docs_snippet"}
    exec(compile(block.code, block.where, "exec"), names)
    urlconf = ModuleType("docs_snippet_urls")
    urlconf.urlpatterns = [path("metrics", names["metrics"])]  # type: ignore[attr-defined]
    return urlconf


@override_settings(METRICS_SCRAPE_TOKEN=TOKEN)
def test_the_scrape_token_guards_the_view() -> None:
    """No token or a wrong one: 403. The scraper's token: 200, the decisions made."""
    sample = (REQUESTS, {"limit": "docs-scrape", "decision": "admitted"})
    before = REGISTRY.get_sample_value(*sample) or 0.0
    request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.10")
    get_usage(request, group="docs-scrape", key="ip", rate="100/m", increment=True)
    with override_settings(ROOT_URLCONF=token_view()):
        client = Client()
        assert client.get("/metrics").status_code == 403
        for wrong in (f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", f"Basic {TOKEN}"):
            answer = client.get("/metrics", headers={"Authorization": wrong})
            assert answer.status_code == 403, wrong
            assert REQUESTS not in answer.content.decode()
        answer = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(answer.content.decode())}
    samples = [
        (s.labels, s.value)
        for s in families[REQUESTS.removesuffix("_total")].samples
        if s.name == REQUESTS
    ]
    assert decisions(samples, "docs-scrape")["admitted"] == before + 1


@override_settings(METRICS_SCRAPE_TOKEN=TOKEN)
def test_a_token_outside_ascii_is_refused() -> None:
    """A header the client chose with a non-ASCII character is a 403, not a server error
    (a WSGI server decodes headers as Latin-1)."""
    with override_settings(ROOT_URLCONF=token_view()):
        answer = Client().get("/metrics", headers={"Authorization": "Bearer caf\u00e9"})
    assert answer.status_code == 403
