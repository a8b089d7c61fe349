"""``ratelimit_usage`` and ``ratelimit_reset`` with ``--key`` and ``--rate`` (issue "An
operator's first day", item 11): a name the site does not know is said on stderr before it
is read as a raw group, and a view's name reads the view's own counters, not a group named
like the view."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from ratelimit_app import store
from ratelimit_app.decorators import ratelimit
from ratelimit_app.testing import forget_refusals, frozen_clock

T0 = 1_800_000_000.0
HERE = __name__
IP = "127.0.0.1"
KEYED = ("--key", "ip", "--rate", "5/m")


@ratelimit(key="ip", rate="5/m")
def hello(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(group="two-ip", key="ip", rate="5/m")
@ratelimit(group="two-user", key="user_or_ip", rate="50/h")
def two(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("hello/", hello, name="hello"),
    path("two/", two, name="two"),
    path("plain/", plain, name="plain"),
]
RULES: list[dict[str, Any]] = [{"name": "api-ip", "path": "/plain/", "key": "ip", "rate": "5/m"}]


@pytest.fixture(autouse=True)
def site(backend_kind: str) -> Iterator[None]:
    with override_settings(
        ROOT_URLCONF=HERE,
        MIDDLEWARE=["ratelimit_app.middleware.RatelimitMiddleware"],
        RATELIMIT_RULES=RULES,
    ):
        store.forget()
        caches["default"].clear()
        forget_refusals()
        yield
    store.forget()


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def count(*args: str) -> tuple[int, str]:
    out, err = run("ratelimit_usage", *args, "--json")
    return int(json.loads(out)["count"]), err


def hits(url: str, n: int) -> list[int]:
    client = Client()
    return [client.get(url, REMOTE_ADDR=IP).status_code for _ in range(n)]


def test_a_views_url_name_with_key_and_rate_reads_the_views_counters() -> None:
    """The issue: ``hello --key ip --rate 5/m`` read 0 where the view's counter held 3."""
    with frozen_clock(T0):
        assert hits("/hello/", 3) == [200] * 3
        assert count("hello", IP) == (3, "")
        assert count("hello", IP, *KEYED) == (3, "")
        out, err = run("ratelimit_reset", "hello", IP, *KEYED)
        assert (out, err) == (f"Reset {IP} for group {HERE}.hello.\n", "")
        assert count("hello", IP) == (0, "")


@pytest.mark.parametrize("command", ["ratelimit_usage", "ratelimit_reset"])
def test_an_unknown_name_is_said_on_stderr_before_it_is_read(command: str) -> None:
    out, err = run(command, "zz_absent_view", IP, *KEYED)
    assert err.startswith("Warning: 'zz_absent_view' is no rule, DRF throttle scope")
    assert "raw group 'zz_absent_view'" in err
    assert "zz_absent_view" in out  # and it goes on, as before


def test_other_arguments_than_the_views_are_said_on_stderr() -> None:
    with frozen_clock(T0):
        assert hits("/hello/", 2) == [200] * 2
        found, err = count("hello", IP, "--key", "ip", "--rate", "7/m")
    assert found == 0
    assert "read other counters than its own" in err and "5/m" in err


def test_a_rule_named_with_its_own_key_and_rate_is_its_counters() -> None:
    with frozen_clock(T0):
        assert hits("/plain/", 2) == [200] * 2
        assert count("api-ip", IP, *KEYED) == (2, "")


def test_a_view_of_two_groups_takes_the_one_whose_arguments_are_given() -> None:
    with frozen_clock(T0):
        assert hits("/two/", 2) == [200] * 2
        out, err = run("ratelimit_usage", "two", IP, *KEYED)
    assert out.startswith(f"Group two-ip (key ip; @ratelimit on two), subject {IP}:\n")
    assert "\n5/m       2      5 " in out and err == ""
    with pytest.raises(CommandError, match=r"'two' names 2 limits .*name one by its group"):
        run("ratelimit_usage", "two", IP, "--key", "ip", "--rate", "9/m")
