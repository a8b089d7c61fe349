"""Prometheus under gunicorn with several workers (docs/observability.rst, "Several worker
processes"): with ``PROMETHEUS_MULTIPROC_DIR`` each worker writes its counts to the
directory, and one scrape of :func:`metrics_app.views.prometheus`, whichever worker serves
it, shows them all. 2 workers, a rule of 5 a minute (:mod:`prometheus_site`), 10 requests at
once: one scrape shows 5 admitted and 5 refused.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from tests.reliability import common
from tests.reliability.common import ROOT, env, report
from tests.reliability.prometheus_site import LIMIT, RULE
from tests.servers import free_port, gunicorn_argv

pytestmark = pytest.mark.slow

WORKERS = 2


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    except OSError:
        return 0, ""
    finally:
        conn.close()


@contextlib.contextmanager
def gunicorn(tmp: Path, **settings: str) -> Iterator[int]:
    """:data:`WORKERS` sync workers on a free port serving :mod:`prometheus_site`, its
    database migrated first."""
    with serving(tmp, WORKERS, settings) as port:
        yield port


@contextlib.contextmanager
def serving(tmp: Path, workers: int, settings: dict[str, str]) -> Iterator[int]:
    """:func:`gunicorn` with ``workers`` sync workers (tests/reliability/
    test_prometheus_server.py runs 3)."""
    site = env(DJANGO_SETTINGS_MODULE="tests.reliability.prometheus_site", **settings)
    migrate = [sys.executable, "-m", "django", "migrate", "--verbosity", "0"]
    alone = {k: v for k, v in site.items() if k != "PROMETHEUS_MULTIPROC_DIR"}  # no counts
    subprocess.run(migrate, cwd=ROOT, env=alone, check=True, timeout=120)
    port = free_port()
    argv = gunicorn_argv("django.core.wsgi:get_wsgi_application()", port, workers=workers)
    with common.serving(argv, site, tmp / "gunicorn.log", lambda: get(port, "/metrics")[0] == 200):
        yield port


def deciders(directory: Path) -> set[str]:
    """The pids whose counter file holds a decision."""
    found = set()
    for file in directory.glob("counter_*.db"):
        for key, value, _, _ in MmapedDict.read_all_values_from_file(str(file)):
            if value and json.loads(key)[0] == "bucketry_ratelimit_requests":
                found.add(file.stem.rsplit("_", 1)[1])
    return found


def decisions(text: str) -> dict[str, float]:
    """The decisions the scrape shows for the site's rule."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            ours = sample.name == "bucketry_ratelimit_requests_total"
            if ours and sample.labels.get("limit") == RULE:
                found[sample.labels["decision"]] = sample.value
    return found


def test_one_scrape_shows_every_workers_decisions(memcached_server: str, tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    settings = {
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
        "MEMCACHED_SERVERS": memcached_server,
        "RELIABILITY_SQLITE": str(tmp_path / "site.sqlite3"),
    }
    with gunicorn(tmp_path, **settings) as port, ThreadPoolExecutor(2 * LIMIT) as pool:
        codes = sorted(pool.map(lambda _: get(port, "/limited/")[0], range(2 * LIMIT)))
        status, text = get(port, "/metrics")
    writers = deciders(directory)
    report("prometheus-multiproc", statuses=codes, decisions=decisions(text), writers=len(writers))
    assert codes == [200] * LIMIT + [429] * LIMIT
    assert status == 200
    assert decisions(text) == {"admitted": LIMIT, "refused": LIMIT}
    assert len(writers) == WORKERS  # both workers counted, and one scrape summed them
