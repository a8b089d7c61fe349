"""Smoke test of the benchmarks (``bench/``) with tiny sizes, so the bench code cannot rot.

The full runs are ``make bench``; here every bench runs for real (real servers, the real
bucket logic) and its outputs are checked, not only that it does not crash.
"""

from __future__ import annotations

import pathlib

import pytest

from bench import common, instructions
from bench.claims import (
    accuracy,
    async_check,
    big_bodies,
    crowd_controls,
    drf_throttle,
    fallback,
    figures,
    leaky_bucket,
    load,
    load_ab,
    memos,
    ratelimit_latency,
    ratelimit_middleware,
)
from tests.conftest import in_ci
from tests.servers import PACKAGES, MissingServerBinary, find_binary


def test_quantile_and_table() -> None:
    assert common.quantile([3, 1, 2], 0.5) == 2
    assert common.quantile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9) == pytest.approx(9.1)
    text = common.table("T", ["name", "n"], [["a", 1.5], ["bb", 20]])
    assert text.splitlines() == ["T", "=", "name     n", "----  ----", "a     1.50", "bb      20"]


def test_latency_bench_on_real_servers(memcached_server: str, redis_server: str) -> None:
    servers = common.Servers(memcached=memcached_server, redis=redis_server)
    report = ratelimit_latency.run(rounds=2, calls=5, ips=3, servers=servers)
    rows = report.rows
    assert [(r.backend, r.case) for r in rows] == [
        (backend, case) for backend in ("memcached", "redis") for case in ratelimit_latency.TARGETS
    ]
    for row in rows:
        assert row.samples == 2 * 5
        assert 0 < row.ours_median <= row.ours_p90
        assert 0 < row.peer_median <= row.peer_p90
        assert row.ratio == pytest.approx(row.ours_median / row.peer_median)
    peer_rows = report.peer_rows
    assert [(r.backend, r.case, r.subject) for r in peer_rows] == [
        (backend, case, subject)
        for backend in ("memcached", "redis")
        for case, _, subject in ratelimit_latency.PEER_CASES
    ]
    for row in peer_rows:
        assert row.samples == 2 * 5
        # Every peer really counted on the server (a failed check is no timing).
        assert (row.ours_failed, row.peers_failed) == (0, 0)
        assert set(row.peer_medians) == set(ratelimit_latency.PEERS)
        fastest = min(row.peer_medians.values())
        assert row.peer_medians[row.fastest] == fastest
        assert row.ratio == pytest.approx(row.ours_median / fastest)
        assert row.met == (row.ratio <= ratelimit_latency.PEER_TARGETS[row.backend])
    text = ratelimit_latency.render(report, 2, 5)
    assert "ours/peer" in text and "ours/fastest" in text
    assert "<= 0.8x" in text
    assert "<= 0.5x" in text
    for name in ratelimit_latency.PEERS:
        assert f"{name} med us" in text


def test_latency_bench_quiet_subjects_are_new(memcached_server: str, redis_server: str) -> None:
    """A quiet contender's every timed check is its subject's first: each counts 1."""
    from django.test import override_settings

    servers = common.Servers(memcached=memcached_server, redis=redis_server)
    common.configure_django()
    counts: list[int] = []

    def check(request: object) -> object:
        from ratelimit_app.core import get_usage

        usage = get_usage(request, group="quiet-probe", key="ip", rate="9/m", increment=True)
        counts.append(usage["count"])
        return [usage]

    probe = ratelimit_latency.Contender("probe", check, quiet=True)
    with override_settings(CACHES=ratelimit_latency.caches_for(servers)):
        ratelimit_latency.time_backend("redis", 2, 4, ratelimit_latency.requests(3), [probe])
    timed = counts[-4:] + counts[-9 - 4 : -9]  # each round: 5 warm-up checks, 4 timed
    assert len(probe.samples) == 8 and timed == [1] * 8


def test_fallback_bench_on_real_servers(memcached_server: str, redis_server: str) -> None:
    servers = common.Servers(memcached=memcached_server, redis=redis_server)
    rows = fallback.run(rounds=2, calls=20, ips=3, servers=servers)
    assert [r.backend for r in rows] == ["memcached", "redis"]
    for row in rows:
        assert row.samples == 40 and row.failed == 0
        assert row.down_median > 0 and row.up_median > 0
    text = fallback.render(rows, 2, 20)
    assert "down / up" in text and "failed" not in text


def test_async_check_bench_on_real_servers(memcached_server: str, redis_server: str) -> None:
    servers = common.Servers(memcached=memcached_server, redis=redis_server)
    rows = async_check.run(rounds=2, calls=10, servers=servers)
    assert [(r.backend, r.subject) for r in rows] == [
        ("memcached", "busy"),
        ("memcached", "quiet"),
        ("redis", "busy"),
        ("redis", "quiet"),
    ]
    for row in rows:
        assert len(row.inline.samples) == len(row.awaited.samples) == 20
        assert row.ratio > 0
    assert "awaited med us" in async_check.render(rows)


def test_leaky_bucket_bench_on_real_servers(memcached_server: str, redis_server: str) -> None:
    servers = common.Servers(memcached=memcached_server, redis=redis_server)
    rows = leaky_bucket.run(rounds=2, calls=5, ips=3, servers=servers)
    assert [(r.backend, r.case) for r in rows] == [
        (backend, case) for backend in ("memcached", "redis") for case in leaky_bucket.CASES
    ]
    for row in rows:
        assert row.samples == 2 * 5
        assert row.failed == 0
        assert 0 < row.leaky_median <= row.leaky_p90
        assert row.sliding_median > 0 and row.peer_median > 0
        assert row.vs_sliding == pytest.approx(row.leaky_median / row.sliding_median)
        assert row.vs_peer == pytest.approx(row.leaky_median / row.peer_median)
    text = leaky_bucket.render(rows, 2, 5)
    assert "leaky/sliding" in text and "leaky/django-rl" in text
    for row in rows:  # every row has its ratios
        assert f"{row.vs_sliding:.2f}x" in text and f"{row.vs_peer:.2f}x" in text


def test_middleware_bench_on_real_servers(memcached_server: str, redis_server: str) -> None:
    servers = common.Servers(memcached=memcached_server, redis=redis_server)
    rows, no_match = ratelimit_middleware.run(rounds=2, calls=5, ips=3, batch=5, servers=servers)
    assert [r.backend for r in rows] == ["memcached", "redis"]
    for row in rows:
        assert row.samples == 2 * 5
        assert (row.ours_failed, row.peer_failed) == (0, 0)
        assert 0 < row.view_median <= row.view_p90
        # Both limiters make round trips the plain view does not: they add time.
        assert row.ours_added > 0
        assert row.peer_added > 0
        assert row.ours_median <= row.ours_p90
        assert row.peer_median <= row.peer_p90
        assert row.ratio == pytest.approx(row.ours_added / row.peer_added)
    assert no_match.samples == 2 * 5
    assert no_match.batch == 5
    assert no_match.view_median > 0
    assert no_match.ours_median > 0
    assert no_match.added <= no_match.added_p90
    assert no_match.met == (no_match.added < ratelimit_middleware.NO_MATCH_TARGET_US)
    text = ratelimit_middleware.render(rows, no_match, 2, 5)
    assert "ours/peer" in text
    assert "<= 0.5x" in text
    assert "< 5 us" in text
    assert "memcached" in text and "redis" in text


def test_middleware_bench_fills_every_window(memcached_server: str, redis_server: str) -> None:
    """The subjects are busy before timing: each rule counts the fill's hits in its window."""
    import time

    from django.test import override_settings

    from ratelimit_app.middleware import RatelimitMiddleware

    servers = common.Servers(memcached=memcached_server, redis=redis_server)
    caches = ratelimit_latency.caches_for(servers)
    settings = ratelimit_middleware._rule_settings("memcached")
    with override_settings(CACHES=caches), override_settings(**settings):
        middleware = RatelimitMiddleware(ratelimit_middleware.view)
        now = time.time()
        [request] = ratelimit_middleware.login_requests([7001])
        ratelimit_middleware._fill(middleware, [request])
        [request] = ratelimit_middleware.login_requests([7001])
        response = middleware(request)
    assert response.status_code == 200
    assert "RateLimit" in response
    times = ratelimit_middleware._fill_times(now)
    for rule, window in zip(ratelimit_middleware.RULES, ratelimit_middleware.WINDOWS, strict=True):
        # Never lenient: at least every fill hit well inside the window, and this request;
        # early by at most one fine bucket (W/60): the hits were spread over the window.
        inside = sum(now - t < window - 5 for t in times)
        near = sum(now - t < window * 61 / 60 + 5 for t in times)
        assert inside > 50
        assert inside + 1 <= request.ratelimit_usage[rule["name"]]["count"] <= near + 1


def test_drf_throttle_bench_on_real_servers(memcached_server: str, redis_server: str) -> None:
    """A tiny run: every case times ours and DRF's on busy subjects, every request admitted."""
    servers = common.Servers(memcached=memcached_server, redis=redis_server)
    rows = drf_throttle.run(rounds=2, calls=5, servers=servers)
    assert [r.case for r in rows] == list(drf_throttle.CASES)
    for row in rows:
        assert row.samples == 2 * 5
        # Every timed request was a real check that admitted (a refusal or a failure counts).
        assert (row.ours_failed, row.peer_failed) == (0, 0)
        assert 0 < row.ours_median <= row.ours_p90
        assert 0 < row.peer_median <= row.peer_p90  # DRF's
        assert row.ratio == pytest.approx(row.ours_median / row.peer_median)
        assert row.met == (None if row.target is None else row.ratio <= row.target)
    found = [drf_throttle.Concurrency("memcached", 200, 1280, 200, 1280)]
    text = drf_throttle.render(rows, found, 2, 5)
    assert "ours/DRF" in text and "<= 0.8x" in text and "<= 0.3x" in text
    assert text.splitlines()[-1].split() == ["memcached", "1280", "200", "200", "1280"]


def test_drf_throttle_bench_fills_each_window(memcached_server: str, redis_server: str) -> None:
    """Both throttles hold the case's requests before timing: the next one is admitted with
    exactly that many in the window (ours reads its buckets, DRF its list)."""
    from django.core.cache import caches
    from django.test import override_settings

    common.configure_django()
    servers = common.Servers(memcached=memcached_server, redis=redis_server)
    [request] = ratelimit_latency.requests(1, net=19)
    with (
        override_settings(
            CACHES=ratelimit_latency.caches_for(servers), RATELIMIT_USE_CACHE="memcached"
        ),
        drf_throttle.drf_settings(),
    ):
        for side in ("ours", "drf"):
            classes = drf_throttle.throttle_classes(side, "fill", ("1000/d",), "memcached")
            drf_throttle.fill(side, classes, [request], 500, 86400)
            view = drf_throttle.view_for(classes)
            assert drf_throttle.checker(view)(request) == [{"limit": 1, "should_limit": False}]
            if side == "ours":
                assert ";r=499;" in view.headers["RateLimit"]  # 500 held, this one: 501
            else:
                key = f"throttle_{classes[0].scope}_{request.META['REMOTE_ADDR']}"
                assert len(caches["memcached"].get(key)) == 501


def test_accuracy_guarantees() -> None:
    results = accuracy.run(scale=0.1)
    by = {(r.scenario, r.limiter): r for r in results}
    ideal, fixed = accuracy.SlidingLog.name, accuracy.FixedWindow.name
    ours = [r for r in results if r.limiter.startswith("ours")]
    assert ours
    for r in results:
        assert 0 < r.admitted <= r.offered
        if r.limiter != fixed:
            # Never lenient: no window of length W admits more than N.
            assert r.max_window <= r.limit, r
    for r in ours:
        # Tight: ours blocks at most one bucket earlier than the exact log with its rule
        # (a bucket of a 100-per-second burst is up to 100 requests: hence 0.8 at this size).
        assert 0.8 <= r.admitted / r.reference <= 1.0, r
    edge = "burst on window edges"
    assert by[(edge, fixed)].max_window == 2 * by[(edge, ideal)].limit
    assert by[(edge, ideal)].max_window == by[(edge, ideal)].limit
    assert "max in any W" in accuracy.render(results)


def test_accuracy_is_deterministic() -> None:
    assert accuracy.scenarios(0.05) == accuracy.scenarios(0.05)
    assert accuracy.run(scale=0.05) == accuracy.run(scale=0.05)


def test_big_bodies_bench_measures_every_case() -> None:
    rows = big_bodies.run(size=50_000, rounds=1)
    assert [r.case for r in rows] == [c.name for c in big_bodies.CASES]
    for row in rows:
        assert 45_000 <= row.body_bytes <= 51_000
        assert row.parse_ms > 0 and row.keys_ms > 0
        assert row.over_parse_ms == row.keys_ms - row.parse_ms
    assert "over parse ms" in big_bodies.render(rows, 1)


def test_max_in_window() -> None:
    assert accuracy.max_in_window([0, 1, 2, 60, 61], 60) == 3  # (0, 60] holds 1, 2, 60
    assert accuracy.max_in_window([0, 59.9, 60], 60) == 2
    assert accuracy.max_in_window([], 60) == 0


def test_the_algorithms_figure_is_up_to_date() -> None:
    """docs/_static/algorithms.svg is what bench/claims/figures.py draws from the real logic."""
    assert figures.PATH.read_text(encoding="utf-8") == figures.svg(), (
        "python -m bench.claims.figures"
    )


def test_the_figure_shows_both_algorithms_at_work() -> None:
    o = figures.simulate()
    # The same 24 requests: the window lets a full burst through again as soon as the old
    # one has left it; the bucket spaces them one per interval once full.
    assert len(o.times) == 24
    assert sum(o.window) < len(o.times) and sum(o.bucket) < len(o.times)
    assert o.window[:6] == [True] * 4 + [False] * 2 == o.bucket[:6]
    assert max(level for _, level in o.levels) <= figures.BURST
    counts = [c for _, c in figures.in_window(o.times, o.window)]
    assert max(counts) == figures.COUNT


WRK_OUTPUT = """\
Running 1s test @ http://127.0.0.1:8000/bench/plain/
  1 threads and 8 connections
  Latency Distribution
     50%  850.00us
     75%    4.43ms
     90%    9.10ms
     99%    1.20s
  1234 requests in 1.00s, 1.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:   1230.55
"""


def _need_wrk() -> None:
    if find_binary("wrk") is None:
        missing = MissingServerBinary("wrk", PACKAGES["wrk"])
        if in_ci():
            pytest.fail(f"CI=true and {missing}", pytrace=False)
        pytest.skip(str(missing))


@pytest.mark.slow
@pytest.mark.callgrind
def test_instructions_are_counted_per_request() -> None:
    """A tiny run of bench/instructions.py under real valgrind: the case with most to do (a
    refusal remembered while three rules check) is a whole request's count."""
    with pytest.raises(ValueError, match="unknown cases"):
        instructions.run(["no-such-case"])
    with pytest.raises(ValueError, match="no-such-crowd"):
        instructions.run(["rules"], workloads=["no-such-crowd"])
    if find_binary("valgrind") is None:
        missing = MissingServerBinary("valgrind", PACKAGES["valgrind"])
        if in_ci():
            pytest.fail(f"CI=true and {missing}", pytrace=False)
        pytest.skip(str(missing))
    # The Zipf mix only (the bench's one client takes the same path with no crowd set-up):
    # each workload is two runs under valgrind, the slowest part of this test.
    counts = instructions.run(["rules-refused"], sizes=(2, 6, 3), workloads=("zipf",))
    cost = counts["head"][("rules-refused", "zipf")]
    assert 100_000 < cost < 10_000_000  # a whole request through Django: not 0, not a crash
    text = instructions.render(counts, None)
    assert "rules-refused" in text and "zipf" in text and "instructions" in text


@pytest.mark.slow
@pytest.mark.callgrind
def test_memos_bench_counts_a_memo_turned_off() -> None:
    """A tiny run of bench/claims/memos.py under real valgrind: a leaky bucket's recurring
    client hashes its namespace again when the namespaces' memo keeps nothing."""
    if find_binary("valgrind") is None:
        missing = MissingServerBinary("valgrind", PACKAGES["valgrind"])
        if in_ci():
            pytest.fail(f"CI=true and {missing}", pytrace=False)
        pytest.skip(str(missing))
    off = "namespaces (by limit, kind, value)"
    cases = {"leaky": ("everything on", off)}
    counts = memos.run((2, 6, 3), (0,), None, cases, ("one client",))
    on = counts[("leaky", "everything on", "one client")]
    assert 100_000 < on < 10_000_000  # a whole request through Django: not 0, not a crash
    assert counts[("leaky", off, "one client")] > on + memos.NOISE  # the hash, made again
    text = memos.render(counts, 1)
    assert "leaky" in text and off in text and "a crowd" not in text


@pytest.mark.slow
@pytest.mark.callgrind
def test_crowd_controls_bench_counts_and_times() -> None:
    """A tiny run of bench/claims/crowd_controls.py: instructions under real valgrind in the
    three states (rows written, loaded, every request from a new address), and new bans and
    overrides timed in a process holding rows (each change checked in force: the banned
    subject refused, the overridden one given the override's rate)."""
    if find_binary("valgrind") is None:
        missing = MissingServerBinary("valgrind", PACKAGES["valgrind"])
        if in_ci():
            pytest.fail(f"CI=true and {missing}", pytrace=False)
        pytest.skip(str(missing))
    report = crowd_controls.run(
        bans=200, overrides=20, networks=20, sizes=(2, 6, 3), changes=2, layouts=(1,)
    )
    assert list(report.counts) == ["nothing", "crowd", "network", "networks"]
    for costs in report.counts.values():
        assert len(costs) == 1  # one count per layout (the one asked: shifted)
        for cost in costs:
            assert 100_000 < cost < 10_000_000  # a whole request through Django
    assert report.over("networks") == report.median("networks") - report.median("network")
    assert [(t.state.bans, t.state.overrides) for t in report.timed] == [(0, 0), (200, 20)]
    for t in report.timed:
        assert t.plain_ms > 0 and all(ms > 0 for ms in (*t.ban_ms, *t.override_ms))
        assert t.idle_ms > 0  # a look with no change: the version counters read
        assert t.change_ms() == max(t.ban_ms[0], t.override_ms[0]) - t.idle_ms
    assert report.timed[1].held > report.timed[0].held  # the rows take memory
    text = crowd_controls.render(report)
    assert "200 bans + 20 overrides" in text and "20 overrides on /24 networks" in text
    assert "<= +10,000" in text and "<= +2,500" in text and "override: next request" in text
    assert "over 1 override on a /24 network" in text
    assert "look, no change" in text and "a change costs" in text


@pytest.mark.slow
def test_load_ab_bench_times_two_revisions_side_by_side(
    memcached_server: str, redis_server: str, tmp_path: pathlib.Path
) -> None:
    """A tiny run of bench/claims/load_ab.py: this tree against its own HEAD, real gunicorn,
    real wrk."""
    with pytest.raises(ValueError, match="unknown case"):
        load_ab.run(cases=["plain", "no-such-case"])
    tree = load_ab.export("HEAD", str(tmp_path))
    assert (tree / "ratelimit_app" / "middleware.py").is_file()
    assert (tree / "bench" / "load_site.py").is_file()
    _need_wrk()
    servers = common.Servers(memcached=memcached_server, redis=redis_server)
    cases = ["plain", load.TARGET_CASE]
    pairs = load_ab.run("HEAD", cases, rounds=2, seconds=1, warmup=1, db="sqlite", servers=servers)
    assert [p.case.name for p in pairs] == cases
    for pair in pairs:
        for side in load_ab.SIDES:
            assert len(pair.samples[side]) == 2
            assert all(rps > 0 and cpu > 0 for rps, cpu in pair.samples[side])
        assert 0 < pair.ratio(0) < 10 and 0 < pair.ratio(1) < 10
    text = load_ab.render(pairs, "HEAD", 2, 1)
    assert "CPU head/base" in text and "+ 3 rules + visit counting" in text


@pytest.mark.slow
def test_load_bench_through_gunicorn(
    memcached_server: str, redis_server: str, tmp_path: pathlib.Path
) -> None:
    """A tiny run of bench/claims/load.py: real gunicorn, wrk and servers, an SQLite file."""
    parsed = load.parse_wrk(WRK_OUTPUT)
    assert parsed == load.WrkResult(
        rps=1230.55, p50_ms=0.85, p99_ms=1200.0, requests=1234, non_2xx=4, socket_errors=3
    )
    assert parsed.errors == 7
    _need_wrk()
    servers = common.Servers(memcached=memcached_server, redis=redis_server)
    report = load.run(
        rounds=1,
        seconds=1,
        warmup=1,
        db="sqlite",
        servers=servers,
        state_dir=str(tmp_path),
        crowd_warmup=1,
    )
    assert [r.case for r in report.rows] == list(load.CASES)
    assert sorted(load.RUN_ORDER) == sorted(c.name for c in load.CASES)
    for row in report.rows:
        # Every case answered as expected (run() checks status and RateLimit headers first).
        assert len(row.runs) == len(row.costs) == 1
        assert row.errors == 0
        assert row.rps > 0 and 0 < row.p50_ms <= row.p99_ms
    assert report.row("plain").cost == 0
    # The crowd's warm-up is its own (one run here), its rate shown.
    assert len(report.row("crowd").warmups) == 1 and report.row("crowd").warmups[0] > 0
    assert "the crowd's warm-up" in load.render(report)
    for name, (stored, answered) in report.visits.items():
        # Every visit wrk saw answered is stored after the graceful stop (plus those still
        # in flight when a wrk run ended).
        assert answered <= stored <= answered + report.slack[name], name
    assert set(report.visits) == {"bench:visits", "shorturl:bench"}
    # The floods were refused (their errors count answers that were not: none above).
    for name in ("flood", "botnet", "crowd", "django-ratelimit-flood"):
        assert report.row(name).case.refused
    assert {what for what, *_ in report.targets()} >= {"flood: 429s / plain view rps"}
    for row in report.rows:
        parts = row.runs[0].cpu_parts
        assert set(parts) == set(load.CPU_PARTS)
        # The parts add up to the whole, and the site always works.
        assert sum(parts.values()) == pytest.approx(row.runs[0].cpu_ms)
        assert parts["site"] > 0
    # The three rules' counters are in memcached (the demo's MEMCACHED_SERVERS).
    assert report.row("rules").cpu_part("memcached") > report.row("plain").cpu_part("memcached")
    # The floor's round trips reach memcached too.
    assert report.row("floor").cpu_part("memcached") > report.row("plain").cpu_part("memcached")
    text = load.render(report)
    assert "Targets" in text and "SQLite" in text and "added: site" in text
    assert "our 429s / django-ratelimit's 403s" in text
    assert "the floor (one round trip" in text and "for scale: the demo's log-in page" in text
    assert ("yes" if report.met else "NO") in text


def test_load_targets_show_each_rounds_spread() -> None:
    """The Targets table gives, beside each median, the lowest and highest round: one run
    shows how far its own rounds stray (two rounds made up here, nothing started)."""
    rps = {  # per case, round 1 and round 2
        "plain": (1000.0, 1000.0),
        "rules+counted": (700.0, 600.0),  # costs 0.30 and 0.40
        "django-ratelimit": (400.0, 400.0),  # costs 0.60 and 0.60
        "flood": (950.0, 900.0),
        "botnet": (920.0, 980.0),
        "crowd": (870.0, 880.0),
        "django-ratelimit-flood": (500.0, 450.0),
    }
    rows = []
    for case in load.CASES:
        row = load.Row(case)
        for k in range(2):
            mine = rps.get(case.name, (1000.0, 1000.0))[k]
            wrk = load.WrkResult(rps=mine, p50_ms=1.0, p99_ms=2.0, requests=int(mine))
            row.runs.append(load.Sample(wrk, 1.0, 0.0, dict.fromkeys(load.CPU_PARTS, 0.25)))
            row.costs.append(1 - mine / rps["plain"][k])
            row.cpu_costs.append(0.0)
        rows.append(row)
    report = load.Report(rows, 2, 1, "SQLite", {}, {})
    assert report.cost_ratios == pytest.approx([0.5, 2 / 3])
    assert report.cost_ratio == pytest.approx(0.35 / 0.6)  # of the medians
    low_high = report.spreads()
    assert low_high[0] == pytest.approx((0.5, 2 / 3))
    assert low_high[1] == pytest.approx((0.9, 0.95))  # flood / plain
    assert low_high[2] == pytest.approx((0.92, 0.98))  # botnet / plain
    assert low_high[3] == pytest.approx((0.87, 0.88))  # crowd / plain
    assert low_high[4] == pytest.approx((1.9, 2.0))  # flood / django-ratelimit's flood
    assert len(low_high) == len(report.targets())
    text = load.render(report)
    assert "0.50-0.67x" in text and "0.90-0.95x" in text and "1.90-2.00x" in text


def test_the_floor_sends_the_rules_commands_to_memcached(
    memcached_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/load_floor: six increments and 30 quiet reads of limiter-sized keys, one round
    trip."""
    import re

    from bench import load_floor

    keys = re.findall(rb":1:rl:\{[0-9a-f]{32}\}:60/60x10:\d{9}", load_floor.COMMAND)
    assert len(keys) == load_floor.INCREMENTS + load_floor.READS
    assert load_floor.COMMAND.count(b"ma ") == load_floor.INCREMENTS
    assert load_floor.COMMAND.count(b"\r\nmg ") == load_floor.READS
    assert load_floor.COMMAND.endswith(b"\r\nmn\r\n")
    # Its headers name the bench's rules, as the limiter's would.
    assert tuple(name for name, *_ in load_floor.RULES) == load.BENCH_RULES
    assert re.findall(r'"([^":]+):', load_floor.HEADERS["RateLimit"]) == list(load.BENCH_SHOWN)
    monkeypatch.setenv("MEMCACHED_SERVERS", memcached_server)
    floor = load_floor.RoundTripFloor(lambda request: None)
    try:
        first, second = floor.round_trip(), floor.round_trip()
    finally:
        assert floor.sock is not None
        floor.sock.close()
    # Real increments: every counter went up by one; the six written keys are read back.
    values = [int(v) for v in re.findall(rb"VA \d+\r\n(\d+)", second)]
    assert values == [int(v) + 1 for v in re.findall(rb"VA \d+\r\n(\d+)", first)]
    assert len(values) == load_floor.INCREMENTS
    assert second.count(b" O") == load_floor.INCREMENTS and second.endswith(b"MN\r\n")


def test_the_metrics_bench_fills_the_buffer_as_a_crowd_would() -> None:
    from bench.claims import metrics as bench

    rows = bench.bench_buffer(1_000)
    assert [row[0] for row in rows] == ["names the code chose", "client-chosen names"]
    for _, keys, dropped, per_key, met in rows:
        assert (keys, dropped, met) == ("3,000", 0, "yes")
        assert 50 < per_key < 400
