"""``manage.py ratelimit_usage`` and ``ratelimit_reset`` on counters real requests wrote.

The requests go through the Django test client, ``RatelimitMiddleware`` and the URLconf of
this module, on local memory, real memcached and real Redis (``backend_kind``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from ratelimit_app.backends import reset_backends
from ratelimit_app.decorators import ratelimit
from ratelimit_app.management.commands import ratelimit_reset, ratelimit_usage
from ratelimit_app.testing import frozen_clock

T0 = 1_800_000_000.0


def dynamic_rate(group: str, request: HttpRequest) -> str:
    """A rule's rate that depends on the request."""
    return "2/m"


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(group="cmd-group", key="ip", rate="2/m", method="POST")
def decorated(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("api/", ok),
    path("login/", ok),
    path("dyn/", ok),
    path("decorated/", decorated),
]

RULES: list[dict[str, Any]] = [
    {"name": "api-ip", "path": "/api/", "key": "ip", "rate": "3/m;10/h"},
    {"name": "login-email", "path": "/login/", "methods": ["POST"], "key": "email", "rate": "2/m"},
    {
        "name": "dyn-ip",
        "path": "/dyn/",
        "key": "ip",
        "rate": "tests.ratelimit.test_commands.dynamic_rate",
    },
]


@pytest.fixture
def site(backend_kind: str) -> Iterator[Client]:
    """A client whose requests the rules above count, on the backend of ``backend_kind``."""
    with override_settings(
        ROOT_URLCONF=__name__,
        MIDDLEWARE=["ratelimit_app.middleware.RatelimitMiddleware"],
        RATELIMIT_RULES=RULES,
    ):
        yield Client()


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def usage_json(*args: str) -> dict[str, Any]:
    usage: dict[str, Any] = json.loads(run("ratelimit_usage", *args, "--json"))
    return usage


def table(output: str) -> dict[str, list[str]]:
    """The rows of ``ratelimit_usage``'s table by rate, after checking the header row."""
    lines = output.splitlines()
    header = lines.index("rate  count  limit  remaining  reset (s)  state")
    rows: dict[str, list[str]] = {}
    for line in lines[header + 1 :]:
        cells = line.split()
        if len(cells) != 6:
            break
        rows[cells[0]] = cells[1:]
    return rows


def get(client: Client, url: str, ip: str) -> int:
    return client.get(url, REMOTE_ADDR=ip).status_code


def post(client: Client, url: str, ip: str, **data: str) -> int:
    return client.post(url, data, REMOTE_ADDR=ip).status_code


def test_usage_prints_an_aligned_table_per_rate(site: Client) -> None:
    with frozen_clock(T0 + 10):
        assert [get(site, "/api/", "192.0.2.50") for _ in range(2)] == [200, 200]
        output = run("ratelimit_usage", "api-ip", "192.0.2.50")
    assert output == (
        "Rule api-ip (key ip), subject 192.0.2.50:\n"
        "rate  count  limit  remaining  reset (s)  state\n"
        "3/m       2      3          1         61  ok\n"
        "10/h      2     10          8       3650  ok\n"
        "Not limited: 1 more admitted now (3/m).\n"
    )


def test_usage_json_is_the_usage_dict(site: Client) -> None:
    with frozen_clock(T0 + 10):
        for _ in range(4):
            get(site, "/api/", "192.0.2.51")
        usage = usage_json("api-ip", "192.0.2.51")
    assert usage["count"] == 3 and usage["limit"] == 3 and usage["remaining"] == 0
    assert usage["should_limit"] is True and usage["rate"] == "3/m"
    assert usage["retry_after"] == 61
    assert [(r["rate"], r["window"], r["count"], r["should_limit"]) for r in usage["rates"]] == [
        ("3/m", 60, 3, True),
        ("10/h", 3600, 3, False),
    ]


def test_reset_clears_the_counters_and_admits_again(site: Client) -> None:
    ip = "192.0.2.52"
    assert [get(site, "/api/", ip) for _ in range(4)] == [200, 200, 200, 429]
    other = "192.0.2.53"
    get(site, "/api/", other)
    output = run("ratelimit_usage", "api-ip", ip)
    assert table(output)["3/m"] == ["3", "3", "0", table(output)["3/m"][3], "limited"]
    assert "Limited by 3/m: the next request is admitted in" in output

    assert run("ratelimit_reset", "api-ip", ip) == f"Reset {ip} for rule api-ip.\n"

    after = usage_json("api-ip", ip)
    assert [r["count"] for r in after["rates"]] == [0, 0]
    assert after["count"] == 0 and not after["should_limit"]
    assert table(run("ratelimit_usage", "api-ip", ip))["10/h"][:3] == ["0", "10", "10"]
    assert usage_json("api-ip", other)["count"] == 1  # another subject is untouched
    assert [get(site, "/api/", ip) for _ in range(4)] == [200, 200, 200, 429]


def test_an_email_typed_with_other_case_and_spaces_finds_the_counters(site: Client) -> None:
    statuses = [post(site, "/login/", "192.0.2.54", email="Alice@Example.com") for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert usage_json("login-email", "  ALICE@example.COM ")["count"] == 2
    output = run("ratelimit_usage", "login-email", "alice@EXAMPLE.com")
    assert output.startswith("Rule login-email (key email), subject alice@example.com:\n")
    assert table(output)["2/m"][:3] == ["2", "2", "0"]

    reset_output = run("ratelimit_reset", "login-email", " ALICE@EXAMPLE.COM")
    assert reset_output == "Reset alice@example.com for rule login-email.\n"
    assert usage_json("login-email", "alice@example.com")["count"] == 0
    assert post(site, "/login/", "192.0.2.54", email="alice@example.com") == 200
    assert usage_json("login-email", "alice@example.com")["count"] == 1


def test_an_ip_finds_the_counters_of_its_fallback(site: Client) -> None:
    """Requests without an email are counted by IP; the IP finds and clears them."""
    ip = "192.0.2.55"
    assert [post(site, "/login/", ip) for _ in range(3)] == [200, 200, 429]
    output = run("ratelimit_usage", "login-email", ip)
    assert "fell back to it" in output
    assert table(output)["2/m"][:3] == ["2", "2", "0"]
    run("ratelimit_reset", "login-email", ip)
    assert usage_json("login-email", ip)["count"] == 0
    assert post(site, "/login/", ip) == 200


def test_a_decorator_group_is_found_by_its_key_rate_and_method(site: Client) -> None:
    ip = "192.0.2.56"
    assert [post(site, "/decorated/", ip) for _ in range(3)] == [200, 200, 429]
    group = ("cmd-group", ip, "--key", "ip", "--rate", "2/m")
    assert usage_json(*group, "--method", "post")["count"] == 2
    # Without the decorator's method= it is another limit, with its own (empty) counters.
    assert usage_json(*group)["count"] == 0
    output = run("ratelimit_usage", *group, "--method", "POST")
    assert output.startswith(f"Group cmd-group (key ip), subject {ip}:\n")
    assert table(output)["2/m"][:3] == ["2", "2", "0"]
    reset_output = run("ratelimit_reset", *group, "--method", "POST")
    assert reset_output == f"Reset {ip} for group cmd-group.\n"
    assert usage_json(*group, "--method", "POST")["count"] == 0
    assert post(site, "/decorated/", ip) == 200


def test_a_rule_with_a_rate_from_the_request_needs_the_rate(site: Client) -> None:
    ip = "192.0.2.57"
    assert [get(site, "/dyn/", ip) for _ in range(3)] == [200, 200, 429]
    with pytest.raises(CommandError, match=r"depends on the request.*pass --rate"):
        run("ratelimit_usage", "dyn-ip", ip)
    assert usage_json("dyn-ip", ip, "--rate", "2/m")["count"] == 2
    assert (
        run("ratelimit_reset", "dyn-ip", ip, "--rate", "2/m") == f"Reset {ip} for rule dyn-ip.\n"
    )
    assert get(site, "/dyn/", ip) == 200


def test_reset_is_quiet_with_verbosity_zero(site: Client) -> None:
    get(site, "/api/", "192.0.2.58")
    out = io.StringIO()
    call_command("ratelimit_reset", "api-ip", "192.0.2.58", verbosity=0, stdout=out)
    assert out.getvalue() == ""
    assert usage_json("api-ip", "192.0.2.58")["count"] == 0


@pytest.mark.parametrize("command", ["ratelimit_usage", "ratelimit_reset"])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope", "192.0.2.1"), r"No rule named 'nope'\. Configured rules: api-ip, dyn-ip, "),
        (("nope", "192.0.2.1"), r"pass --key and --rate"),
        (("api-ip", ""), r"The subject is empty"),
        (("login-email", "   "), r"The subject is empty.*keyed by email"),
        (("api-ip", "not-an-ip"), r"'not-an-ip' is not an IP address, and rule api-ip is keyed"),
        (("login-email", "\u200b\x00"), r"is not a subject rule login-email can count"),
        (("g", "192.0.2.1", "--key", "ip"), r"--key needs --rate"),
        (("g", "192.0.2.1", "--key", "nonsense", "--rate", "5/m"), r"--key: .*'nonsense'"),
        (("g", "192.0.2.1", "--key", "ip", "--rate", "5/M"), r"--rate: Invalid rate '5/M'"),
        (("g", "192.0.2.1", "--key", "ip", "--rate", "a.b"), r"names a function"),
        (("g", "192.0.2.1", "--key", "ip", "--rate", "5/m", "--method", "P0ST"), r"--method"),
        (("api-ip", "192.0.2.1", "--method", "POST"), r"--method is for a @ratelimit group"),
        (("api-ip", "192.0.2.1", "--rate", "5/m"), r"fixed rate 3/m;10/h: drop --rate"),
    ],
)
def test_user_errors_are_command_errors(
    site: Client, command: str, args: tuple[str, ...], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        run(command, *args)


def test_unknown_and_invalid_rules_are_named(backend_kind: str) -> None:
    with override_settings(RATELIMIT_RULES=[]), pytest.raises(CommandError, match="has no rules"):
        run("ratelimit_usage", "api-ip", "192.0.2.1")
    broken = [*RULES, {"name": "broken", "path": "/b/", "key": "ip", "rate": "5/M"}]
    with (
        override_settings(RATELIMIT_RULES=broken),
        pytest.raises(CommandError, match=r"Rule 'broken' is invalid .*'5/M'.*field 'rate'"),
    ):
        run("ratelimit_reset", "broken", "192.0.2.1")


@pytest.mark.parametrize("command", ["ratelimit_usage", "ratelimit_reset"])
def test_a_dead_backend_is_a_command_error(command: str) -> None:
    dead = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:9/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.05, "SOCKET_TIMEOUT": 0.05},
    }
    try:
        with (
            override_settings(
                CACHES={"default": dead, "rl": dead},
                RATELIMIT_USE_CACHE="rl",
                RATELIMIT_RULES=RULES,
            ),
            pytest.raises(CommandError, match=r"^counter backend failed: "),
        ):
            run(command, "api-ip", "192.0.2.1")
    finally:
        reset_backends()


def test_a_missing_cache_alias_is_a_command_error() -> None:
    with (
        override_settings(RATELIMIT_USE_CACHE="missing", RATELIMIT_RULES=RULES),
        pytest.raises(CommandError, match=r"misconfigured: .*'missing'"),
    ):
        run("ratelimit_usage", "api-ip", "192.0.2.1")


def test_the_command_line_prints_the_message_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    command = ratelimit_usage.Command()
    with override_settings(RATELIMIT_RULES=RULES), pytest.raises(SystemExit) as exit_info:
        command.run_from_argv(["manage.py", "ratelimit_usage", "nope", "192.0.2.1"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("CommandError: No rule named 'nope'.")
    assert "Traceback" not in err


@pytest.mark.parametrize("module", [ratelimit_usage, ratelimit_reset])
def test_help_keeps_its_examples_and_explains_groups(module: Any) -> None:
    name = module.__name__.rsplit(".", 1)[1]
    text = module.Command().create_parser("manage.py", name).format_help()
    assert f"\n  manage.py {name} login-email alice@example.com\n" in text
    assert "--key KEY" in text and "--rate RATE" in text and "--method METHOD" in text
    assert '"module.qualname"' in text
    assert ("--json" in text) == (module is ratelimit_usage)
