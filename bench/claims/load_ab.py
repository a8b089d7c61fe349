"""Two revisions of demo_site under gunicorn side by side: is a change faster under load?

:mod:`bench.claims.load` compares cases within one site, and on a shared machine its shares move by
several points between runs: too much to see a change of a few percent. This bench starts
two sites at once on the same throwaway servers and database: **base**, the code of a git
revision (``git archive``, default ``HEAD``), and **head**, this working tree, each
gunicorn with :data:`bench.claims.load.WORKERS` sync workers. wrk drives one site at a time, the
two alternating case by case (the order reversed every other round), so both see the same
machine within seconds of each other. For each case the table gives the medians over the
rounds of rps and of the site's CPU per answered request (its gunicorn workers, from
``/proc``), and the median of the per-round ratios head / base (below 1 for the CPU: head
is cheaper).

Both revisions must share the database schema (the migrations of this tree are applied).

Run: ``python -m bench.claims.load_ab [--base REV] [--cases plain,rules+counted] [--rounds 8]
[--db postgres|sqlite]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from bench.claims import load
from bench.common import Servers, table, throwaway_servers
from tests.servers import require_binary

SIDES = ("base", "head")
DEFAULT_CASES = ("plain", load.TARGET_CASE)


@dataclass
class Pair:
    """One case's samples on both sides: (rps, site CPU ms per answered request)."""

    case: load.Case
    samples: dict[str, list[tuple[float, float]]] = field(
        default_factory=lambda: {side: [] for side in SIDES}
    )

    def median(self, side: str, which: int) -> float:
        return statistics.median(s[which] for s in self.samples[side])

    def ratio(self, which: int) -> float:
        """Median over the rounds of head / base."""
        base, head = self.samples["base"], self.samples["head"]
        return statistics.median(h[which] / b[which] for b, h in zip(base, head, strict=True))


def export(rev: str, into: str) -> Path:
    """The tree of git revision ``rev`` of this repository, unpacked under ``into``."""
    out = Path(into) / "base"
    out.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev], cwd=load.ROOT, capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise load.LoadError(f"git archive {rev}: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def site_cpu_ms(proc: subprocess.Popen[bytes], before: int, requests: int) -> float:
    return (
        (load.descendant_ticks(proc.pid)["site"] - before)
        * 1000
        / load.CLOCK_TICKS
        / max(requests, 1)
    )


def run(
    base_rev: str = "HEAD",
    cases: Sequence[str] = DEFAULT_CASES,
    rounds: int = 8,
    seconds: int = 4,
    warmup: int = 2,
    db: str = "postgres",
    servers: Servers | None = None,
) -> list[Pair]:
    """Time ``cases`` on both sides; memcached and Redis are started unless ``servers``."""
    wrk = require_binary("wrk")
    chosen = [c for c in load.CASES if c.name in cases]
    if len(chosen) != len(set(cases)):
        known = ", ".join(c.name for c in load.CASES)
        raise ValueError(f"unknown case in {list(cases)}; the cases are {known}")
    with ExitStack() as stack:
        state_dir = tempfile.mkdtemp(prefix="bucketry-load-ab-")
        stack.callback(shutil.rmtree, state_dir, ignore_errors=True)
        if servers is None:
            servers = stack.enter_context(throwaway_servers())
        database_url, _ = load.start_database(db, state_dir, stack)
        roots = {"base": export(base_rev, state_dir), "head": load.ROOT}
        envs = {
            side: load.site_env(servers, database_url, state_dir, roots[side]) for side in SIDES
        }
        load.prepare(envs["head"])
        # Each case's clients (the crowd's 20,000 addresses), as the load bench sends them.
        scripts = {p.clients: load.post_script(state_dir, p.clients) for p in load.CASES}
        sites = {
            side: stack.enter_context(
                load.gunicorn(envs[side], f"{state_dir}/{side}.log", roots[side])
            )
            for side in SIDES
        }
        pairs = [Pair(case) for case in chosen]
        sent = {(case.name, side): 0 for case in chosen for side in SIDES}  # clients, in turn
        for r in range(rounds + 1):  # round 0 warms every case up on both sides
            order = [(pair, side) for pair in pairs for side in SIDES]
            for pair, side in order if r % 2 == 0 else order[::-1]:
                proc, port = sites[side]
                if r == 0:
                    load.check_answer(port, pair.case)
                before = load.descendant_ticks(proc.pid)["site"]
                result = load.run_wrk(
                    wrk,
                    f"http://127.0.0.1:{port}{pair.case.path}",
                    seconds if r else warmup,
                    scripts[pair.case.clients] if pair.case.post else None,
                    (str(sent[pair.case.name, side]),) if pair.case.clients > 1 else (),
                )
                sent[pair.case.name, side] += result.requests
                if r:
                    cpu = site_cpu_ms(proc, before, result.requests)
                    pair.samples[side].append((result.rps, cpu))
        return pairs


def render(pairs: Sequence[Pair], base_rev: str, rounds: int, seconds: int) -> str:
    return table(
        f"base ({base_rev}) and head (this tree) side by side, {load.WORKERS} sync workers each; "
        f"{rounds} rounds x {seconds} s, alternating; medians",
        [
            "case",
            "base rps",
            "head rps",
            "rps head/base",
            "base site ms/req",
            "head site ms/req",
            "CPU head/base",
        ],
        [
            [
                p.case.label,
                p.median("base", 0),
                p.median("head", 0),
                f"{p.ratio(0):.3f}",
                f"{p.median('base', 1):.3f}",
                f"{p.median('head', 1):.3f}",
                f"{p.ratio(1):.3f}",
            ]
            for p in pairs
        ],
    )


def main(argv: list[str] | None = None) -> list[Pair]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision of the base side")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    args = parser.parse_args(argv)
    pairs = run(args.base, args.cases.split(","), args.rounds, args.seconds, db=args.db)
    print(render(pairs, args.base, args.rounds, args.seconds))
    return pairs


if __name__ == "__main__":
    main()
