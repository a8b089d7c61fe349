"""Instructions one whole request costs, counted by valgrind's callgrind.

The load bench's shares move by several points between runs on a shared machine, more than
most changes are worth; the limiter's own work is a few hundred thousand instructions a
request, and a change of a few percent of it shows only here. callgrind counts the
instructions a process runs, not its time: the same code, inputs and clock give the same
count, whatever else the machine is doing.

Each case is one process, under ``valgrind --tool=callgrind``: demo_site with the load
bench's URLs and rules (:mod:`bench.load_site`), requests through Django's WSGI handler
in-process (no server, no socket to the client), a throwaway memcached, SQLite. The
limiter's clock starts at a fixed time and moves 0.5 ms a reading (a warm-up first moves it
over 90 s, so a busy subject's minute is filled as under load), memcached is emptied and the
refusal memory cleared before each case, and the garbage collector is off while requests
are counted. A case runs twice, ``N1`` and ``N2`` requests after the same warm-up: a
request costs ``(count(N2) - count(N1)) / (N2 - N1)`` instructions.

Cases: ``plain`` (the plain view), ``floor`` (one round trip and visit counting,
:mod:`bench.load_floor`), ``rules`` (three rules and visit counting: the load bench's target
case) and ``rules-refused`` (the same while this process remembers a refusal of another
client, as on any site that refused anyone lately; the load bench's floods leave that).

``one-rule`` is one rule alone (what each further matching rule adds: ``rules`` has three).
``crowd`` is the load bench's crowd's rule: ``1/h`` on the client's address, 30,000
addresses in turn through the trusted proxy, each refused after its first request (every
429 a refusal at the counters, as each process's first refusal of each address of the load
bench's crowd: a process remembers 25,000); whatever ``--clients`` says. ``crowd-memory`` is
the load bench's crowd in its steady state: 20,000 addresses, each admitted, then (200 s
later, in a flood) refused once at the counters, so that every 429 counted is answered from
the refusal memory (settled, and vouched for by the configuration's looks).
With ``--clients one,new,zipf`` each case is counted for the bench's one client, for a new
client on every request and for a Zipf mix over 100,000 addresses (the crowds' requests
counted alone: ``late``).

Run: ``python -m bench.instructions [--base REV] [--cases plain,floor,rules,rules-refused]
[--clients one,new,zipf]``.
Needs valgrind (Debian's ``valgrind``). ``--base`` counts the code of a git revision too.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from bench.claims import load
from bench.claims.load_ab import export
from bench.common import Servers, table
from tests.servers import require_binary

CASES = {
    "plain": "/bench/plain/",
    "floor": "/bench/floor/counted/",
    "rules": "/bench/rules/counted/",
    "rules-refused": "/bench/rules/counted/",
    "one-rule": "/bench/one/counted/",
    "leaky": "/bench/leaky/counted/",
    "crowd": "/bench/botnet/",
    "crowd-memory": "/bench/botnet/",
}
#: The cases counted unless others are asked for (``leaky``: :mod:`bench.claims.memos`).
DEFAULT_CASES = ("plain", "floor", "rules", "rules-refused")
#: Requests counted in the two runs of a case; the warm-up before them.
N1, N2, WARMUP = 100, 500, 600
#: The crowds a case may be counted for besides the bench's one client (``--clients``):
#: ``new``, a new client on every request; ``zipf``, a Zipf mix (s = :data:`ZIPF_S`) over
#: :data:`ZIPF_N` addresses, most of them seen once or rarely.
WORKLOADS: dict[str, bool | str] = {"one": False, "new": True, "zipf": "zipf"}
ZIPF_N, ZIPF_S = 100_000, 1.1
#: The ``crowd`` case's addresses: more than a process remembers refusals of (25,000), so
#: each of its 429s is a refusal at the counters, as a process's first refusal of an address
#: of the load bench's crowd (20,000 until 2026-12-08, when a process remembered 10,000).
CROWD_N = 30_000
#: The ``crowd-memory`` case's addresses: the load bench's crowd.
CROWD_MEMORY_N = 20_000
T0 = 1_780_000_000.0

#: What runs under valgrind: ``python -c CHILD CASE N``, in the tree to count.
CHILD = """
import gc, io, itertools, os, socket, sys, time
case, n = sys.argv[1], int(sys.argv[2])
from tests.servers import start_memcached
mc = start_memcached()
os.environ["MEMCACHED_SERVERS"] = mc.address
import django
django.setup()
from metrics_app.buffer import flusher
flusher.FLUSH_INTERVAL = 10**6  # no flush while counting
from django.core.handlers.wsgi import WSGIHandler
from ratelimit_app import clock
import ratelimit_app.engine as _engine
REFUSALS = getattr(_engine, "REFUSALS", None)  # (the refusal memory: the runtime's, now)
if REFUSALS is None:
    from ratelimit_app.runtime import RUNTIME
    REFUSALS = RUNTIME.refusals
app = WSGIHandler()
body = b"email=bench%40example.com&password=x"
now = {"t": T0, "step": 0.05}
def tick():
    now["t"] += now["step"]
    return now["t"]
clock.now = tick
def get(path, status="200", client=None):
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "SCRIPT_NAME": "",
        "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "80",
        "HTTP_HOST": "127.0.0.1", "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/x-www-form-urlencoded",
        "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.errors": sys.stderr}
    if client:  # through the trusted proxy (the load bench's botnet)
        environ["HTTP_X_FORWARDED_FOR"] = client
    answered = []
    out = app(environ, lambda s, h, e=None: answered.append(s))
    b"".join(out)
    out.close()
    assert answered[0].startswith(status), (path, answered)
REFUSALS.clear()
if case == "rules-refused":  # another client refused in a flood, and remembered
    now["step"] = 0.001
    get("/bench/flood/", client="10.77.0.1")
    for _ in range(60):  # a process remembers a flood's refusals (50 a second)
        get("/bench/flood/", "429", client="10.77.0.1")
    now["step"] = 0.05
    assert len(REFUSALS)
path = PATHS[case]
for _ in range(WARMUP):
    get(path)
now["step"] = 0.0005
gc.collect()
gc.disable()
for _ in range(n):
    get(path)
gc.enable()
mc.stop()
"""

#: The end of :data:`CHILD` (the warm-up and the counted requests) ...
_COUNTED = """for _ in range(WARMUP):
    get(path)
now["step"] = 0.0005
gc.collect()
gc.disable()
for _ in range(n):
    get(path)
gc.enable()
mc.stop()
"""
#: ... and what replaces it in a run with a set-up, new clients or late counting (the
#: existing cases run :data:`CHILD` as it is, so their counts stay what they were).
_COUNTED_WITH_OPTIONS = """import functools, subprocess, types
# The configuration's looks (every second) and prunes (every minute) on the bench's clock,
# not the machine's: under valgrind a second of the machine's is a few dozen requests, more
# or fewer as the machine is busy, and each look is a round trip.
from ratelimit_app import store
store.time = types.SimpleNamespace(time=time.time, monotonic=lambda: now["t"])
if SETUP:  # the caller's set-up (a database's rows in force, ...), once before the warm-up
    exec(SETUP)
# With CLIENTS, every request from a new client, through the trusted proxy: 10.0.0.1, ...
clients = (f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in itertools.count(1))
STATUS = "200"
if CLIENTS in ("crowd", "crowd-memory"):  # addresses in turn, refused after their first
    size = CROWD_N if CLIENTS == "crowd" else CROWD_MEMORY_N
    crowd = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(1, size + 1)]
    for a in crowd:
        get(path, client=a)
    if CLIENTS == "crowd-memory":  # each refused at the counters once, in a flood: remembered
        now["t"] += 200
        now["step"] = 0.001
        for a in crowd:
            get(path, "429", client=a)
        now["step"] = 0.05
    clients, STATUS = itertools.cycle(crowd), "429"
if CLIENTS == "zipf":  # drawn before: a Zipf mix (s = ZIPF_S) over ZIPF_N addresses
    import random
    ranks = random.Random(37).choices(range(1, ZIPF_N + 1), k=WARMUP + n,
        cum_weights=list(itertools.accumulate(1 / k ** ZIPF_S for k in range(1, ZIPF_N + 1))))
    clients = iter([f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in ranks])
def client():
    return next(clients) if CLIENTS else None
for _ in range(WARMUP):
    get(path, STATUS, client=client())
if LATE:  # instrumented from here (the process so far ran uninstrumented, much faster)
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True,
        capture_output=True)
now["step"] = 0.0005
# None while counting: a look is a per-second cost (a round trip), not a request's, and
# where one falls among the counted requests would move the count by thousands.
frozen = now["t"]
store.time = types.SimpleNamespace(time=time.time, monotonic=lambda: frozen)
store.current()  # looked at now: in force, without a look, for the counted requests
gc.collect()
gc.disable()
if LATE:  # counted inside functools.reduce only (--toggle-collect): these requests exactly
    functools.reduce(lambda _, __: get(path, STATUS, client=client()), range(n), None)
else:
    for _ in range(n):
        get(path, STATUS, client=client())
gc.enable()
mc.stop()
"""
assert CHILD.endswith(_COUNTED)

#: The C function a late count is collected in (the interpreter's ``functools.reduce``,
#: which runs the counted requests and nothing of a request calls).
_COUNTED_IN = "functools_reduce"

#: Run first in a child of layout ``LAYOUT`` > 0: where the interpreter puts what follows.
#: CPython finds a type's attribute through a cache of 4,096 slots indexed by the type's
#: version tag (numbered in the order types are first looked in) and the name's address; two
#: states of one process that touch other types first, or hold more memory, collide in other
#: slots, and a request's count moves by up to ten thousand instructions for nothing it does.
#: A layout shifts both (the tags by types made and looked in, the addresses by objects kept),
#: so a comparison can take each state's median over several layouts.
_LAYOUT = """
_kept = [("x" * (_i % 240), [_i] * (_i % 7)) for _i in range(LAYOUT * 1733)]
for _i in range(LAYOUT * 389):
    type(f"_Layout{_i}", (), {"a": _i}).a  # a version tag each, never given again
"""


def count(
    tree: Path,
    env: dict[str, str],
    case: str,
    n: int,
    out_dir: str,
    warmup: int = WARMUP,
    setup: str = "",
    clients: bool | str = False,
    late: bool = False,
    layout: int = 0,
) -> int:
    """Instructions of one run of ``case`` with ``n`` counted requests, in ``tree``.

    ``setup``: Python run in the child once, after Django's set-up and before the warm-up
    (its names: ``get``, ``app``, ``now``...); ``clients``: every request (warm-up
    included) from a new client address, 10.0.0.1 counting up, in X-Forwarded-For (``"zipf"``:
    from a Zipf mix over :data:`ZIPF_N` addresses, drawn with a fixed seed);
    ``late``: count the counted requests only (``callgrind --instr-atstart=no``, then
    ``callgrind_control -i on`` after the warm-up, and collected inside
    :data:`_COUNTED_IN` only): the start, the set-up and the warm-up run several times
    faster, and the count is of those requests exactly; ``layout``: run
    :data:`_LAYOUT` first with ``LAYOUT = layout`` (0: not)."""
    out = os.path.join(out_dir, f"callgrind.{case}.{n}" + (f".{layout}" if layout else ""))
    child = f"T0 = {T0!r}\nWARMUP = {warmup}\nPATHS = {CASES!r}\n" + CHILD
    if setup or clients or late:
        options = f"SETUP = {setup!r}\nCLIENTS = {clients!r}\nLATE = {late!r}\n"
        options += f"ZIPF_N = {ZIPF_N}\nZIPF_S = {ZIPF_S}\nCROWD_N = {CROWD_N}\n"
        options += f"CROWD_MEMORY_N = {CROWD_MEMORY_N}\n"
        child = child.replace(_COUNTED, options + _COUNTED_WITH_OPTIONS)
    if layout:
        child = f"LAYOUT = {layout}\n" + _LAYOUT + child
    run = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            *(
                ["--instr-atstart=no", "--collect-atstart=no", f"--toggle-collect={_COUNTED_IN}"]
                if late
                else []
            ),
            sys.executable,
            "-c",
            child,
            case,
            str(n),
        ],
        cwd=out_dir,  # not this tree: Django's set-up puts the working directory first
        env={**env, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=False,
    )
    text = Path(out).read_text() if os.path.exists(out) else ""
    found = re.search(r"^summary: (\d+)$", text, re.M)
    if run.returncode != 0 or found is None:
        raise load.LoadError(f"{case} under callgrind failed:\n{run.stderr[-3000:]}")
    return int(found[1])


def per_request(
    tree: Path,
    env: dict[str, str],
    case: str,
    out_dir: str,
    sizes: tuple[int, int, int],
    setup: str = "",
    clients: bool | str = False,
    late: bool = False,
    layout: int = 0,
) -> float:
    """Instructions one request of ``case`` costs in ``tree`` (``sizes``: N1, N2, warm-up;
    ``setup``, ``clients``, ``late`` and ``layout`` as for :func:`count`)."""
    n1, n2, warmup = sizes
    options = (setup, clients, late, layout)
    more = count(tree, env, case, n2, out_dir, warmup, *options)
    return (more - count(tree, env, case, n1, out_dir, warmup, *options)) / (n2 - n1)


Counts = dict[str, dict[tuple[str, str], float]]


def run(
    cases: Sequence[str],
    base: str | None = None,
    sizes: tuple[int, int, int] = (N1, N2, WARMUP),
    workloads: Sequence[str] = ("one",),
    exporters: bool = True,
) -> Counts:
    """Instructions per request of each case for each workload (:data:`WORKLOADS`):
    ``{side: {(case, workload): count}}`` (``head``: this tree; ``base``: the revision
    ``base``, when given, with this tree's bench site). ``sizes``: N1, N2 and the warm-up.
    A crowd's cases count the requests only (``late``). ``exporters=False``: the
    exporters' hooks are taken out after one request (the site installs both libraries'),
    as on a site without them."""
    require_binary("valgrind")
    unknown = [c for c in cases if c not in CASES] + [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(
            f"unknown cases or workloads {unknown}; the cases are {', '.join(CASES)}, "
            f"the workloads {', '.join(WORKLOADS)}"
        )
    with ExitStack() as stack:
        state = stack.enter_context(tempfile.TemporaryDirectory(prefix="bucketry-instr-"))
        url, _ = load.start_database("sqlite", state, stack)
        env = load.site_env(Servers(memcached="", redis=""), url, state)
        load.prepare(env)
        trees = {"head": load.ROOT}
        if base is not None:
            trees["base"] = export(base, state)
            for site in SITE:  # the same site (its rules and URLs), the other revision's code
                shutil.copy(load.ROOT / site, trees["base"] / site)

        def one(tree: Path, case: str, workload: str) -> float:
            crowd = case if case.startswith("crowd") else WORKLOADS[workload]
            out = os.path.join(state, f"{tree.name}-{case}-{workload}")
            os.makedirs(out, exist_ok=True)
            setup = "" if exporters else WITHOUT_EXPORTERS
            return per_request(tree, env, case, out, sizes, setup, crowd, bool(crowd or setup))

        jobs = [(side, c, w) for side in trees for c in cases for w in workloads]
        # Two at a time: each count is one process (valgrind runs one thread at a time).
        with ThreadPoolExecutor(max_workers=2) as pool:
            found = list(pool.map(lambda job: one(trees[job[0]], job[1], job[2]), jobs))
        counts: Counts = {side: {} for side in trees}
        for (side, c, w), n in zip(jobs, found, strict=True):
            counts[side][(c, w)] = n
        return counts


#: Run before the warm-up to count a case without the exporters: one request connects
#: them, then their hooks are taken out.
WITHOUT_EXPORTERS = """get(path)
from ratelimit_app.engine.checking import HOOKS
HOOKS.observers.clear()
HOOKS.trips.clear()
"""
#: The bench site's modules a base revision is counted with (this tree's).
SITE = ("bench/load_site.py", "bench/load_urls.py")


def render(counts: Counts, base: str | None) -> str:
    rows = []
    for case, workload in counts["head"]:
        head = counts["head"][(case, workload)]
        floor = counts["head"].get(("floor", workload))
        row: list[object] = [case, workload, f"{head / 1000:.1f}k"]
        row.append("-" if floor is None or case == "floor" else f"{(head - floor) / 1000:.1f}k")
        if "base" in counts:
            was = counts["base"][(case, workload)]
            row += [f"{was / 1000:.1f}k", f"{head / was:.3f}"]
        rows.append(row)
    header = ["case", "clients", "instructions", "over the floor"]
    if "base" in counts:
        header += [f"base ({base})", "head / base"]
    return table("Instructions per request (callgrind; in-process, deterministic)", header, rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="a git revision to count as well")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated")
    parser.add_argument(
        "--clients",
        default="one",
        help="comma-separated: one (the bench's client), new (a new client every request), "
        "zipf (a Zipf mix over 100,000 addresses)",
    )
    parser.add_argument(
        "--without-exporters",
        action="store_true",
        help="take the exporters' hooks out (the site installs both libraries')",
    )
    args = parser.parse_args(argv)
    counts = run(
        args.cases.split(","),
        args.base,
        workloads=args.clients.split(","),
        exporters=not args.without_exporters,
    )
    print(render(counts, args.base))


if __name__ == "__main__":
    main()
