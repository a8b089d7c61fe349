"""A real Prometheus scraping the documented multiprocess set-up (docs/observability.rst,
"Several worker processes" and "Grafana"): gunicorn with 3 sync workers in
prometheus-client's multiprocess mode serving :mod:`prometheus_site`, scraped every second.

Ten requests at once against its rule of 5 a minute; once Prometheus has scraped after them:

* ``sum by (decision)`` of the decisions reads 5 admitted and 5 refused, exactly;
* the rule's ``refused`` series was there at 0 before its first refusal (the earliest sample
  Prometheus holds is 0, taken before the requests), so ``increase()`` over the first burst
  reads its 5 refusals, not 0;
* every PromQL expression of docs/_static/grafana-bucketry.json's panels, Grafana's
  variables filled in, is one Prometheus runs, and the decision panels show the burst (half
  the rule's requests refused);
* ``promtool check metrics`` accepts the workers' scrape.

A missing ``prometheus`` or ``promtool`` (Debian package ``prometheus``) skips, and fails
under ``CI=true``.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import start_or_skip
from tests.reliability import procs
from tests.reliability.common import ROOT, report
from tests.reliability.prometheus_site import LIMIT, RULE
from tests.reliability.test_prometheus_multiproc import deciders, get, serving
from tests.servers import (
    HOST,
    QueryError,
    Server,
    active_targets,
    query,
    require_binary,
    start_prometheus,
    wait_for,
)

pytestmark = pytest.mark.slow

WORKERS = 3
DASHBOARD = ROOT / "docs" / "_static" / "grafana-bucketry.json"
DECISIONS = "bucketry_ratelimit_requests_total"
REFUSED = f'{DECISIONS}{{limit="{RULE}",decision="refused"}}'
#: Grafana's own variables, as a dashboard's query sees them; the dashboard's template
#: variables match everything (``.*``).
GRAFANA = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "1h",
    "__range_s": "3600",
}
#: The panels that must show the burst.
SHOWING_DECISIONS = (
    "Decisions per second, by decision",
    "Refusals per second, by limit",
    "Share refused, by limit",
)


@pytest.fixture(scope="module")
def tools() -> tuple[str, str]:
    """``prometheus`` and ``promtool``: a skip when missing, a failure under ``CI=true``."""
    return (
        start_or_skip(lambda: require_binary("prometheus")),
        start_or_skip(lambda: require_binary("promtool")),
    )


@pytest.fixture
def site(own_memcached: procs.Restartable, tmp_path: Path) -> Iterator[int]:
    """The gunicorn site's port; a memcached of its own, so that the rule's counters start
    empty whichever test counted on the session's before."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    settings = {
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
        "MEMCACHED_SERVERS": own_memcached.address,
        "RELIABILITY_SQLITE": str(tmp_path / "site.sqlite3"),
    }
    with serving(tmp_path, WORKERS, settings) as port:
        yield port


@pytest.fixture
def prometheus(site: int, tools: tuple[str, str]) -> Iterator[Server]:
    """A Prometheus scraping the site's ``/metrics`` every second."""
    server = start_or_skip(functools.partial(start_prometheus, [f"{HOST}:{site}"]))
    yield server
    server.stop()


def number(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


def last_scrape(server: Server) -> float:
    """When the latest scrape of the site started (0 before the first one)."""
    found = query(server, "timestamp(up)")
    return number(found[0]) if found else 0.0


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those of collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panels(panel)


def promql(expr: str, dashboard: dict[str, Any]) -> str:
    """``expr`` as Grafana sends it: ``$name``, ``${name}``, ``${name:format}`` and
    ``[[name]]`` replaced (:data:`GRAFANA`; a template variable by ``.*``)."""
    values = {v["name"]: ".*" for v in dashboard.get("templating", {}).get("list", [])}
    values.update(GRAFANA)

    def value(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        return values.get(name, match.group(0))

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", value, expr)


def dashboard_results(server: Server, at: float) -> dict[str, list[Any]]:
    """Each panel's title and the results of its targets' PromQL at ``at``; an assertion
    error naming every query Prometheus rejects or that holds a variable left unknown."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    results: dict[str, list[Any]] = {}
    errors = []
    for panel in panels(dashboard):
        title = str(panel.get("title", ""))
        for target in panel.get("targets", []):
            if "expr" not in target:
                continue
            expr = promql(target["expr"], dashboard)
            if re.search(r"\$\w|\$\{|\[\[", expr):  # Grafana would send it as written
                errors.append(f"{title!r}: an unknown variable in {expr!r}")
                continue
            try:
                results.setdefault(title, []).append(query(server, expr, at=at))
            except QueryError as exc:
                errors.append(f"{title!r}: {exc}")
    assert not errors, "\n".join(errors)
    assert results, f"no PromQL in {DASHBOARD}"
    return results


def test_prometheus_scrapes_every_workers_decisions_from_0(
    tools: tuple[str, str], site: int, prometheus: Server, tmp_path: Path
) -> None:
    # Scraped, the rule's refused series already there at 0.
    born = wait_for(lambda: query(prometheus, REFUSED), timeout=20, interval=0.2)
    assert born, f"no scrape of the refused series: {active_targets(prometheus)}"
    assert number(born[0]) == 0
    before = time.time()
    with ThreadPoolExecutor(2 * LIMIT) as pool:
        codes = sorted(pool.map(lambda _: get(site, "/limited/")[0], range(2 * LIMIT)))
    done = time.time()
    assert codes == [200] * LIMIT + [429] * LIMIT
    scraped = wait_for(lambda: last_scrape(prometheus) > done, timeout=10, interval=0.2)
    assert scraped, f"no scrape after the requests: {active_targets(prometheus)}"
    at = last_scrape(prometheus)
    (target,) = active_targets(prometheus)
    assert target["health"] == "up", target

    by_decision = {
        s["metric"]["decision"]: number(s)
        for s in query(prometheus, f"sum by (decision) ({DECISIONS})", at=at)
    }
    assert by_decision == {"admitted": LIMIT, "refused": LIMIT}
    assert len(deciders(tmp_path / "prometheus")) >= 2  # summed over workers' files

    # Born at 0: Prometheus's first sample of the series is 0, taken before the first
    # refusal; increase() over the burst reads every refusal (from 5 it would read 0).
    (history,) = query(prometheus, f"{REFUSED}[1h]", at=at)
    samples = [(float(t), float(v)) for t, v in history["values"]]
    assert samples[0][1] == 0 and samples[0][0] < before, samples
    assert samples[-1] == (at, LIMIT), samples
    assert [v for _, v in samples] == sorted(v for _, v in samples)  # a counter, no reset
    (increase,) = query(prometheus, f"increase({REFUSED}[1h])", at=at)
    assert number(increase) == LIMIT

    # The dashboard's every query runs; the decision panels show the burst.
    results = dashboard_results(prometheus, at)
    missing = [title for title in SHOWING_DECISIONS if title not in results]
    assert not missing, f"panels no longer in the dashboard: {missing}"
    for title in SHOWING_DECISIONS:
        assert all(results[title]), f"{title!r} shows nothing: {results[title]}"
    (per_decision,) = results[SHOWING_DECISIONS[0]]
    shown = {s["metric"]["decision"]: number(s) for s in per_decision}
    assert shown.keys() == {"admitted", "refused"} and min(shown.values()) > 0, shown
    (share,) = results[SHOWING_DECISIONS[2]]
    assert {s["metric"]["limit"]: number(s) for s in share} == {RULE: pytest.approx(0.5)}

    # The workers' scrape, as promtool reads it.
    status, text = get(site, "/metrics")
    assert status == 200
    checked = subprocess.run(
        [tools[1], "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout == checked.stderr == "", checked.stdout + checked.stderr
    report(
        "prometheus-server",
        decisions=by_decision,
        first_refused=samples[0],
        increase=number(increase),
        series={title: [len(r) for r in found] for title, found in results.items()},
        workers=WORKERS,
    )
