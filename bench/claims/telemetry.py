"""Per-check cost of the exporters: ``get_usage`` with the instruments hooked in, beside the
plain check.

One run, one process, the same throwaway memcached and Redis; the contenders are interleaved
as in :mod:`bench.claims.ratelimit_latency` (whose rounds this reuses), and the table gives
their medians and what the instruments add. Contenders, each one rate, every check counted
(admitted):

* **plain**: no exporter hooked (what a project without the extras runs);
* **prometheus**: prometheus-client's counter and histogram
(:mod:`ratelimit_app.operators.telemetry`); * **otel sdk**: the same on an OpenTelemetry SDK meter
  with an in-memory reader (the SDK aggregates on every call; the API alone, without an SDK, does
  nothing).

Each check sets the hook lists first (the same assignment for every contender), so the
difference is the instruments alone. Target: a few microseconds at most.

Run: ``python -m bench.claims.telemetry [--rounds 20 --calls 300]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.claims.ratelimit_latency import Contender, time_backends
from bench.common import Servers, quantile, table, timing_parser

RATE = "1000000/m"
CONTENDERS = ("plain", "prometheus", "otel sdk")


@dataclass
class Row:
    backend: str
    contender: str
    median: float
    p90: float
    plain_median: float
    samples: int
    failed: int = 0

    @property
    def added(self) -> float:
        """Microseconds the instruments add to a check (median against median)."""
        return self.median - self.plain_median


def hooks() -> dict[str, tuple[list[Any], list[Any]]]:
    """Each contender's (verdict observers, round-trip observers)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from ratelimit_app.operators import telemetry

    prometheus = telemetry.Telemetry([_registered_prometheus()])
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("bucketry")
    otel = telemetry.Telemetry([telemetry.OpenTelemetry(meter)])
    return {
        "plain": ([], []),
        "prometheus": ([prometheus.observe], [prometheus.trip]),
        "otel sdk": ([otel.observe], [otel.trip]),
    }


def _registered_prometheus() -> Any:
    """The sink of the instruments :func:`ratelimit_app.operators.telemetry.connect` registered."""
    from ratelimit_app.operators import telemetry

    connected = telemetry.connect()
    assert connected is not None, "prometheus-client is not installed"
    return next(s for s in connected.sinks if isinstance(s, telemetry.Prometheus))


def contenders(backend: str) -> list[Contender]:
    from ratelimit_app.core import get_usage
    from ratelimit_app.engine import checking

    found = hooks()

    def exported(name: str) -> Any:
        observers, trips = found[name]
        group = f"bench-telemetry-{backend}-{name}"

        def run(request: Any) -> Any:
            checking.HOOKS.observers[:] = observers
            checking.HOOKS.trips[:] = trips
            return [get_usage(request, group=group, key="ip", rate=RATE, increment=True)]

        return run

    return [Contender(name, exported(name)) for name in CONTENDERS]


def run(
    rounds: int = 20, calls: int = 300, ips: int = 100, servers: Servers | None = None
) -> list[Row]:
    """Time every contender on memcached and Redis; start throwaway servers unless given.
    The hooks are put back as they were."""
    from ratelimit_app.engine import checking

    saved = list(checking.HOOKS.observers), list(checking.HOOKS.trips)
    try:
        timed = time_backends(rounds, calls, ips, servers, contenders)
    finally:
        checking.HOOKS.observers[:], checking.HOOKS.trips[:] = saved
    rows = []
    for backend, by_name in timed.items():
        plain = quantile(by_name["plain"].samples, 0.5)
        for name in CONTENDERS:
            c = by_name[name]
            rows.append(
                Row(
                    backend=backend,
                    contender=name,
                    median=quantile(c.samples, 0.5),
                    p90=quantile(c.samples, 0.9),
                    plain_median=plain,
                    samples=len(c.samples),
                    failed=c.failures,
                )
            )
    return rows


def render(rows: list[Row], rounds: int, calls: int) -> str:
    headers = ["backend", "exporter", "med us", "p90 us", "added us", "failed"]
    body = [[r.backend, r.contender, r.median, r.p90, r.added, r.failed] for r in rows]
    title = (
        f"Exporters per check: get_usage with the instruments vs without ({rounds} "
        f"interleaved rounds x {calls} checks; one rate)"
    )
    return table(title, headers, body)


def main(argv: list[str] | None = None) -> list[Row]:
    args = timing_parser(__doc__).parse_args(argv)
    rows = run(args.rounds, args.calls, args.ips)
    print(render(rows, args.rounds, args.calls))
    return rows


if __name__ == "__main__":
    main()
