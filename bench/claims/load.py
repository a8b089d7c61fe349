"""Requests per second of demo_site under gunicorn, measured with wrk on loopback.

One run starts everything on free loopback ports: memcached and Redis
(:func:`bench.common.throwaway_servers`), PostgreSQL (``--db postgres``, the default) or an
SQLite file (``--db sqlite``), and gunicorn with 4 sync workers serving demo_site with
``DEBUG`` off and the bench's settings (:mod:`bench.load_site`: the demo's, plus the URLs of
:mod:`bench.load_urls` and three rules). The rate-limit counters are in memcached (the demo's
``MEMCACHED_SERVERS``), the default cache and Celery's broker in Redis; visits are buffered in
each worker and flushed to the database every 10 s and at SIGTERM (the demo's settings).

Cases, each a wrk run (1 thread, 8 connections) against one URL:

* **plain view**: ``POST /bench/plain/`` (a login-like form: the view reads ``email`` and
  answers ``ok``), through the demo's whole middleware stack, RatelimitMiddleware included
  (no rule covers the path);
* **+ visit counting**: the same view under ``count_visits`` (``metrics_app``);
* **+ 3 rules**: the same view behind three ``RATELIMIT_RULES``, ``ip`` per minute,
  ``email`` per hour, ``ip`` per day;
* **+ 3 rules + visit counting**: both; its cost is compared with the three
  django-ratelimit decorators' (:data:`TARGET`; the first target, under 25% of a plain
  request's throughput, is retired: docs/performance says why);
* **floor: 1 round trip + visit counting**: the counted view behind
  :class:`bench.load_floor.RoundTripFloor` instead of the rules: the memcached commands of
  the three rules in one round trip and headers of the same length, nothing decided. What
  the target case costs beyond it is the limiter's own work;
* **+ 3 django-ratelimit decorators**: the plain view under three stacked django-ratelimit
  4.1 decorators with the same keys and rates (``ip``, ``post:email``, ``ip``), on the same
  memcached (``RATELIMIT_USE_CACHE``, which both read);
* **demo log-in page, GET (for scale)**: a real page of the demo (a template, a CSRF token;
  no rule covers a GET), to set the limiter's cost beside a page that does some work;
* **/s/<key> redirect**: the demo's short link (a database read, the demo's ``shorturl-scan``
  rule checked before the view, the visit counted in ``shorturl:<key>``), ``GET``.

wrk sends every request from 127.0.0.1 (one subject), so every limit is huge (10^9 per
window): nothing is refused and every check does its full work. Each case is warmed up once
(and its answer checked: status, ``RateLimit`` headers where rules apply), then timed in
``rounds`` rounds of ``seconds`` each (:data:`RUN_ORDER`: the target case right after the
plain view), the order reversed every other round; the table gives the medians over the
rounds. A case's **cost** is ``1 - rps / plain rps`` with the plain
view's rps of the same round, median over the rounds: the share of the plain request's
throughput the limiter or the counting takes. The machine may be shared, so each run also
counts CPU time (Linux ``/proc``): the user and system time of gunicorn, memcached, Redis and
wrk per answered request, its **CPU cost** against the plain view's, and the share of the
machine's CPU other processes took meanwhile (PostgreSQL's among them). The site is
CPU-bound (8 connections, 4 workers), so on a quiet machine both costs estimate the same
share. A second table splits the CPU per request by process (the site's gunicorn workers,
memcached, Redis, wrk), so the share of the site's own Python and of the counter servers in
a case's cost can be read apart. The database keeps its connections (``CONN_MAX_AGE``, see
:mod:`bench.load_site`).
After a graceful stop, the visits stored are compared with the responses wrk counted (a
request still in flight when a wrk run stops may be served and counted without wrk seeing
its answer).

The crowd (20,000 addresses in turn, each run going on where the last stopped) is warmed up
for :data:`CROWD_WARMUP` seconds, and the rates of its warm-up are shown: its steady state is
each worker answering from its refusal memory, reached once every worker has met every
address.

Run: ``python -m bench.claims.load [--rounds 6 --seconds 5 --warmup 3 --crowd-warmup 240
--db postgres]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import Servers, table, throwaway_servers
from tests.servers import free_port, gunicorn_argv, require_binary, start_postgres

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "bench.load_site"
WORKERS = 4
WRK_THREADS = 1
CONNECTIONS = 8
#: Target: what the three rules plus visit counting cost, at most this share of what three
#: django-ratelimit decorators cost, in the same run (a cost is the share of the plain view's
#: throughput a case takes).
TARGET = 0.5
#: Targets of a flood, nearly every request refused: refusals served at least this share of
#: the plain view's throughput...
FLOOD_TARGET = 0.9
#: ... and at least this many times django-ratelimit's refusals (its 403s).
FLOOD_PEER_TARGET = 1.8
#: A crowd's 429s at least this share of the plain view's throughput (issue 37).
CROWD_TARGET = 0.85
#: The botnet's clients, each over its limit; a crowd's (issue 37's flood of 20,000
#: addresses, most of them new to a process's memos).
BOTNET_CLIENTS = 200
CROWD_CLIENTS = 20_000
#: Seconds the crowd is sent before it is timed (in runs of 30 s): each address admitted,
#: then met by each worker (every address comes back to a worker about once a minute).
CROWD_WARMUP = 240
LINK_KEY = "bench"
LINK_URL = "https://example.com/"
FORM = "email=bench%40example.com&password=x"
BENCH_RULES = ("bench-ip-m", "bench-email-h", "bench-ip-d")
#: The rules whose headers an admitted answer carries: those that count the client itself
#: (the email rule counts a value the request names: docs/rules.rst, "Headers on admitted
#: requests").
BENCH_SHOWN = ("bench-ip-m", "bench-ip-d")
START_TIMEOUT = 60.0


@dataclass(frozen=True)
class Case:
    name: str
    label: str
    path: str
    post: bool = True
    #: The series its responses are counted in (None: not counted).
    series: str | None = None
    #: Rules whose ``RateLimit`` headers every answer carries.
    rules: tuple[str, ...] = ()
    status: int = 200
    #: Clients it sends as (X-Forwarded-For from a trusted proxy); 1: the connection's own.
    clients: int = 1

    @property
    def refused(self) -> bool:
        """Nearly every answer is a refusal (a flood): those are not errors."""
        return self.status >= 400


CASES = (
    Case("plain", "plain view", "/bench/plain/"),
    Case("counted", "+ visit counting", "/bench/counted/", series="bench:visits"),
    Case("rules", "+ 3 rules (RatelimitMiddleware)", "/bench/rules/", rules=BENCH_SHOWN),
    Case(
        "rules+counted",
        "+ 3 rules + visit counting",
        "/bench/rules/counted/",
        series="bench:visits",
        rules=BENCH_SHOWN,
    ),
    Case(
        "floor",
        "floor: 1 round trip + visit counting",
        "/bench/floor/counted/",
        series="bench:visits",
        rules=BENCH_SHOWN,
    ),
    Case("django-ratelimit", "+ 3 django-ratelimit decorators", "/bench/django-ratelimit/"),
    Case(
        "redirect",
        "/s/<key> redirect, counted (demo)",
        f"/s/{LINK_KEY}",
        post=False,
        series=f"shorturl:{LINK_KEY}",
        rules=("shorturl-scan",),
        status=302,
    ),
    Case("page", "demo log-in page, GET (for scale)", "/accounts/login/", post=False),
    Case(
        "flood",
        "flood: 1 client over a rule (429)",
        "/bench/flood/",
        rules=("bench-flood",),
        status=429,
    ),
    Case(
        "botnet",
        f"botnet: {BOTNET_CLIENTS} clients over a rule (429)",
        "/bench/botnet/",
        rules=("bench-botnet",),
        status=429,
        clients=BOTNET_CLIENTS,
    ),
    Case(
        "crowd",
        f"crowd: {CROWD_CLIENTS} clients over a rule (429)",
        "/bench/botnet/",
        rules=("bench-botnet",),
        status=429,
        clients=CROWD_CLIENTS,
    ),
    Case(
        "django-ratelimit-flood",
        "flood: 1 client over a django-ratelimit decorator (403)",
        "/bench/django-ratelimit/flood/",
        status=403,
    ),
)
TARGET_CASE = "rules+counted"
#: The order the cases run in, reversed every other round: the target right after the
#: plain view, so the pair a round compares is timed back to back (a shared machine drifts
#: by more than the difference between two cases within a minute).
RUN_ORDER = (
    "plain",
    "flood",
    "django-ratelimit-flood",
    "botnet",
    "crowd",
    TARGET_CASE,
    "floor",
    "rules",
    "counted",
    "django-ratelimit",
    "redirect",
    "page",
)


class LoadError(RuntimeError):
    """The site did not start, or answered a case wrongly."""


@dataclass(frozen=True)
class WrkResult:
    """What one wrk run reports."""

    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    #: Non-2xx/3xx answers.
    non_2xx: int = 0
    #: Socket errors (connect, read, write, timeout).
    socket_errors: int = 0

    @property
    def errors(self) -> int:
        return self.non_2xx + self.socket_errors


@dataclass(frozen=True)
class Sample:
    """One timed wrk run of a case, and the CPU it took."""

    wrk: WrkResult
    #: CPU time (user + system) of the site, its servers and wrk, per answered request.
    cpu_ms: float
    #: Share of the machine's CPU that other processes used meanwhile (0..1).
    others: float
    #: ``cpu_ms`` by part (:data:`CPU_PARTS`): the site (gunicorn and its workers),
    #: memcached, Redis, wrk.
    cpu_parts: dict[str, float] = field(default_factory=dict)


@dataclass
class Row:
    case: Case
    runs: list[Sample] = field(default_factory=list)
    #: Per round: 1 - rps / plain rps.
    costs: list[float] = field(default_factory=list)
    #: Per round: 1 - plain CPU per request / CPU per request.
    cpu_costs: list[float] = field(default_factory=list)
    #: The warm-up's runs (rps each): a crowd's first pass is not its steady state.
    warmups: list[float] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return statistics.median(r.wrk.rps for r in self.runs)

    @property
    def p50_ms(self) -> float:
        return statistics.median(r.wrk.p50_ms for r in self.runs)

    @property
    def p99_ms(self) -> float:
        return statistics.median(r.wrk.p99_ms for r in self.runs)

    @property
    def cpu_ms(self) -> float:
        return statistics.median(r.cpu_ms for r in self.runs)

    def cpu_part(self, part: str) -> float:
        """Median CPU milliseconds per request of one part (:data:`CPU_PARTS`)."""
        return statistics.median(r.cpu_parts.get(part, 0.0) for r in self.runs)

    @property
    def cost(self) -> float:
        return statistics.median(self.costs) if self.costs else 0.0

    @property
    def cpu_cost(self) -> float:
        return statistics.median(self.cpu_costs) if self.cpu_costs else 0.0

    @property
    def errors(self) -> int:
        """Socket errors, and answers other than the case's kind (a refusal where the case
        serves, a success where it refuses: wrk counts the non-2xx/3xx)."""
        wrong = (
            sum(r.wrk.requests - r.wrk.non_2xx for r in self.runs)
            if self.case.refused
            else sum(r.wrk.non_2xx for r in self.runs)
        )
        # A flood client's first request of the run is admitted (warm-up admits most).
        allowed = len(self.runs) * self.case.clients if self.case.refused else 0
        return sum(r.wrk.socket_errors for r in self.runs) + max(0, wrong - allowed)

    def ratios(self, other: Row) -> list[float]:
        """This case's rps over ``other``'s in each round (the same round each)."""
        return [a.wrk.rps / b.wrk.rps for a, b in zip(self.runs, other.runs, strict=True)]

    def ratio(self, other: Row) -> float:
        """This case's rps over ``other``'s, median over the rounds (same round each)."""
        return statistics.median(self.ratios(other))


@dataclass
class Report:
    rows: list[Row]
    rounds: int
    seconds: int
    database: str
    #: Per series: (visits stored after the graceful stop, responses wrk and the checks saw).
    visits: dict[str, tuple[int, int]]
    #: Responses a series may hold beyond what wrk saw: one per connection and wrk run.
    slack: dict[str, int]

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.case.name == name)

    @property
    def others(self) -> list[float]:
        """Other processes' share of the machine's CPU in every timed run."""
        return [sample.others for row in self.rows for sample in row.runs]

    @property
    def cost_ratio(self) -> float:
        """The three rules' and counting's cost over three django-ratelimit decorators'."""
        peer = self.row("django-ratelimit").cost
        return self.row(TARGET_CASE).cost / peer if peer > 0 else float("inf")

    @property
    def cost_ratios(self) -> list[float]:
        """:attr:`cost_ratio` in each round (both costs against that round's plain view)."""
        return [
            mine / peer if peer > 0 else float("inf")
            for mine, peer in zip(
                self.row(TARGET_CASE).costs, self.row("django-ratelimit").costs, strict=True
            )
        ]

    def _measures(self) -> list[tuple[str, float, str, bool, list[float]]]:
        """(what, measured, target, met, the ratio in each round) of every target."""
        plain, flood = self.row("plain"), self.row("flood")
        botnet, peer = self.row("botnet"), self.row("django-ratelimit-flood")
        crowd = self.row("crowd")
        target = self.row(TARGET_CASE)
        return [
            (
                "3 rules + counting cost / 3 django-ratelimit decorators' cost",
                self.cost_ratio,
                f"<= {TARGET}x",
                self.cost_ratio <= TARGET and not target.errors,
                self.cost_ratios,
            ),
            *(
                (
                    what,
                    row.ratio(other),
                    f">= {goal}x",
                    row.ratio(other) >= goal and not row.errors,
                    row.ratios(other),
                )
                for what, row, other, goal in (
                    ("flood: 429s / plain view rps", flood, plain, FLOOD_TARGET),
                    (
                        f"botnet ({BOTNET_CLIENTS} clients): 429s / plain view rps",
                        botnet,
                        plain,
                        FLOOD_TARGET,
                    ),
                    (
                        f"crowd ({CROWD_CLIENTS} clients): 429s / plain view rps",
                        crowd,
                        plain,
                        CROWD_TARGET,
                    ),
                    ("flood: our 429s / django-ratelimit's 403s", flood, peer, FLOOD_PEER_TARGET),
                )
            ),
        ]

    def targets(self) -> list[tuple[str, float, str, bool]]:
        """(what, measured, target, met) of every target of the run."""
        return [(what, value, goal, met) for what, value, goal, met, _ in self._measures()]

    def spreads(self) -> list[tuple[float, float]]:
        """(lowest, highest) over the rounds of each target's ratio, in the order of
        :meth:`targets`: how far one round's measure strays from the run's median."""
        return [(min(each), max(each)) for *_, each in self._measures()]

    @property
    def met(self) -> bool:
        return all(met for *_, met in self.targets())


# -- wrk ----------------------------------------------------------------------------------------

_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def parse_wrk(output: str) -> WrkResult:
    """The numbers of wrk's ``--latency`` report."""
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", output, re.M)
    p50 = re.search(r"^\s+50%\s+(\S+)", output, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", output, re.M)
    done = re.search(r"^\s+(\d+) requests in", output, re.M)
    if not (rps and p50 and p99 and done):
        raise LoadError(f"unexpected wrk output:\n{output}")
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    sockets = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    return WrkResult(
        rps=float(rps.group(1)),
        p50_ms=_ms(p50.group(1)),
        p99_ms=_ms(p99.group(1)),
        requests=int(done.group(1)),
        non_2xx=int(bad.group(1)) if bad else 0,
        socket_errors=sum(int(n) for n in sockets.groups()) if sockets else 0,
    )


def run_wrk(
    wrk: str, url: str, seconds: int, script: str | None, args: Sequence[str] = ()
) -> WrkResult:
    """One wrk run of ``seconds`` against ``url`` (``script``, given ``args``)."""
    argv = [wrk, f"-t{WRK_THREADS}", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency"]
    argv += ["--timeout", "10s"]
    if script:
        argv += ["-s", script]
    argv.append(url)
    if args:
        argv += ["--", *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False)
    if out.returncode != 0:
        raise LoadError(f"wrk failed (exit {out.returncode}):\n{out.stdout}{out.stderr}")
    return parse_wrk(out.stdout)


# -- CPU accounting (Linux /proc) ----------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


#: Process names (``/proc/<pid>/comm``) of the servers the CPU breakdown shows apart; every
#: other descendant (gunicorn and its workers, Django commands) is the site.
SERVER_PARTS = {"memcached": "memcached", "redis-server": "Redis"}
#: The columns of the CPU breakdown, in order.
CPU_PARTS = ("site", "memcached", "Redis", "wrk")


def descendant_ticks(root: int) -> dict[str, int]:
    """CPU ticks (user + system) of the live descendants of ``root`` (the site and its
    servers), by part: ``site``, ``memcached``, ``Redis``."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()
        pid = int(entry)
        parents[pid] = int(fields[1])
        ticks[pid] = int(fields[11]) + int(fields[12])
        names[pid] = text[text.index("(") + 1 : text.rindex(")")]
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    parts = dict.fromkeys(CPU_PARTS[:-1], 0)
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        parts[SERVER_PARTS.get(names[pid], "site")] += ticks[pid]
        todo += children.get(pid, [])
    return parts


def _machine_ticks() -> tuple[int, int]:
    """Busy and total CPU ticks of the machine (all cores) since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal
    return total - idle, total


def _waited_children_ticks() -> float:
    """CPU ticks of the children this process has waited for (wrk, once it has ended)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * CLOCK_TICKS


@dataclass(frozen=True)
class CpuMark:
    #: Ticks by part (:data:`CPU_PARTS`).
    parts: dict[str, float]
    busy: int
    total: int

    @property
    def ours(self) -> float:
        return sum(self.parts.values())

    @classmethod
    def now(cls) -> CpuMark:
        busy, total = _machine_ticks()
        parts: dict[str, float] = dict(descendant_ticks(os.getpid()))
        parts["wrk"] = _waited_children_ticks()
        return cls(parts, busy, total)


def sample(wrk: WrkResult, before: CpuMark, after: CpuMark) -> Sample:
    """The CPU per request of a run between two marks, and what other processes used."""
    ours = after.ours - before.ours
    busy, total = after.busy - before.busy, after.total - before.total
    per_request = 1000 / CLOCK_TICKS / max(wrk.requests, 1)
    return Sample(
        wrk=wrk,
        cpu_ms=ours * per_request,
        others=max(0.0, busy - ours) / max(total, 1),
        cpu_parts={k: (after.parts[k] - before.parts[k]) * per_request for k in CPU_PARTS},
    )


# -- the site -------------------------------------------------------------------------------------


def site_env(
    servers: Servers, database_url: str, state_dir: str, root: Path = ROOT
) -> dict[str, str]:
    """The environment of the bench's Django processes (demo_site reads its servers there),
    running the code under ``root`` (default: this tree)."""
    return {
        **os.environ,
        "PYTHONPATH": str(root),
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "DEBUG": "false",
        "SECRET_KEY": "bench-load-not-secret",
        "ALLOWED_HOSTS": "127.0.0.1",
        "DEMO_STATE_DIR": state_dir,
        "DATABASE_URL": database_url,
        "MEMCACHED_SERVERS": servers.memcached,
        "REDIS_URL": servers.redis,
    }


def _django(env: dict[str, str], code: str, timeout: float = 180) -> str:
    """Run ``code`` in a Django process of the bench's settings; its stdout."""
    out = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if out.returncode != 0:
        raise LoadError(f"Django subprocess failed:\n{out.stdout}{out.stderr}")
    return out.stdout


def prepare(env: dict[str, str]) -> None:
    """Migrate the database and create the short link the redirect case follows."""
    _django(
        env,
        "from django.core.management import call_command; "
        "call_command('migrate', verbosity=0, interactive=False); "
        "from demo_site.shortener.models import Link; "
        f"Link.objects.get_or_create(key={LINK_KEY!r}, defaults={{'url': {LINK_URL!r}}})",
    )


def visit_totals(env: dict[str, str], names: Sequence[str]) -> dict[str, int]:
    """All-time totals of ``names`` in the database."""
    out = _django(
        env,
        "import json; from metrics_app import query; "
        f"print(json.dumps({{n: query.total(n) for n in {list(names)!r}}}))",
    )
    return {k: int(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def request(port: int, case: Case) -> http.client.HTTPResponse:
    """One request of ``case``, answer read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        if case.post:
            headers = {"Content-Type": "application/x-www-form-urlencoded"}
            conn.request("POST", case.path, body=FORM, headers=headers)
        else:
            conn.request("GET", case.path)
        response = conn.getresponse()
        response.read()
        return response
    finally:
        conn.close()


def check_answer(port: int, case: Case) -> None:
    """``case`` answers as the bench expects: its status, and ``RateLimit`` headers naming
    its rules (none for a case no rule covers). A flood's client is admitted once first."""
    response = request(port, case)
    if case.refused:
        response = request(port, case)
    if response.status != case.status:
        raise LoadError(f"{case.label}: status {response.status}, expected {case.status}")
    header = response.getheader("RateLimit") or ""
    names = set(re.findall(r'"([^":]+):', header))
    if names != set(case.rules):
        raise LoadError(f"{case.label}: RateLimit header {header!r}, expected {case.rules}")


@contextmanager
def gunicorn(
    env: dict[str, str], log_path: str, root: Path = ROOT
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """gunicorn with ``WORKERS`` sync workers on a free loopback port, serving the code under
    ``root``; stopped at exit (SIGTERM, which makes every worker flush its visits; SIGKILL if
    it hangs)."""
    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            gunicorn_argv("demo_site.wsgi", port, WORKERS),
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise LoadError(f"gunicorn exited ({proc.returncode}):\n{_tail(log_path)}")
            try:
                if request(port, CASES[0]).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LoadError(
                    f"gunicorn did not answer in {START_TIMEOUT} s:\n{_tail(log_path)}"
                )
            time.sleep(0.1)
        yield proc, port
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Graceful stop of gunicorn (its workers flush), SIGKILL to the group if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout)


def _tail(path: str, limit: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def start_database(db: str, state_dir: str, stack: ExitStack) -> tuple[str, str]:
    """A throwaway PostgreSQL (``postgres``, stopped when ``stack`` closes) or an SQLite file
    under ``state_dir`` (``sqlite``): its ``DATABASE_URL`` and a label for the tables."""
    if db == "postgres":
        pg = start_postgres()
        stack.callback(pg.stop)
        return pg.url, "PostgreSQL"
    if db == "sqlite":
        path = os.path.join(state_dir, "load.sqlite3")
        return f"sqlite:///{path}", "SQLite file (WAL)"
    raise ValueError(f"db is postgres or sqlite, got {db!r}")


def post_script(state_dir: str, clients: int = 1) -> str:
    """Write the wrk script that POSTs the bench's form (from ``clients`` addresses in
    X-Forwarded-For, in turn, when more than one); its path."""
    script = os.path.join(state_dir, f"post-{clients}.lua")
    text = (
        'wrk.method = "POST"\n'
        f'wrk.body = "{FORM}"\n'
        'wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"\n'
    )
    if clients > 1:
        # Every client's request formatted once, in init: formatting one per request made
        # wrk, which shares the machine with the site, spend 12% more CPU a request than on
        # the plain view, and that showed as the site's cost.
        text += (
            "local requests, n = {}, 0\n"
            "init = function(args)\n"
            # Each run goes on where the last one stopped (its first client, passed by
            # the bench): every client is sent in turn across the runs, not the first few
            # thousand again in each.
            f"  n = (tonumber(args[1]) or 0) % {clients}\n"
            f"  for i = 1, {clients} do\n"
            '    local a = "10.77." .. math.floor(i / 256) .. "." .. i % 256\n'
            '    wrk.headers["X-Forwarded-For"] = a\n'
            "    requests[i] = wrk.format()\n"
            "  end\n"
            "end\n"
            "request = function()\n"
            f"  n = n % {clients} + 1\n"
            "  return requests[n]\n"
            "end\n"
        )
    Path(script).write_text(text)
    return script


# -- the run --------------------------------------------------------------------------------------


def run(
    rounds: int = 6,
    seconds: int = 5,
    warmup: int = 3,
    db: str = "postgres",
    servers: Servers | None = None,
    state_dir: str | None = None,
    crowd_warmup: int = CROWD_WARMUP,
) -> Report:
    """Start what is not given, warm every case up (the crowd for ``crowd_warmup``
    seconds), then time ``rounds`` rounds."""
    wrk = require_binary("wrk")
    with ExitStack() as stack:
        if servers is None:
            servers = stack.enter_context(throwaway_servers())
        if state_dir is None:
            state_dir = tempfile.mkdtemp(prefix="bucketry-load-")
            stack.callback(shutil.rmtree, state_dir, ignore_errors=True)
        database_url, database = start_database(db, state_dir, stack)
        env = site_env(servers, database_url, state_dir)
        prepare(env)
        scripts = {c.clients: post_script(state_dir, c.clients) for c in CASES}
        rows = [Row(case) for case in CASES]
        seen = {c.series: 0 for c in CASES if c.series}
        slack = dict.fromkeys(seen, 0)

        sent = {c.name: 0 for c in CASES}  # each case's clients sent so far, in turn

        def time_case(row: Row, port: int, duration: int) -> Sample:
            case = row.case
            url = f"http://127.0.0.1:{port}{case.path}"
            script = scripts[case.clients] if case.post else None
            args = (str(sent[case.name]),) if case.clients > 1 else ()
            before = CpuMark.now()
            result = run_wrk(wrk, url, duration, script, args)
            timed = sample(result, before, CpuMark.now())
            sent[case.name] += result.requests
            if case.series:
                seen[case.series] += result.requests
                slack[case.series] += CONNECTIONS
            return timed

        log_path = os.path.join(state_dir, "gunicorn.log")
        with gunicorn(env, log_path) as (_proc, port):
            for row in rows:
                check_answer(port, row.case)
                if row.case.series:
                    seen[row.case.series] += 1
                if row.case.clients == CROWD_CLIENTS:
                    # Its steady state: every address admitted once, then refused by each
                    # worker at the counters once (each is back to a worker every minute or
                    # so), then from its memory.
                    left = crowd_warmup
                    while left > 0:
                        row.warmups.append(time_case(row, port, min(left, 30)).wrk.rps)
                        left -= 30
                else:
                    time_case(row, port, warmup)
            for r in range(rounds):
                by_name: dict[str, Sample] = {}
                by_run = [next(row for row in rows if row.case.name == n) for n in RUN_ORDER]
                for row in by_run if r % 2 == 0 else by_run[::-1]:
                    by_name[row.case.name] = timed = time_case(row, port, seconds)
                    row.runs.append(timed)
                plain = by_name["plain"]
                for row in rows:
                    mine = by_name[row.case.name]
                    row.costs.append(1 - mine.wrk.rps / plain.wrk.rps)
                    row.cpu_costs.append(1 - plain.cpu_ms / mine.cpu_ms)
            # The site stops while it may still serve what wrk left queued: a SIGTERM inside
            # a database call once lost a worker's visits (docs/reliability.rst, "Found by
            # the load bench"); the visit totals below would show it.
        stored = visit_totals(env, list(seen))
        visits = {name: (stored[name], seen[name]) for name in seen}
        return Report(rows, rounds, seconds, database, visits, slack)


def render(report: Report) -> str:
    rows = []
    for row in report.rows:
        plain = row.case.name == "plain"
        rows.append(
            [
                row.case.label,
                row.rps,
                row.p50_ms,
                row.p99_ms,
                "-" if plain else f"{100 * row.cost:.1f}%",
                row.cpu_ms,
                "-" if plain else f"{100 * row.cpu_cost:.1f}%",
                row.errors,
            ]
        )
    text = table(
        f"Load through gunicorn: demo_site, {WORKERS} sync workers, {report.database}; wrk "
        f"{WRK_THREADS} thread x {CONNECTIONS} connections on loopback, {report.rounds} "
        f"rounds x {report.seconds} s, medians; cost = 1 - rps / plain rps (same round)",
        ["case", "rps", "p50 ms", "p99 ms", "cost", "CPU ms/req", "CPU cost", "errors"],
        rows,
    )
    targets = table(
        "Targets (the cost ratio: of the costs' medians; the others: medians of the ratios of "
        "the same round), and the lowest and highest round",
        ["what", "measured", "target", "met", "rounds"],
        [
            [what, f"{value:.2f}x", target, "yes" if met else "NO", f"{low:.2f}-{high:.2f}x"]
            for (what, value, target, met), (low, high) in zip(
                report.targets(), report.spreads(), strict=True
            )
        ],
    )
    plain_row = report.row("plain")
    breakdown = table(
        "CPU ms per answered request by process (medians), and what each case adds to the "
        "plain view's",
        ["case", *CPU_PARTS, "added: site", "added: servers"],
        [
            [
                row.case.label,
                *(row.cpu_part(part) for part in CPU_PARTS),
                row.cpu_part("site") - plain_row.cpu_part("site"),
                sum(row.cpu_part(p) - plain_row.cpu_part(p) for p in ("memcached", "Redis")),
            ]
            for row in report.rows
        ],
    )
    counted = ", ".join(
        f"{name} {stored} stored / {seen} answered"
        for name, (stored, seen) in report.visits.items()
    )
    others = report.others
    floor, target, page = report.row("floor"), report.row(TARGET_CASE), report.row("page")
    added = target.cpu_ms - plain_row.cpu_ms
    return (
        f"{text}\n"
        "CPU ms/req: user + system time of gunicorn, memcached, Redis and wrk per answered "
        "request; CPU cost = 1 - plain CPU ms/req / CPU ms/req (same round); errors: socket "
        "errors and answers of the other kind (a refusal where the case serves, a success "
        "beyond each flood client's first where it refuses)\n"
        f"other processes (PostgreSQL included) used {100 * statistics.median(others):.0f}% "
        f"of the machine's CPU during a timed run (median; max {100 * max(others):.0f}%)\n"
        f"visits after the graceful stop: {counted}\n"
        f"the floor (one round trip with the rules' commands, nothing decided) costs "
        f"{100 * floor.cost:.1f}%; the limiter's own work adds "
        f"{100 * (target.cost - floor.cost):.1f} points to it\n"
        f"for scale: the demo's log-in page takes {page.cpu_ms:.2f} CPU ms a request; the three "
        f"rules and counting add {added:.2f} ms, {100 * added / (page.cpu_ms + added):.1f}% "
        f"of such a page\n"
        f"the crowd's warm-up, runs of 30 s (its first pass through every worker): "
        f"{', '.join(f'{rps:.0f}' for rps in report.row('crowd').warmups)} requests/s\n\n"
        f"{targets}\n\n{breakdown}"
    )


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of every case")
    parser.add_argument("--seconds", type=int, default=5, help="seconds of one wrk run")
    parser.add_argument("--warmup", type=int, default=3, help="seconds of warm-up per case")
    parser.add_argument(
        "--crowd-warmup", type=int, default=CROWD_WARMUP, help="seconds of the crowd's warm-up"
    )
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    args = parser.parse_args(argv)
    from bench.common import machine

    info = machine()
    print(
        f"machine: {info['cores']} cores, {info['cpu']}; Python {info['python']}; "
        f"{info['memcached']}; {info['redis']}\n"
    )
    report = run(args.rounds, args.seconds, args.warmup, args.db, crowd_warmup=args.crowd_warmup)
    print(render(report))
    return report


if __name__ == "__main__":
    main()
