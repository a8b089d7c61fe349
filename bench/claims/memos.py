"""What each memo of the runtime saves a request, for a recurring client and for a crowd.

docs/architecture lists every memo the limiter keeps between requests (*State*); a memo
survives only where this bench shows that it pays. Each memo is turned off in turn (its dict
replaced, after one request has built the rules, limits and backend, by one that keeps
nothing: every look-up misses and the value is made again) and the instructions of a request
are counted as :mod:`bench.instructions` counts them (callgrind, in-process, on memcached;
the counted requests only) in two cases: ``rules`` (three sliding-window rules and visit
counting) and ``leaky`` (one leaky-bucket rule and visit counting), for

* **one client**: every request from the bench's one client, the case a memo is made for;
* **a crowd**: every request from a new client address (10.0.0.1 counting up, through the
  trusted proxy): a memo of subjects never hits and costs only its upkeep.

A memo's **saving** is the count with it off minus the count with everything on: positive,
it pays. Each figure is the median over :data:`LAYOUTS` of the interpreter (CPython's
attribute cache moves a count by up to ten thousand instructions with where a process's
types and names fall: :data:`bench.instructions._LAYOUT`), so a saving within
:data:`NOISE` of zero is none.

Run: ``python -m bench.claims.memos [--base REV] [--quick]``. Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from bench import instructions
from bench.claims import load
from bench.claims.load_ab import export
from bench.common import Servers, table
from tests.servers import require_binary

#: Each memo and what turns it off (run in the child after one request: see :data:`SETUP`).
MEMOS = {
    "everything on": "",
    "compiled (plans, meters, key functions)": "RUNTIME.compiled = Forgetful()",
    "plans (by limit, for the fine bucket)": "RUNTIME.plans = Forgetful()",
    "namespaces (by limit, kind, value)": "RUNTIME.namespaces = Forgetful()",
    "addresses (parsed, masked, trusted)": (
        "RUNTIME.addresses = Forgetful(); RUNTIME.masked = Forgetful(); "
        "RUNTIME.trusted = Forgetful()"
    ),
    "rules matched (by path, method; URL names)": (
        "store.current().rules._matched = Forgetful(); "
        "RUNTIME.parts[rules._url_names] = Forgetful()"
    ),
    "plans' encodings (by plan)": "get_backend()._encodings = Forgetful()",
    "memcached check commands (by shape)": "get_backend()._shapes = Forgetful()",
}

#: Run in the child once, before the warm-up: one request builds what the memos belong to,
#: then the memo named ``OFF`` is replaced by one that keeps nothing.
SETUP = """
class Forgetful(dict):
    __slots__ = ()
    def __setitem__(self, key, value):  # keeps nothing: every look-up misses
        pass
get(path, client="10.255.255.254")
from ratelimit_app.runtime import RUNTIME
from ratelimit_app.config import rules
from ratelimit_app import store
from ratelimit_app.backends import get_backend
exec(OFF)
"""

#: The counted runs (N1, N2 requests) and the warm-up of each.
SIZES = (100, 300, 200)
QUICK_SIZES = (10, 30, 20)
#: The layouts each figure is the median of.
LAYOUTS = (0, 1, 2)
#: Instructions within which a saving is none (the layouts' spread).
NOISE = 3_000
WORKLOADS = {"one client": False, "a crowd": True}
#: The cases (:data:`bench.instructions.CASES`) and the memos turned off in each: the
#: ``leaky`` case (one leaky-bucket rule) for the memos its check reads (a leaky bucket's
#: check reads the namespaces' memo on every request).
CASES = {
    "rules": tuple(MEMOS),
    "leaky": (
        "everything on",
        "compiled (plans, meters, key functions)",
        "namespaces (by limit, kind, value)",
    ),
}


def run(
    sizes: tuple[int, int, int] = SIZES,
    layouts: tuple[int, ...] = LAYOUTS,
    base: str | None = None,
    cases: dict[str, tuple[str, ...]] = CASES,
    workloads: tuple[str, ...] = tuple(WORKLOADS),
) -> dict[tuple[str, str, str], float]:
    """``{(case, memo, workload): instructions per request}``, each the median over
    ``layouts``, on this tree (or on the git revision ``base``)."""
    require_binary("valgrind")
    with ExitStack() as stack:
        state = stack.enter_context(tempfile.TemporaryDirectory(prefix="bucketry-memos-"))
        url, _ = load.start_database("sqlite", state, stack)
        env = load.site_env(Servers(memcached="", redis=""), url, state)
        load.prepare(env)
        tree = load.ROOT if base is None else export(base, state)
        jobs = [
            (case, m, w, layout)
            for layout in layouts
            for case, memos in cases.items()
            for m in memos
            for w in workloads
        ]

        def count(job: tuple[str, str, str, int]) -> float:
            case, memo, workload, layout = job
            where = f"{case}-{list(MEMOS).index(memo)}-{workload}-{layout}"
            out_dir = os.path.join(state, where.replace(" ", "_"))
            os.mkdir(out_dir)
            setup = f"OFF = {MEMOS[memo]!r}\n" + SETUP
            return instructions.per_request(
                Path(tree), env, case, out_dir, sizes, setup, WORKLOADS[workload], True, layout
            )

        # Two at a time: each count is one process (valgrind runs one thread at a time).
        with ThreadPoolExecutor(max_workers=2) as pool:
            found = dict(zip(jobs, pool.map(count, jobs), strict=True))
    return {
        (case, m, w): statistics.median(found[(case, m, w, layout)] for layout in layouts)
        for case, memos in cases.items()
        for m in memos
        for w in workloads
    }


def render(counts: dict[tuple[str, str, str], float], layouts: int = len(LAYOUTS)) -> str:
    rows: list[list[object]] = []
    workloads = list(dict.fromkeys(w for _, _, w in counts))
    for case, memo in dict.fromkeys((c, m) for c, m, _ in counts):
        row: list[object] = [case, memo]
        for w in workloads:
            here = counts[(case, memo, w)]
            on = counts[(case, "everything on", w)]
            row.append(f"{here / 1000:.1f}k")
            if memo != "everything on":
                saved = here - on
                row.append(f"{saved / 1000:+.1f}k" if abs(saved) > NOISE else "none")
            else:
                row.append("-")
        rows.append(row)
    header = ["case", "memo off", *(f"{w}|saves" for w in workloads)]
    header = [h for part in header for h in part.split("|")]
    return table(
        "Instructions per request with each memo off (callgrind; median of "
        f"{layouts} layouts; a saving within {NOISE / 1000:.0f}k is none)",
        header,
        rows,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="a git revision to count instead of this tree")
    parser.add_argument("--quick", action="store_true", help="a short run (smoke check)")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    layouts = (0,) if args.quick else LAYOUTS
    print(render(run(sizes, layouts, args.base), len(layouts)))


if __name__ == "__main__":
    main()
