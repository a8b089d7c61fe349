"""Rules from settings: validation names the rule and the field; matching is exact."""

from __future__ import annotations

from typing import Any

import pytest
from django.http import HttpRequest
from django.test import RequestFactory, override_settings

from ratelimit_app.algorithms.rates import Rate
from ratelimit_app.config import rules
from ratelimit_app.config.rules import RuleError, RuleSet, parse_rule, parse_rules

rf = RequestFactory()
BASE: dict[str, Any] = {"name": "login", "path": "/accounts/login/", "key": "ip", "rate": "5/m"}


def test_defaults() -> None:
    rule = parse_rule(BASE)
    assert rule.group == "rule:login"
    assert rule.paths == ("/accounts/login/",)
    assert rule.methods is None and rule.count == "all" and rule.block and rule.fail_open
    assert rule.static_rates == (Rate(5, 60),)
    assert rule.limit.rates_for(None) == (Rate(5, 60),)


def test_every_field() -> None:
    rule = parse_rule(
        {
            "name": "login-email",
            "path": ["/a/", "/b/"],
            "url_name": ["login", "accounts:login"],
            "methods": ["post", "PUT"],
            "key": "email:username",
            "rate": "10/d;5/m",
            "count": "failures",
            "block": False,
            "fail_open": False,
        }
    )
    assert rule.paths == ("/a/", "/b/")
    assert rule.url_names == {"login", "accounts:login"}
    assert rule.methods == {"POST", "PUT"}
    assert rule.static_rates == (Rate(5, 60), Rate(10, 86400))
    assert rule.failures_only and not rule.block and not rule.fail_open


def rate_for_tests(group: str, request: Any) -> str:
    return "7/h"


def test_callable_and_dotted_rates_resolve_per_request() -> None:
    dotted = parse_rule({**BASE, "rate": "tests.ratelimit.test_rules.rate_for_tests"})
    assert dotted.static_rates is None
    assert dotted.limit.rates_for(rf.get("/")) == (Rate(7, 3600),)
    assert not dotted.limit.async_safe  # user code: run off the event loop
    call = parse_rule({**BASE, "rate": lambda group, request: None})
    assert call.limit.rates_for(rf.get("/")) is None  # "no limit for this request"


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"rate": "5/M"}, "rate", "Invalid rate '5/M'"),
        ({"rate": ""}, "rate", "got ''"),
        ({"rate": (5, "m")}, "rate", "(count, seconds)"),
        ({"rate": "no.such.module.fn"}, "rate", "cannot import"),
        ({"key": "cookie:session"}, "key", "cookie:session"),
        ({"key": None}, "key", "got None"),
        ({"path": "accounts/"}, "path", "starts with '/'"),
        ({"path": []}, "path", "got []"),
        ({"path": None}, "path", "got None"),
        ({"methods": 5}, "methods", "got 5"),
        ({"count": "errors"}, "count", "'errors'"),
        ({"block": "yes"}, "block", "'yes'"),
        ({"fail_open": 0}, "fail_open", "got 0"),
        ({"name": "two words"}, "name", "'two words'"),
        ({"name": ""}, "name", "got ''"),
        ({"pathh": "/x/"}, "pathh", "unknown field"),
    ],
)
def test_errors_name_the_rule_and_the_field(
    change: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(RuleError) as info:
        parse_rule({**BASE, **change}, index=3)
    assert info.value.field == field
    assert info.value.rule in ("login", "#3", change.get("name"))
    assert words in str(info.value)
    assert f"field {field!r}" in str(info.value)


def test_a_rule_needs_a_path_or_a_url_name() -> None:
    with pytest.raises(RuleError, match="needs a 'path' prefix or a 'url_name'"):
        parse_rule({"name": "x", "key": "ip", "rate": "5/m"})


def test_parse_rules_keeps_the_valid_ones_and_reports_the_rest() -> None:
    found, errors = parse_rules([BASE, {**BASE, "rate": "x"}, BASE, "not a dict"])
    assert [r.name for r in found] == ["login"]
    assert [(e.rule, e.field) for e in errors] == [
        ("login", "rate"),
        ("login", "name"),  # a duplicate name
        ("#3", "name"),
    ]
    assert parse_rules(None) == ([], [])
    assert parse_rules({"name": "x"})[1][0].rule == "RATELIMIT_RULES"


def ruleset(*raw: dict[str, Any]) -> RuleSet:
    found, errors = parse_rules(list(raw))
    assert not errors
    return RuleSet(found)


def names(matched: list[rules.CompiledRule]) -> list[str]:
    return [r.name for r in matched]


def test_path_prefix_and_methods() -> None:
    rs = ruleset(
        {**BASE, "name": "all-methods"},
        {**BASE, "name": "post", "methods": "POST"},
        {**BASE, "name": "api", "path": "/api/"},
    )
    assert names(rs.match(rf.get("/accounts/login/"))) == ["all-methods"]
    assert names(rs.match(rf.post("/accounts/login/?next=/"))) == ["all-methods", "post"]
    assert names(rs.match(rf.get("/accounts/login/extra"))) == ["all-methods"]
    assert names(rs.match(rf.get("/api/v1/items"))) == ["api"]
    assert rs.match(rf.get("/accounts/")) == ()
    assert rs.match(rf.get("/")) == ()
    assert rs.by_name["post"].methods == {"POST"}


def test_path_info_is_matched_not_the_script_prefix() -> None:
    rs = ruleset(BASE)
    request = rf.get("/accounts/login/", SCRIPT_NAME="/site")
    request.path_info = "/accounts/login/"
    request.path = "/site/accounts/login/"
    assert names(rs.match(request)) == ["login"]


@override_settings(ROOT_URLCONF="tests.ratelimit.urls")
def test_url_names_resolve_including_namespaces() -> None:
    rules.url_names().clear()
    rs = ruleset(
        {"name": "by-name", "url_name": "rules-named", "key": "ip", "rate": "5/m"},
        {"name": "ns", "url_name": "ns:rules-inner", "key": "ip", "rate": "5/m"},
        {**BASE, "name": "both", "path": "/rules/", "url_name": "rules-named"},
    )
    assert names(rs.match(rf.get("/rules/named/"))) == ["by-name", "both"]
    assert names(rs.match(rf.get("/rules/ns/inner/"))) == ["ns"]
    assert rs.match(rf.get("/rules/unnamed/")) == ()
    assert rs.match(rf.get("/no/such/url/")) == ()


@override_settings(ROOT_URLCONF="tests.ratelimit.urls")
def test_a_path_outside_every_prefix_resolves_nothing() -> None:
    """Rules with both a path and a URL name resolve only the paths under their prefixes:
    every other request stays a prefix test."""
    rules.url_names().clear()
    rs = ruleset({**BASE, "name": "both", "path": "/rules/", "url_name": "rules-named"})
    assert rs.match(rf.get("/other/")) == ()
    assert len(rules.url_names()) == 0
    assert names(rs.match(rf.get("/rules/named/"))) == ["both"]
    assert len(rules.url_names()) == 1


def test_empty_ruleset_matches_nothing() -> None:
    assert not rules.EMPTY
    assert rules.EMPTY.match(rf.get("/anything/")) == ()


def test_a_path_seen_again_matches_the_same_rules_and_the_memo_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rules that need no URL name are matched once per (path, method): the memo answers
    the same rules again, keeps methods apart, and starts over when full (a client chooses
    its paths)."""
    rs = ruleset(
        {**BASE, "name": "api", "path": "/api/"},
        {**BASE, "name": "post", "path": "/api/", "methods": "POST"},
    )
    monkeypatch.setattr(rules, "MATCH_MEMO", 3)
    first = rs.match(rf.get("/api/a"))
    assert names(first) == ["api"] and rs.match(rf.get("/api/a")) is first
    assert names(rs.match(rf.post("/api/a"))) == ["api", "post"]
    for i in range(10):
        assert names(rs.match(rf.get(f"/api/{i}"))) == ["api"]
    assert len(rs._matched) <= 3
    assert names(rs.match(rf.post("/api/a"))) == ["api", "post"]
    rs._matched.clear()
    long_path = "/api/" + "x" * rules.MATCH_MEMO_PATH
    assert names(rs.match(rf.get(long_path))) == ["api"]
    assert (long_path, "GET") not in rs._matched  # matched, not remembered


def test_a_long_method_is_matched_but_not_remembered() -> None:
    """The method is the client's text too: the memo keeps no more of it than of a path."""
    rs = ruleset({**BASE, "name": "api", "path": "/api/"})
    method = "X" * 5000
    assert names(rs.match(rf.generic(method, "/api/a"))) == ["api"]
    assert ("/api/a", method) not in rs._matched
    assert names(rs.match(rf.get("/api/a"))) == ["api"]
    assert ("/api/a", "GET") in rs._matched


@override_settings(ROOT_URLCONF="tests.ratelimit.urls")
def test_the_url_name_memo_is_bounded_whatever_the_paths() -> None:
    """Rules with a URL name resolve each path once and remember its name, but a client
    chooses its paths: 4,096 made-up paths of 16 KB once stayed in memory (40 MB a process).
    A long path is resolved and forgotten; the memo of short ones starts over when full."""
    import tracemalloc

    rules.url_names().clear()
    rs = ruleset({"name": "by-name", "url_name": "rules-named", "key": "ip", "rate": "5/m"})
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(300):
            assert rs.match(_request(f"/rules/{i}/" + "x" * 16_000)) == ()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 500_000  # 300 paths of 16 KB: 4.8 MB when each was kept
    for i in range(3 * rules.MATCH_MEMO):
        assert rs.match(rf.get(f"/p/{i}/")) == ()
    assert len(rules.url_names()) <= rules.MATCH_MEMO
    kept = sum(len(path) for path, _ in rules.url_names())
    assert kept <= rules.MATCH_MEMO * rules.MATCH_MEMO_PATH
    assert names(rs.match(rf.get("/rules/named/"))) == ["by-name"]
    assert names(rs.match(rf.get("/rules/named/"))) == ["by-name"]  # from the memo
    assert ("/rules/named/", None) in rules.url_names()


def _request(path: str) -> HttpRequest:
    """A GET of ``path``, as a server makes it (the test client keeps the last paths it
    parsed, in ``urllib.parse``'s own memo)."""
    request = HttpRequest()
    request.method = "GET"
    request.path = request.path_info = path
    return request
