"""An operator's first day (2, 3): docs/operators' ban examples, run as printed. The code
block of *Bans* is executed as it stands in the page: its rules and its throttle pass the
system checks, and its scanner rule bans a scanner of unknown short links (404s) from the
whole site, with the failure statuses the block sets."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.http import Http404, HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app import store, throttling
from ratelimit_app.decorators import ratelimit
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE
from tests.test_docs import python_blocks

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operators.rst"
T0 = 1_800_000_000.0


def bans_block() -> dict[str, Any]:
    """The names docs/operators' *Bans* block defines, executed as printed (its decorator
    and throttle base are the package's own)."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("\nBans\n----") :]
    block = python_blocks(section)[0]
    assert "RATELIMIT_RULES" in block and "class ApiThrottle" in block
    names: dict[str, Any] = {
        "ratelimit": ratelimit,
        "AnonRateThrottle": throttling.AnonRateThrottle,
        "__name__": __name__,
    }
    exec(compile(block, str(PAGE), "exec"), names)  # (our own page)
    return names


BLOCK = bans_block()


def short_link(request: HttpRequest, code: str) -> HttpResponse:
    raise Http404("no such link")


def home(request: HttpRequest) -> HttpResponse:
    return HttpResponse("home")


class Api(APIView):
    throttle_classes = [BLOCK["ApiThrottle"]]

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


urlpatterns = [
    path("s/<str:code>/", short_link),
    path("", home),
    path("api/", Api.as_view()),
    path("search/", BLOCK["search"]),
]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    store.forget()
    forget_refusals()
    settings = {
        "MIDDLEWARE": MIDDLEWARE,
        "RATELIMIT_RULES": BLOCK["RATELIMIT_RULES"],
        "RATELIMIT_FAILURE_STATUSES": BLOCK["RATELIMIT_FAILURE_STATUSES"],
        "REST_FRAMEWORK": {"DEFAULT_THROTTLE_RATES": {"api": "100/h"}},
    }
    with override_settings(**settings):
        yield
    store.forget()
    forget_refusals()


def test_the_block_passes_the_system_checks() -> None:
    """The rules and the throttle as printed: no error of ours (the throttle's ``max`` was
    ``"1w"``, which no duration takes, and stopped the site with E021)."""
    found = [m for m in checks.run_checks() if m.id and m.id.startswith("ratelimit_app.")]
    assert [m for m in found if m.level >= checks.ERROR] == [], found


def test_the_scanner_of_unknown_links_is_banned_from_the_whole_site(client: Client) -> None:
    """45 unknown links from one address: 30 answered 404, then refusals; the fifth refusal
    bans the address, and the site's home page answers 429 to it (not to others)."""
    statuses = []
    with frozen_clock(T0):
        for i in range(45):
            statuses.append(client.get(f"/s/zz{i}/", REMOTE_ADDR="198.51.100.9").status_code)
        home_banned = client.get("/", REMOTE_ADDR="198.51.100.9")
        home_other = client.get("/", REMOTE_ADDR="198.51.100.10")
    assert statuses[:30] == [404] * 30
    assert set(statuses[30:]) == {429}
    assert home_banned.status_code == 429, "the scanner is banned on every path"
    wait = int(home_banned["Retry-After"])
    assert 14 * 60 < wait <= 15 * 60
    assert home_other.status_code == 200


def test_without_404_among_the_failures_the_scanner_is_never_refused(client: Client) -> None:
    """Why the block sets the statuses: with the default (400, 401, 403), the same 45
    unknown links are 45 times 404 and no refusal (what the page printed before)."""
    with override_settings(RATELIMIT_FAILURE_STATUSES=[400, 401, 403]), frozen_clock(T0):
        statuses = {
            client.get(f"/s/zz{i}/", REMOTE_ADDR="198.51.100.77").status_code for i in range(45)
        }
    assert statuses == {404}


def test_the_printed_durations_are_all_accepted() -> None:
    """Every duration the block prints is one the bans take (``s``, ``m``, ``h``, ``d``)."""
    text = PAGE.read_text(encoding="utf-8")
    block = python_blocks(text[text.index("\nBans\n----") :])[0]
    for value in re.findall(r'"(?:within|for|max)": "([^"]+)"', block):
        assert re.fullmatch(r"\d+[smhd]", value), value
