"""Bans and overrides at a crowd's size: what a request pays for them, what a new one costs.

A site under attack may hold a hundred thousand bans, and a busy one ten thousand overrides;
neither may make the requests of everyone else dearer, nor a new ban slow every process.
Both halves run demo_site with the load bench's URLs and rules (:mod:`bench.load_site`) on
an SQLite file, in-process (Django's WSGI handler), its rows written with ``bulk_create``
before the process starts (no signals: as if they had been made over weeks).

**Instructions per request** (callgrind, as :mod:`bench.instructions` counts them): the
``rules`` case (``/bench/rules/counted/``: three rules and visit counting), every request
from a new client address (10.0.0.1 counting up, in ``X-Forwarded-For``, as the load bench's
botnet: no address is seen twice, so nothing a process remembers of a subject helps), with
the database holding

* nothing;
* **a crowd**: 100,000 bans in force (on the bench's rules and the demo's ``shorturl-scan``:
  half of them a limit's own, under random keys as hashed subjects are; half on every path,
  of addresses in 172.16.0.0/12, keyed and sealed as the limiter keeps them) and 10,000
  overrides (on the bench's rules: addresses, emails and usernames that no client of the
  bench is), all last changed a day before;
* **a network**: one override on a /24 network (172.16.0.0/24) of ``bench-ip-m``, holding
  no client;
* **networks**: 1,000 overrides on /24 networks (172.16.0.0/24, 172.16.1.0/24, ...) of
  ``bench-ip-m``, none holding a client.

The snapshot is loaded before the warm-up. The crowd's cost is given over nothing's: what a
request of a subject with neither a ban nor an override pays for the others', at most
+10,000 instructions (issue 35). The networks' is given over the one network's: a look-up by
prefix length costs the same for a thousand networks as for one (a walk of the networks
grows with them), so the bound is the layouts' spread, +2,500.

Every state is counted in five layouts of the interpreter (:data:`LAYOUTS`: CPython's
attribute cache moves a count by up to ten thousand instructions with where the types and
names of a process fall, which a state's rows change) and given as its median. The
configuration's looks run on the bench's clock, so the counts do not depend on the machine's
speed (:mod:`bench.instructions`).

**A new ban or override** (wall time, ``time.perf_counter``, no valgrind): a process holding
the state's rows makes one change through the public paths, a ban through
:func:`ratelimit_app.operators.operations.ban` (the admin's: the row written, every process told)
or an override through ``Override.objects.create`` (its ``post_save`` tells every process), and
times either the configuration's next look (``store.current()``) or the next request (a
request of the subject just banned or overridden, which must be refused or get the override's
rate: the change is in force). The change is made in the same process, as if another had
made it. Medians of ``changes`` changes each; for scale, a request with no change, and a
look with no change (the process's look a second at the version counters, made anyway:
before each change, the snapshot's deadline passed). What a change costs a process, the
target (at most :data:`TARGET_MS`), is its look over a look with none: reading the rows
changed and taking them in. The next request shows it in force. And the
memory the process holds for the rows (``tracemalloc``, around the snapshot's first load,
over the same with no rows). Timed: nothing, 1,000 and 10,000 bans (a hundredth and a
tenth of the crowd's), the crowd.

The instructions are counted in the counted requests only (``callgrind --instr-atstart=no``
and a collection toggled around them: the start, the rows' loading and the warm-up run
uninstrumented, several times faster).

Run: ``python -m bench.claims.crowd_controls [--base REV] [--quick]``. Needs valgrind
(Debian's ``valgrind``) for the first half.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bench import instructions
from bench.claims import load
from bench.claims.load_ab import export
from bench.common import Servers, table
from tests.servers import require_binary

BANS = 100_000
OVERRIDES = 10_000
NETWORKS = 1_000
#: The crowd's bans are on these limits (the bench's rules and the demo's).
BAN_LIMITS = (*load.BENCH_RULES, "shorturl-scan")
#: Instructions a request of a subject with neither may pay for the others' (issue 35).
TARGET_INSTRUCTIONS = 10_000
#: Instructions a thousand networks may cost over one: none, but for the layouts' spread.
TARGET_GROWTH = 2_500
#: The layouts each state is counted in (:data:`bench.instructions._LAYOUT`): the interpreter's
#: attribute cache makes a state's count move by up to ten thousand instructions with where
#: its types and names happen to fall, so each state's figure is its median over these.
LAYOUTS = (0, 1, 2, 3, 4)
#: Milliseconds a new ban or override may cost a process holding the crowd (issue 35).
TARGET_MS = 1.0
#: The counted runs (N1, N2 requests) and the warm-up of each state (the counts are of the
#: counted requests exactly: two runs of one layout agree within a few instructions).
SIZES = (100, 500, 300)
#: Changes timed per measure (ban or override; the next look or the next request).
CHANGES = 20
#: The same with ``--quick`` (a smoke check: the same rows, fewer requests and changes).
QUICK_SIZES, QUICK_CHANGES = (20, 60, 40), 4
CASE = "rules"
PATH = instructions.CASES[CASE]


@dataclass(frozen=True)
class State:
    """Rows in the database: ``bans`` (``site``: half of them site-wide), ``overrides`` of
    values nobody is, and ``networks``: overrides on /24 networks."""

    name: str
    bans: int = 0
    overrides: int = 0
    networks: int = 0


def states(bans: int, overrides: int, networks: int) -> dict[str, State]:
    """The states counted in instructions: nothing, the crowd, one network, the networks."""
    return {
        "nothing": State("nothing"),
        "crowd": State(f"{bans:,} bans + {overrides:,} overrides", bans, overrides),
        "network": State("1 override on a /24 network", networks=1),
        "networks": State(f"{networks:,} overrides on /24 networks", networks=networks),
    }


#: What each state is measured against, and the most it may cost over it (issue 35): the
#: crowd against nothing; the networks against one network (a look-up by prefix length,
#: not a walk of the networks, costs the same for one as for a thousand).
BOUNDS = {"crowd": ("nothing", TARGET_INSTRUCTIONS), "networks": ("network", TARGET_GROWTH)}


def timed_states(bans: int, overrides: int) -> list[State]:
    """The states timed: nothing, a hundredth and a tenth of the bans (from 1,000: today's
    figures in issue 35), the crowd."""
    found = [State("nothing")]
    for part in (bans // 100, bans // 10):
        if part >= 1000:
            found.append(State(f"{part:,} bans", part))
    found.append(State(f"{bans:,} bans + {overrides:,} overrides", bans, overrides))
    return found


#: Run in a Django process of the bench's settings: the state's rows, without signals.
SEED = """
import datetime as dt, ipaddress, random
from django.utils import timezone
from ratelimit_app.models import Ban, Override
rng = random.Random(35)
now = timezone.now()
start = max(now, dt.datetime.fromtimestamp(T0, dt.UTC))  # the bench's clock, or later
until = start + dt.timedelta(days=30)
from ratelimit_app.bans.applied import site_key
from ratelimit_app.identity.sealing import seal
def address(i):  # a banned address on every path: none of the bench's clients (10.x)
    return f"172.{16 + (i >> 16 & 15)}.{i >> 8 & 255}.{i & 255}"
Ban.objects.bulk_create(
    Ban(limit=BAN_LIMITS[i % len(BAN_LIMITS)], site=i % 2 == 0,
        key=site_key(address(i)) if i % 2 == 0 else "{%032x}" % rng.getrandbits(128),
        sealed=seal(address(i)) if i % 2 == 0 else "", kind="ip", label="",
        seconds=30 * 86400, banned_at=now, until=until, remembered_until=until)
    for i in range(BANS)
)
def subject(k):  # an address, an email, a username: no client of the bench
    return (f"192.168.{k >> 8 & 255}.{k & 255}", f"user{k}@example.org", f"user-{k}")[k // 3 % 3]
rows = [Override(limit=RULES[k % len(RULES)], subject=subject(k), rate="10/m")
        for k in range(OVERRIDES)]
first = int(ipaddress.ip_address("172.16.0.0"))
rows += [Override(limit=RULES[0], subject=str(ipaddress.ip_network((first + 256 * k, 24))),
                  rate="10/m") for k in range(NETWORKS)]
Override.objects.bulk_create(rows)
# Made over the last month, not all in this second: each row's last change a day ago.
earlier = now - dt.timedelta(days=1)
Ban.objects.update(changed=earlier)
Override.objects.update(changed=earlier)
assert (Ban.objects.count(), Override.objects.count()) == (BANS, OVERRIDES + NETWORKS)
"""


def _django(tree: Path, env: dict[str, str], code: str) -> None:
    """Run ``code`` in a Django process of the bench's settings, on the code of ``tree``
    (its migrations too: Django's set-up puts the working directory first)."""
    out = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise load.LoadError(f"Django subprocess failed:\n{out.stdout}{out.stderr[-3000:]}")


def _seed(tree: Path, env: dict[str, str], state: State) -> None:
    code = (
        f"T0 = {instructions.T0!r}\nBAN_LIMITS = {BAN_LIMITS!r}\n"
        f"RULES = {load.BENCH_RULES!r}\nBANS = {state.bans}\n"
        f"OVERRIDES = {state.overrides}\nNETWORKS = {state.networks}\n" + SEED
    )
    _django(tree, env, f"exec({code!r})")


#: Run in the instructions child before its warm-up: the rows are there, and in force.
WARM = """
from ratelimit_app import store
from ratelimit_app.models import Ban, Override
assert (Ban.objects.count(), Override.objects.count()) == ROWS, ROWS
store.current()
"""

#: What is timed: ``python -c TIMING CHANGES``, in a Django process of the bench's settings.
TIMING = """
import gc, io, json, os, statistics, sys, time, tracemalloc
changes = int(sys.argv[1])
from tests.servers import start_memcached
mc = start_memcached()
os.environ["MEMCACHED_SERVERS"] = mc.address
import django
django.setup()
from metrics_app.buffer import flusher
flusher.FLUSH_INTERVAL = 10**6  # no flush while timing
from django.core.handlers.wsgi import WSGIHandler
from ratelimit_app.operators import operations
from ratelimit_app import store
from ratelimit_app.models import Ban, Override
app = WSGIHandler()
body = b"email=bench%40example.com&password=x"
def get(client, status="200"):
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": PATH, "SCRIPT_NAME": "",
        "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "80",
        "HTTP_HOST": "127.0.0.1", "REMOTE_ADDR": "127.0.0.1",
        "HTTP_X_FORWARDED_FOR": client,
        "CONTENT_TYPE": "application/x-www-form-urlencoded",
        "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.errors": sys.stderr}
    answered = []
    out = app(environ, lambda s, h, e=None: answered.append((s, dict(h))))
    b"".join(out)
    out.close()
    assert answered[0][0].startswith(status), (client, answered)
    return answered[0][1]
seen = iter(range(1, 10**6))
def new_client():
    i = next(seen)
    return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
list(Ban.objects.all()[:1]), list(Override.objects.all()[:1])  # connected, models ready
gc.collect()
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
store.current()
gc.collect()
held = tracemalloc.get_traced_memory()[0] - before
tracemalloc.stop()
for _ in range(50):
    get(new_client())
def ms(fn):
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000
plain = [ms(lambda: get(new_client())) for _ in range(changes)]
def ban(i):
    subject = f"198.18.{i >> 8 & 255}.{i & 255}"
    assert operations.ban(RULE, subject, 3600) is not None
    return lambda: get(subject, "429")
def override(i):
    subject = f"198.19.{i >> 8 & 255}.{i & 255}"
    Override.objects.create(limit=RULE, subject=subject, rate="10/m")
    def check():
        policy = get(subject)["RateLimit-Policy"]
        assert f'"{RULE}:10/m";q=10;' in policy + ";", policy
    return check
from ratelimit_app.runtime import RUNTIME
def idle():  # the look a process makes every second anyway: the version counters, no change
    RUNTIME.snapshot.deadline = 0.0
    return ms(store.current)
found = {"held": held, "plain": statistics.median(plain)}
idles = []
for name, change in (("ban", ban), ("override", override)):
    look, first = [], []
    for i in range(2 * changes):
        idles.append(idle())
        check = change(i)
        if i % 2:  # the next request (it looks at the configuration itself)
            first.append(ms(check))
        else:  # the configuration's next look; then the change is in force
            look.append(ms(store.current))
            check()
    found[name] = [statistics.median(look), statistics.median(first)]
found["idle"] = statistics.median(idles)
print(json.dumps(found))
mc.stop()
"""


@dataclass(frozen=True)
class Timed:
    """One timed state: the memory its rows hold (bytes), a request's median with no
    change (ms), and after a new ban and a new override, the next look's and the next
    request's medians (ms)."""

    state: State
    held: int
    plain_ms: float
    ban_ms: tuple[float, float]
    override_ms: tuple[float, float]
    #: A look with no change (ms): the version counters read, as every second.
    idle_ms: float = 0.0

    def change_ms(self) -> float:
        """What a new ban or override costs the process (ms), the worse of the two: its
        look over a look with no change (which the process makes every second anyway)."""
        return max(self.ban_ms[0], self.override_ms[0]) - self.idle_ms


@dataclass(frozen=True)
class Report:
    #: Instructions per request by state (:func:`states`' keys), one count per layout.
    counts: dict[str, list[float]]
    names: dict[str, str]
    timed: list[Timed]
    changes: int

    def median(self, state: str) -> float:
        """A state's instructions per request: its median over the layouts."""
        return statistics.median(self.counts[state])

    def over(self, state: str) -> float:
        """What ``state`` costs over the state it is measured against (:data:`BOUNDS`)."""
        return self.median(state) - self.median(BOUNDS[state][0])


def _database(state_dir: str, template: str, name: str) -> tuple[str, str]:
    """A copy of the migrated database ``template``, named ``name``: its URL and its path."""
    path = os.path.join(state_dir, f"{name}.sqlite3")
    with sqlite3.connect(template) as source, sqlite3.connect(path) as copy:
        source.backup(copy)
    return f"sqlite:///{path}", path


def _time_state(tree: Path, env: dict[str, str], state: State, changes: int, cwd: str) -> Timed:
    """Time ``changes`` changes of each kind in a process of ``tree`` on the rows of
    ``state`` (written in the database of ``env``)."""
    child = f"PATH = {PATH!r}\nRULE = {load.BENCH_RULES[0]!r}\n" + TIMING
    out = subprocess.run(
        [sys.executable, "-c", child, str(changes)],
        cwd=cwd,  # not this tree: Django's set-up puts the working directory first
        env={**env, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if out.returncode != 0:
        raise load.LoadError(f"timing child failed:\n{out.stderr[-3000:]}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    ban, override = found["ban"], found["override"]
    return Timed(
        state,
        found["held"],
        found["plain"],
        (ban[0], ban[1]),
        (override[0], override[1]),
        found["idle"],
    )


def run(
    bans: int = BANS,
    overrides: int = OVERRIDES,
    networks: int = NETWORKS,
    sizes: tuple[int, int, int] = SIZES,
    changes: int = CHANGES,
    base: str | None = None,
    layouts: tuple[int, ...] = LAYOUTS,
) -> Report:
    """Both halves on this tree (or on the git revision ``base``), the instructions in each
    of ``layouts``."""
    require_binary("valgrind")
    counted = states(bans, overrides, networks)
    with ExitStack() as stack:
        state_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bucketry-crowd-"))
        tree = load.ROOT if base is None else export(base, state_dir)
        template = os.path.join(state_dir, "template.sqlite3")
        env = load.site_env(
            Servers(memcached="", redis=""), f"sqlite:///{template}", state_dir, tree
        )
        _django(
            tree,
            env,
            "from django.core.management import call_command; "
            "call_command('migrate', verbosity=0, interactive=False)",
        )

        envs = {}
        for key, state in counted.items():
            url, _ = _database(state_dir, template, key)
            envs[key] = {**env, "DATABASE_URL": url}
            _seed(tree, envs[key], state)

        def count(job: tuple[str, int]) -> float:
            key, layout = job
            state = counted[key]
            out_dir = os.path.join(state_dir, f"{key}-{layout}")
            os.mkdir(out_dir)
            rows = (state.bans, state.overrides + state.networks)
            setup = f"ROWS = {rows!r}\n" + WARM
            return instructions.per_request(
                tree, envs[key], CASE, out_dir, sizes, setup, True, True, layout
            )

        # Two at a time: each count is one process (valgrind runs one thread at a time).
        jobs = [(key, layout) for layout in layouts for key in counted]
        with ThreadPoolExecutor(max_workers=2) as pool:
            found = dict(zip(jobs, pool.map(count, jobs), strict=True))
        counts = {key: [found[(key, layout)] for layout in layouts] for key in counted}
        timed = []
        for i, state in enumerate(timed_states(bans, overrides)):
            url, _ = _database(state_dir, template, f"timed-{i}")
            state_env = {**env, "DATABASE_URL": url}
            _seed(tree, state_env, state)
            timed.append(_time_state(tree, state_env, state, changes, state_dir))
    names = {key: state.name for key, state in counted.items()}
    return Report(counts, names, timed, changes)


def render(report: Report) -> str:
    rows: list[list[object]] = []
    for key in report.counts:
        cost = report.median(key)
        spread = ", ".join(f"{c / 1000:.1f}k" for c in report.counts[key])
        if key not in BOUNDS:
            rows.append([report.names[key], f"{cost / 1000:.1f}k", spread, "-", "-", "-"])
            continue
        against, bound = BOUNDS[key]
        over = report.over(key)
        rows.append(
            [
                report.names[key],
                f"{cost / 1000:.1f}k",
                spread,
                f"{over:+,.0f} over {report.names[against]}",
                f"<= +{bound:,}",
                "yes" if over <= bound else "NO",
            ]
        )
    first = table(
        "A request from a new address, beside others' bans and overrides "
        "(callgrind, instructions per request: the median of the layouts)",
        ["database", "instructions", "by layout", "over", "target", "met"],
        rows,
    )
    timed_rows: list[list[object]] = []
    for t in report.timed:
        timed_rows.append(
            [
                t.state.name,
                f"{(t.held - report.timed[0].held) / 1e6:.1f}",
                f"{t.plain_ms:.2f}",
                f"{t.idle_ms:.2f}",
                *(f"{v:.2f}" for v in (*t.ban_ms, *t.override_ms)),
                f"{t.change_ms():.2f}",
            ]
        )
    # What a change costs: its look over a look with none (the process's look a second).
    worst = report.timed[-1].change_ms()
    second = table(
        f"A new ban or override, in a process holding the rows (ms, median of "
        f"{report.changes} changes each; target at the crowd: a change's look over a look "
        f"with none <= {TARGET_MS:g} ms, {'met' if worst <= TARGET_MS else 'NOT met'})",
        [
            "database",
            "MB held (over nothing)",
            "request, no change",
            "look, no change",
            "ban: next look",
            "ban: next request",
            "override: next look",
            "override: next request",
            "a change costs",
        ],
        timed_rows,
    )
    return first + "\n\n" + second


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="measure this git revision's code instead")
    parser.add_argument("--quick", action="store_true", help="a short run (smoke check)")
    args = parser.parse_args(argv)
    if args.quick:
        report = run(sizes=QUICK_SIZES, changes=QUICK_CHANGES, base=args.base, layouts=(0,))
    else:
        report = run(base=args.base)
    print(render(report))


if __name__ == "__main__":
    main()
