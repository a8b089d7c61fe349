"""A throwaway Prometheus server on a free loopback port, scraping given targets every second.

Its configuration, TSDB and log are in the server's temp dir; ``/-/ready`` answers 200 before
:func:`start_prometheus` returns. :func:`query` runs an instant PromQL query through the HTTP
API (``/api/v1/query``), :func:`active_targets` shows each target's last scrape (its health
and error). Standard library only, like the rest of :mod:`tests.servers`.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from tests.servers.debian import require_binary
from tests.servers.processes import (
    HOST,
    START_TIMEOUT,
    Argv,
    Server,
    ServerStartError,
    read_tail,
    start_process,
    wait_for,
)

#: The job every target is scraped under (``up{job="bucketry"}``).
JOB = "bucketry"


class QueryError(RuntimeError):
    """Prometheus's API answered with an error (a query it cannot parse or run)."""


def prometheus_config(targets: Sequence[str], metrics_path: str, interval: str) -> str:
    """A ``prometheus.yml`` (JSON is YAML) scraping ``targets`` (``host:port`` each) at
    ``metrics_path`` every ``interval``, with nothing else: no rules, no remote storage."""
    config = {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,  # at most the interval, or Prometheus refuses it
            "evaluation_interval": interval,
        },
        "scrape_configs": [
            {
                "job_name": JOB,
                "metrics_path": metrics_path,
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }
    return json.dumps(config, indent=2) + "\n"


def prometheus_argv(targets: Sequence[str], metrics_path: str, interval: str) -> Argv:
    """``argv(port, tmpdir)`` of a Prometheus on loopback ``port``: it writes the
    configuration into ``tmpdir``, where the TSDB goes too; warnings and errors logged only."""
    binary = require_binary("prometheus")

    def argv(port: int, tmpdir: str) -> list[str]:
        config = os.path.join(tmpdir, "prometheus.yml")
        with open(config, "w", encoding="utf-8") as fh:
            fh.write(prometheus_config(targets, metrics_path, interval))
        return [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={os.path.join(tmpdir, 'data')}",
            "--storage.tsdb.retention.time=1d",
            f"--web.listen-address={HOST}:{port}",
            "--log.level=warn",
        ]

    return argv


def start_prometheus(
    targets: Sequence[str], metrics_path: str = "/metrics", interval: str = "1s"
) -> Server:
    """Start Prometheus on a free loopback port, scraping ``targets`` (``host:port`` each)
    at ``metrics_path`` every ``interval``; return once ``/-/ready`` answers 200.

    ``url`` is ``http://127.0.0.1:PORT``. :class:`ServerStartError` with its log when it
    accepts connections but never gets ready.
    """
    argv = prometheus_argv(targets, metrics_path, interval)
    server = start_process("prometheus", argv, url=lambda port: f"http://{HOST}:{port}")
    if not wait_for(lambda: _status(f"{server.url}/-/ready") == 200, timeout=START_TIMEOUT):
        log = read_tail(os.path.join(server.tmpdir, "prometheus.log"))
        server.stop()
        raise ServerStartError(f"prometheus did not get ready:\n{log}")
    return server


def _status(url: str) -> int:
    """The HTTP status of a GET of ``url`` (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def api(server: Server, endpoint: str, **params: str) -> Any:
    """The ``data`` of ``GET /api/v1/<endpoint>?<params>``; :class:`QueryError` with
    Prometheus's ``errorType`` and ``error`` unless its status is ``success``."""
    url = f"{server.url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:  # 400 and 422 carry the error as JSON
        raw = exc.read()
    try:
        body = json.loads(raw)
    except ValueError:
        raise QueryError(f"{endpoint} {params}: not JSON: {raw[:500]!r}") from None
    if body.get("status") != "success":
        error = f"{body.get('errorType')}: {body.get('error')}"
        raise QueryError(f"{endpoint} {params}: {error}")
    return body["data"]


def query(server: Server, expr: str, at: float | None = None) -> Any:
    """The result of the instant query ``expr``, now or at the Unix time ``at``.

    A vector is a list of ``{"metric": {labels}, "value": [time, "text"]}``, a range
    selector's matrix one of ``{"metric": ..., "values": [[time, "text"], ...]}``, a scalar
    ``[time, "text"]``. :class:`QueryError` when Prometheus rejects the query.
    """
    params = {"query": expr}
    if at is not None:
        params["time"] = repr(at)
    return api(server, "query", **params)["result"]


def active_targets(server: Server) -> list[dict[str, Any]]:
    """Each target being scraped: ``scrapeUrl``, ``health`` (``up``, ``down``, ``unknown``),
    ``lastError``, ``lastScrape``."""
    return list(api(server, "targets", state="active")["activeTargets"])
