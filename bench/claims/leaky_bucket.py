"""Per-check cost of the leaky bucket beside the sliding window and django-ratelimit 4.1.

One run, one process, the same throwaway memcached and Redis; the three contenders are
interleaved exactly as in :mod:`bench.claims.ratelimit_latency` (whose rounds this reuses), and the
table gives the medians and their ratios. Cases:

* **admitted**: ``1000000/m`` (never limited): the leaky bucket (burst: the rate's count)
  against a sliding window whose every bucket holds a count (a subject busy for a minute)
  and django-ratelimit's fixed window;
* **refused**: ``1/h``, every timed check over the limit: the leaky bucket stores nothing
  for a refused request, the sliding window takes its hit back (and times the wait),
  django-ratelimit counts it.

On memcached an admitted leaky-bucket check is two round trips (read with the CAS id, then
compare-and-set), a refused one a single read; on Redis both are one script call.

Run: ``python -m bench.claims.leaky_bucket [--rounds 20 --calls 300]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.claims.ratelimit_latency import Contender, time_backends
from bench.common import Servers, quantile, table, timing_parser

ADMITTED_RATE = "1000000/m"
REFUSED_RATE = "1/h"
CASES = ("admitted", "refused")


@dataclass
class Row:
    backend: str
    case: str
    leaky_median: float
    leaky_p90: float
    sliding_median: float
    peer_median: float
    samples: int
    failed: int = 0

    @property
    def vs_sliding(self) -> float:
        return self.leaky_median / self.sliding_median

    @property
    def vs_peer(self) -> float:
        return self.leaky_median / self.peer_median


def contenders(backend: str) -> list[Contender]:
    """Leaky bucket, sliding window and django-ratelimit, admitted and refused."""
    from django_ratelimit.core import get_usage as peer_usage

    from ratelimit_app.core import get_usage as our_usage

    g = f"bench-lb-{backend}"

    def ours(group: str, rate: str, algorithm: str) -> Any:
        def run(request: Any) -> Any:
            usage = our_usage(
                request, group=group, key="ip", rate=rate, increment=True, algorithm=algorithm
            )
            return [usage]

        return run

    def peer(group: str, rate: str) -> Any:
        def run(request: Any) -> Any:
            return [peer_usage(request, group=group, key="ip", rate=rate, increment=True)]

        return run

    return [
        Contender("leaky admitted", ours(g + "-la", ADMITTED_RATE, "leaky_bucket")),
        Contender(
            "sliding admitted",
            ours(g + "-sa", ADMITTED_RATE, "sliding_window"),
            windows=(60,),
        ),
        Contender("peer admitted", peer(g + "-pa", ADMITTED_RATE)),
        Contender("leaky refused", ours(g + "-lr", REFUSED_RATE, "leaky_bucket"), limited=True),
        Contender(
            "sliding refused", ours(g + "-sr", REFUSED_RATE, "sliding_window"), limited=True
        ),
        Contender("peer refused", peer(g + "-pr", REFUSED_RATE), limited=True),
    ]


def run(
    rounds: int = 20, calls: int = 300, ips: int = 100, servers: Servers | None = None
) -> list[Row]:
    """Time every case on memcached and Redis; start throwaway servers unless given."""
    rows = []
    for backend, by_name in time_backends(rounds, calls, ips, servers, contenders).items():
        for case in CASES:
            leaky = by_name[f"leaky {case}"]
            rows.append(
                Row(
                    backend=backend,
                    case=case,
                    leaky_median=quantile(leaky.samples, 0.5),
                    leaky_p90=quantile(leaky.samples, 0.9),
                    sliding_median=quantile(by_name[f"sliding {case}"].samples, 0.5),
                    peer_median=quantile(by_name[f"peer {case}"].samples, 0.5),
                    samples=len(leaky.samples),
                    failed=sum(by_name[f"{c} {case}"].failures for c in ("leaky", "sliding")),
                )
            )
    return rows


def render(rows: list[Row], rounds: int, calls: int) -> str:
    headers = [
        "backend",
        "case",
        "leaky med us",
        "leaky p90 us",
        "sliding med us",
        "django-rl med us",
        "leaky/sliding",
        "leaky/django-rl",
        "failed",
    ]
    body = [
        [
            r.backend,
            r.case,
            r.leaky_median,
            r.leaky_p90,
            r.sliding_median,
            r.peer_median,
            f"{r.vs_sliding:.2f}x",
            f"{r.vs_peer:.2f}x",
            r.failed,
        ]
        for r in rows
    ]
    title = (
        f"Leaky bucket per check vs sliding window and django-ratelimit 4.1 ({rounds} "
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
