"""``python -m bench`` (``make bench``): every benchmark, one table each.

That is every module of :mod:`bench.claims` but two that take their own arguments:
``load_ab`` (it compares two revisions) and ``figures`` (it draws the docs' figure).
Options: ``--quick`` for a short run (fewer rounds, shorter simulated time).
"""

from __future__ import annotations

import argparse
import time

from bench.claims import (
    accuracy,
    big_bodies,
    crowd_controls,
    drf_throttle,
    leaky_bucket,
    load,
    memos,
    metrics,
    ratelimit_latency,
    ratelimit_middleware,
)
from bench.common import machine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (smoke check)")
    args = parser.parse_args(argv)
    info = machine()
    print(
        f"machine: {info['cores']} cores, {info['cpu']}; Python {info['python']}; "
        f"{info['memcached']}; {info['redis']}\n"
    )
    started = time.monotonic()
    if args.quick:
        rounds, calls, scale, ips, batch = 4, 50, 0.1, 10, 20
    else:
        rounds, calls, scale, ips, batch = 20, 300, 1.0, 100, 100
    rows = ratelimit_latency.run(rounds=rounds, calls=calls)
    print(ratelimit_latency.render(rows, rounds, calls), end="\n\n")
    rule_rows, no_match = ratelimit_middleware.run(
        rounds=rounds, calls=calls, ips=ips, batch=batch
    )
    print(ratelimit_middleware.render(rule_rows, no_match, rounds, calls), end="\n\n")
    meter_rows = leaky_bucket.run(rounds=rounds, calls=calls, ips=ips)
    print(leaky_bucket.render(meter_rows, rounds, calls), end="\n\n")
    print(accuracy.render(accuracy.run(scale=scale)), end="\n\n")
    body_rounds = 2 if args.quick else big_bodies.ROUNDS
    print(big_bodies.render(big_bodies.run(rounds=body_rounds), body_rounds), end="\n\n")
    # Django REST framework: our throttles against DRF's, per request and under concurrency.
    drf_rows = drf_throttle.run(rounds=rounds, calls=calls)
    drf_found = drf_throttle.run_concurrency()
    print(drf_throttle.render(drf_rows, drf_found, rounds, calls), end="\n\n")
    # Whole requests through gunicorn, measured with wrk (Debian package wrk, installed by
    # `make servers`): 3 rounds of 10 s per case, or 1 round of 2 s with --quick.
    load_rounds, load_seconds, load_warmup = (1, 2, 1) if args.quick else (3, 10, 3)
    print(load.render(load.run(load_rounds, load_seconds, load_warmup)), end="\n\n")
    # Bans and overrides by the hundred thousand: instructions under valgrind, then wall time.
    if args.quick:
        crowd = crowd_controls.run(
            sizes=crowd_controls.QUICK_SIZES, changes=crowd_controls.QUICK_CHANGES, layouts=(0,)
        )
    else:
        crowd = crowd_controls.run()
    print(crowd_controls.render(crowd), end="\n\n")
    # What each memo of the runtime saves a request: instructions under valgrind.
    if args.quick:
        print(memos.render(memos.run(memos.QUICK_SIZES, (0,)), 1), end="\n\n")
    else:
        print(memos.render(memos.run()), end="\n\n")
    metrics.main()
    print(f"\n(all benchmarks: {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
