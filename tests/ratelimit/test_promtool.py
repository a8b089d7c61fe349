"""The documented Prometheus path checked by Prometheus's own tool, ``promtool``.

* The alerting rules of docs/observability.rst ("Alerts"), exactly as printed, load
  (``promtool check rules``) and behave (``promtool test rules``): ``RateLimitRefusalSpike``
  fires for a limit that refused nothing yesterday (its refused series there, at 0) and
  refuses 10 a second today, and not for a limit refusing alike both days, one that refuses
  under 1 a second, or one whose refused series did not exist yesterday; the other three
  alerts fire on what they watch. A mutation of the spike's rule (no ``offset 1d``, no
  ``> 1`` floor, no ``for``) fails those unit tests: they can fail.
* The exporter's scrape (:func:`metrics_app.views.prometheus`), after real decisions through
  the middleware and a decorator's group with a hostile name, is an exposition
  ``promtool check metrics`` accepts without a parse error or a lint warning; with
  OpenTelemetry's Prometheus exporter installed, so is the scrape of the documented
  ``RATELIMIT_TELEMETRY = "otel"`` set-up (and ``"auto"``), while ``"both"`` is the invalid
  one the docs warn about.

A missing ``promtool`` (Debian package ``prometheus``) skips these tests, and fails them
under ``CI=true``, as a missing server binary does (:func:`tests.conftest.start_or_skip`).
tests/ratelimit/test_telemetry_series.py keeps its in-Python evaluation of the spike's rule
over what the exporter counts.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path
from prometheus_client.parser import text_string_to_metric_families

from metrics_app.views import prometheus
from ratelimit_app.core import get_usage
from ratelimit_app.operators import telemetry
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.conftest import start_or_skip
from tests.ratelimit.conftest import MIDDLEWARE
from tests.servers import require_binary

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "observability.rst"
T0 = 1_800_000_000.0
_unique = itertools.count()


@pytest.fixture(scope="module")
def promtool() -> str:
    """The path of ``promtool``: a skip when it is missing, a failure under ``CI=true``."""
    return start_or_skip(lambda: require_binary("promtool"))


def run(promtool: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], input=stdin, capture_output=True, text=True, timeout=60
    )


def said(result: subprocess.CompletedProcess[str]) -> str:
    """What promtool printed, for an assertion's message."""
    return f"exit {result.returncode}\n{result.stdout}{result.stderr}"


# -- the alerting rules -----------------------------------------------------------------------


def documented_alerts() -> str:
    """The YAML block of docs/observability.rst's "Alerts" section, dedented, as printed."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("\nAlerts\n------\n") :]
    block = re.search(r"\.\. code-block:: yaml\n\n((?:(?: {3}.*)?\n)+)", section)
    assert block is not None, "no yaml block under Alerts in docs/observability.rst"
    return textwrap.dedent(block.group(1))


#: Unit tests of the documented rules (``alerts.yml`` beside this file), each series a sample a
#: minute. ``0x1440`` is 0 for a day (1,441 samples, minutes 0 to 1440), ``_x1440`` no sample
#: for a day; ``600+600x29`` then rises by 600 a minute, 10 a second, for 30 minutes. At
#: 1d30m the spike's rule compares today's 5 minutes with yesterday's 00:25-00:30.
UNIT_TESTS = """\
rule_files: [alerts.yml]
evaluation_interval: 1m
tests:
  - name: refusal spike, yesterday at 0 or alike
    interval: 1m
    input_series:
      # Refused nothing yesterday, its series at 0 all day; 10 a second for 30 minutes.
      - series: 'bucketry_ratelimit_requests_total{limit="spiky",decision="refused"}'
        values: '0x1440 600+600x29'
      - series: 'bucketry_ratelimit_requests_total{limit="spiky",decision="admitted"}'
        values: '0+60x1470'
      # Its refusals are bans: refused and banned add up.
      - series: 'bucketry_ratelimit_requests_total{limit="banning",decision="refused"}'
        values: '0x1470'
      - series: 'bucketry_ratelimit_requests_total{limit="banning",decision="banned"}'
        values: '0x1440 600+600x29'
      # 10 a second yesterday and today: no spike.
      - series: 'bucketry_ratelimit_requests_total{limit="steady",decision="refused"}'
        values: '0+600x1470'
      # From 0 to 0.5 a second: more than 5x, but under the floor of 1 a second.
      - series: 'bucketry_ratelimit_requests_total{limit="trickle",decision="refused"}'
        values: '0x1440 30+30x29'
      # No refused series yesterday (a limit born today): nothing to compare with.
      - series: 'bucketry_ratelimit_requests_total{limit="newborn",decision="refused"}'
        values: '_x1440 600+600x29'
    alert_rule_test:
      - eval_time: 1d
        alertname: RateLimitRefusalSpike
        exp_alerts: []
      # Five minutes into the spike: pending (for: 10m), not firing.
      - eval_time: 1d5m
        alertname: RateLimitRefusalSpike
        exp_alerts: []
      - eval_time: 1d30m
        alertname: RateLimitRefusalSpike
        exp_alerts:
          - exp_labels: {limit: spiky}
          - exp_labels: {limit: banning}

  - name: backend errors, flush lag, dropped counts
    interval: 1m
    input_series:
      # memcached fails once a second from minute 11; redis never.
      - series: 'bucketry_ratelimit_backend_errors_total{backend="memcached"}'
        values: '0x10 60+60x19'
      - series: 'bucketry_ratelimit_backend_errors_total{backend="redis"}'
        values: '0x30'
      # Counts wait 400 s for the database from minute 6.
      - series: 'bucketry_metrics_flush_lag_seconds'
        values: '0x5 400x24'
      # Three counts dropped at minute 20.
      - series: 'bucketry_metrics_dropped_total'
        values: '0x19 3x10'
    alert_rule_test:
      - eval_time: 12m
        alertname: RateLimitBackendErrors
        exp_alerts: []
      - eval_time: 15m
        alertname: RateLimitBackendErrors
        exp_alerts:
          - exp_labels: {backend: memcached}
      - eval_time: 8m
        alertname: MetricsFlushLag
        exp_alerts: []
      - eval_time: 15m
        alertname: MetricsFlushLag
        exp_alerts:
          - exp_labels: {}
      - eval_time: 15m
        alertname: MetricsDropped
        exp_alerts: []
      - eval_time: 25m
        alertname: MetricsDropped
        exp_alerts:
          - exp_labels: {}
"""

#: Changes to the documented rules that the unit tests must catch: (what, pattern removed).
MUTANTS = [
    ("today compared with today", r" offset 1d"),
    ("no floor of 1 a second", r"\n *and sum by \(limit\) .*> 1(?=\n)"),
    ("the spike without its for", r"\n *for: 10m(?=\n)"),
]


def unit_test(promtool: str, tmp: Path, alerts: str) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of :data:`UNIT_TESTS` over the rules ``alerts``."""
    (tmp / "alerts.yml").write_text(alerts, encoding="utf-8")
    (tmp / "tests.yml").write_text(UNIT_TESTS, encoding="utf-8")
    return run(promtool, "test", "rules", str(tmp / "tests.yml"))


def test_promtool_accepts_the_documented_alerts(promtool: str, tmp_path: Path) -> None:
    alerts = documented_alerts()
    rules = alerts.count("- alert: ")
    assert rules == 4, alerts
    (tmp_path / "alerts.yml").write_text(alerts, encoding="utf-8")
    result = run(promtool, "check", "rules", str(tmp_path / "alerts.yml"))
    assert result.returncode == 0, said(result)
    assert f"SUCCESS: {rules} rules found" in result.stdout, said(result)


def test_the_documented_alerts_fire_as_they_say(promtool: str, tmp_path: Path) -> None:
    result = unit_test(promtool, tmp_path, documented_alerts())
    assert result.returncode == 0, said(result)
    assert "SUCCESS" in result.stdout and "FAILED" not in result.stdout, said(result)


@pytest.mark.parametrize(("what", "pattern"), MUTANTS, ids=[m[0] for m in MUTANTS])
def test_a_broken_spike_rule_fails_the_unit_tests(
    promtool: str, tmp_path: Path, what: str, pattern: str
) -> None:
    """The unit tests can fail: each mutant of the documented rules fails them."""
    mutant, found = re.subn(pattern, "", documented_alerts(), count=1)
    assert found == 1, f"{what}: {pattern!r} is no longer in the documented rules"
    result = unit_test(promtool, tmp_path, mutant)
    assert result.returncode == 1, said(result)
    failures = result.stderr  # promtool prints its failures there
    assert "FAILED" in failures and "alertname: RateLimitRefusalSpike" in failures, said(result)
    # Failed on what the rule does, not on a rule promtool cannot load.
    loaded = run(promtool, "check", "rules", str(tmp_path / "alerts.yml"))
    assert loaded.returncode == 0, said(loaded)


# -- the exporter's scrape --------------------------------------------------------------------


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("limited/", plain), path("dry/", plain)]

#: A decorator's group with what a label value must escape: a quote, a backslash, a newline,
#: and non-ASCII text.
HOSTILE = 'scrape "quoted" \\ back\nslash é'


@pytest.fixture
def site() -> Iterator[None]:
    forget_refusals()
    with override_settings(MIDDLEWARE=MIDDLEWARE):
        yield
    forget_refusals()


@pytest.mark.urls(__name__)
@pytest.mark.usefixtures("site")
def test_promtool_accepts_the_exporters_scrape(
    promtool: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)  # this process's registry
    name, dry, group = (f"{what}-{next(_unique)}" for what in ("scrape", "dry", HOSTILE))
    rules = [
        {"name": name, "path": "/limited/", "key": "ip", "rate": "2/m"},
        {"name": dry, "path": "/dry/", "key": "ip", "rate": "1/m", "shadow": True},
    ]
    with override_settings(RATELIMIT_RULES=rules), frozen_clock(T0):
        codes = [client.get("/limited/").status_code for _ in range(4)]
        codes += [client.get("/dry/").status_code for _ in range(2)]
        for _ in range(2):
            get_usage(RequestFactory().get("/"), group=group, key="ip", rate="1/m", increment=True)
    assert codes == [200, 200, 429, 429, 200, 200]
    response = prometheus(RequestFactory().get("/metrics"))
    assert response.status_code == 200
    scrape = response.content.decode()
    decisions = {
        (s.labels["limit"], s.labels["decision"]): s.value
        for family in text_string_to_metric_families(scrape)
        for s in family.samples
        if s.name == telemetry.REQUESTS
    }
    # The scrape holds this test's decisions, the hostile name escaped and read back.
    assert decisions[(name, "admitted")] == decisions[(name, "refused")] == 2
    assert decisions[(dry, "admitted")] == decisions[(dry, "shadow_refused")] == 1
    shown = telemetry.label(group)
    assert decisions[(shown, "admitted")] == decisions[(shown, "refused")] == 1
    result = run(promtool, "check", "metrics", stdin=scrape)
    # Exit 1 is a parse error, 3 a lint problem (a name, a missing HELP): neither is allowed.
    assert result.returncode == 0, said(result)
    assert result.stdout == result.stderr == "", said(result)


#: The documented set-up that exports to Prometheus through OpenTelemetry (docs/observability
#: .rst), run in a process of its own: ``RATELIMIT_TELEMETRY`` is read when the apps start.
#: Its stdout is the scrape of prometheus-client's default registry after four checks of a
#: limit of 2 a minute.
OTEL_SCRAPE = """\
import sys

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "ratelimit_app",
                    "metrics_app"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
    RATELIMIT_TELEMETRY=sys.argv[1],
    SILENCED_SYSTEM_CHECKS=["ratelimit_app.W001", "metrics_app.W001"],
    USE_TZ=True,
)
django.setup()

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider

metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))

from django.test import RequestFactory
from prometheus_client import REGISTRY, generate_latest

from metrics_app import buffer
from ratelimit_app.core import get_usage
from ratelimit_app.operators.telemetry import record_queued

for _ in range(4):
    get_usage(RequestFactory().get("/"), group="otel-scrape", key="ip", rate="2/m",
              increment=True)
record_queued()
buffer.reset()  # no database to flush the buffered counts to
sys.stdout.write(generate_latest(REGISTRY).decode())
"""


@pytest.mark.parametrize(
    ("value", "error"),
    [("otel", None), ("auto", None), ("both", 'second HELP line for metric name "bucketry_')],
)
def test_promtool_checks_the_scrape_through_opentelemetrys_exporter(
    promtool: str, value: str, error: str | None
) -> None:
    """``"otel"`` (and ``"auto"``, which then makes prometheus-client's instruments alone)
    give a valid scrape; ``"both"`` the invalid one of the docs' table."""
    if not telemetry.installed(telemetry.OTEL_TO_PROMETHEUS):
        pytest.skip("opentelemetry-exporter-prometheus is not installed")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    # Neither a developer's OpenTelemetry variables nor multiprocess mode: one process's scrape.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_") and k not in ("PROMETHEUS_MULTIPROC_DIR", "PYTHONPATH")
    }
    scraped = subprocess.run(
        [sys.executable, "-c", OTEL_SCRAPE, value],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**env, "PYTHONPATH": path},
    )
    assert scraped.returncode == 0, scraped.stderr[-3000:]
    ours = r'^bucketry_ratelimit_requests_total\{decision="(\w+)",limit="otel-scrape".*} (\S+)$'
    samples = set(re.findall(ours, scraped.stdout, flags=re.MULTILINE))
    assert samples == {("admitted", "2.0"), ("refused", "2.0")}, scraped.stdout
    result = run(promtool, "check", "metrics", stdin=scraped.stdout)
    if error is None:
        assert result.returncode == 0, said(result)
        assert result.stdout == result.stderr == "", said(result)
    else:
        assert result.returncode == 1, said(result)
        assert error in result.stderr, said(result)
