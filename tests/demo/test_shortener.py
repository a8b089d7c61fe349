"""The URL shortener through the demo's URLconf: create, refuse bad URLs, redirect and count,
and chart."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client, override_settings

import metrics_app
from demo_site.shortener.keys import ALPHABET, LENGTH, KeyspaceExhausted, create_link
from demo_site.shortener.models import MAX_URL_LENGTH, Link
from metrics_app import clock, query
from metrics_app.models import Series
from metrics_app.testing import frozen_clock
from ratelimit_app.testing import frozen_clock as frozen_ratelimit_clock

NOW = datetime(2026, 11, 22, 13, 5, tzinfo=UTC)


def shorten(client: Client, url: str) -> tuple[int, str]:
    """POST the form; the status and the location (or the page)."""
    response = client.post("/", {"url": url})
    if response.status_code == 302:
        return 302, response["Location"]
    return response.status_code, response.content.decode()


class TestCreate:
    def test_a_link_gets_a_random_key_and_its_page(self, client: Client) -> None:
        status, location = shorten(client, "https://example.com/a/long/page?q=1#top")
        assert status == 302
        match = re.fullmatch(r"/links/([^/]+)/", location)
        assert match is not None
        key = match.group(1)
        assert len(key) == LENGTH and set(key) <= set(ALPHABET)
        link = Link.objects.get(key=key)
        assert link.url == "https://example.com/a/long/page?q=1#top"
        page = client.get(location)
        assert page.status_code == 200
        text = page.content.decode()
        assert f"http://testserver/s/{key}" in text
        assert "Your short link is ready." in text

    def test_keys_differ(self, client: Client) -> None:
        for _ in range(5):
            assert shorten(client, "https://example.com/")[0] == 302
        assert Link.objects.values("key").distinct().count() == 5

    def test_a_url_without_scheme_is_read_as_https(self, client: Client) -> None:
        assert shorten(client, "example.com/page")[0] == 302
        assert Link.objects.get().url == "https://example.com/page"

    def test_the_creator_is_kept_when_logged_in(
        self, client: Client, django_user_model: Any
    ) -> None:
        user = django_user_model.objects.create_user("ann", password="pw")
        client.force_login(user)
        assert shorten(client, "https://example.com/")[0] == 302
        assert Link.objects.get().created_by == user


BAD_URLS = [
    "",
    "   ",
    "not a url",
    "http://",
    "https://exa mple.com/",
    "ftp://example.com/file",
    "javascript:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "file:///etc/passwd",
    "http://[::1",
    "https://example.com/\x00",
    "https://example.com/" + "a" * MAX_URL_LENGTH,
]


def errors_of(page: str) -> list[str]:
    """The messages of the form's error lists, in order."""
    return [
        message
        for errors in re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.S)
        for message in re.findall(r"<li>(.*?)</li>", errors, re.S)
    ]


@pytest.mark.parametrize("url", BAD_URLS)
def test_bad_urls_are_form_errors_said_once(client: Client, url: str) -> None:
    status, page = shorten(client, url)
    assert status == 400
    errors = errors_of(page)
    assert len(errors) == 1, errors
    assert not Link.objects.exists()


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("not a url", "Enter a valid URL."),
        ("http://", "Enter a valid URL."),
        ("https://exa mple.com/", "Enter a valid URL."),
        ("http://[::1", "Enter a valid URL."),
        (
            "ftp://example.com/file",
            "Links starting with ftp: cannot be shortened: http and https only.",
        ),
        (
            "FTP://example.com/file",
            "Links starting with ftp: cannot be shortened: http and https only.",
        ),
        (
            "javascript:alert(1)",
            "Links starting with javascript: cannot be shortened: http and https only.",
        ),
        (
            "file:///etc/passwd",
            "Links starting with file: cannot be shortened: http and https only.",
        ),
        (
            "https://example.com/" + "a" * MAX_URL_LENGTH,
            "Ensure this value has at most 2000 characters (it has 2020).",
        ),
        # Longer than any URL Django checks: the length, not "Enter a valid URL." as well.
        (
            "https://example.com/" + "a" * 3000,
            "Ensure this value has at most 2000 characters (it has 3020).",
        ),
    ],
)
def test_each_mistake_gets_its_message(client: Client, url: str, error: str) -> None:
    assert errors_of(shorten(client, url)[1]) == [error]


def test_a_post_without_the_field_is_a_form_error(client: Client) -> None:
    response = client.post("/", {})
    assert response.status_code == 400
    assert b"This field is required." in response.content


def test_other_methods_are_refused(client: Client) -> None:
    assert client.put("/").status_code == 405


class TestKeys:
    def test_a_taken_key_is_drawn_again(self) -> None:
        Link.objects.create(key="taken", url="https://example.com/1")
        draws = iter(["taken", "taken", "fresh"])
        link = create_link("https://example.com/2", draw=lambda: next(draws))
        assert link.key == "fresh"
        assert Link.objects.get(key="taken").url == "https://example.com/1"

    def test_giving_up_after_too_many_collisions(self) -> None:
        Link.objects.create(key="taken", url="https://example.com/1")
        with pytest.raises(KeyspaceExhausted):
            create_link("https://example.com/2", draw=lambda: "taken")
        assert Link.objects.count() == 1

    def test_the_page_says_so_when_no_key_is_free(
        self, client: Client, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        Link.objects.create(key="taken", url="https://example.com/1")
        monkeypatch.setattr(
            "demo_site.shortener.views.create_link",
            lambda url, user=None: create_link(url, user=user, draw=lambda: "taken"),
        )
        status, page = shorten(client, "https://example.com/2")
        assert status == 503
        assert "No free short key was found" in page

    def test_alphabet_has_no_look_alikes(self) -> None:
        assert len(ALPHABET) == len(set(ALPHABET)) == 56
        assert not set(ALPHABET) & set("0Oo1lI")


class TestRedirect:
    def test_only_redirects_served_are_counted(self, client: Client) -> None:
        link = Link.objects.create(key="abc", url="https://example.com/target")
        with frozen_clock(NOW):
            first = client.get("/s/abc")
            assert first.status_code == 302
            assert first["Location"] == "https://example.com/target"
            assert "no-cache" in first["Cache-Control"]
            assert client.head("/s/abc").status_code == 302
            assert client.get("/s/nope").status_code == 404
            assert client.post("/s/abc").status_code == 405
            assert client.get("/s/a.b").status_code == 404  # not a key at all
            metrics_app.flush()
        assert query.total(link.series_name) == 2
        assert list(Series.objects.values_list("name", flat=True)) == ["shorturl:abc"]

    def test_visits_are_counted_in_their_minute(self, client: Client) -> None:
        Link.objects.create(key="abc", url="https://example.com/")
        with frozen_clock(NOW):
            for _ in range(3):
                client.get("/s/abc")
            metrics_app.flush()
            points = query.series("shorturl:abc", NOW, NOW.replace(minute=6))
        assert points == [(NOW, 3)]

    def test_guessing_keys_is_limited_per_ip(self, client: Client) -> None:
        with frozen_ratelimit_clock(1_800_000_000):
            codes = [client.get(f"/s/guess{n}").status_code for n in range(31)]
        assert codes == [404] * 30 + [429]


class TestChartPage:
    def test_every_period_draws_at_most_150_bars(self, client: Client) -> None:
        Link.objects.create(key="abc", url="https://example.com/")
        with frozen_clock(NOW) as clock:
            client.get("/s/abc")
            metrics_app.flush()
            clock.advance(30)  # the chart ends now: mid-minute, as it nearly always is
            for period, length, width in (
                ("24h", timedelta(days=1), "10 minutes"),
                ("7d", timedelta(days=7), "2 hours"),
                ("30d", timedelta(days=30), "6 hours"),
                ("1y", timedelta(days=365), "1 week"),
            ):
                page = client.get(f"/links/abc/?period={period}")
                assert page.status_code == 200
                text = page.content.decode()
                end = NOW + timedelta(seconds=30)
                bars = len(
                    query.series("shorturl:abc", end - length, end, page.context["chart"].step)
                )
                assert text.count('<g class="bkt-mark">') == bars <= 150, period
                assert f"one bar per {width}" in text
                assert '<svg xmlns="http://www.w3.org/2000/svg" class="bkt-chart"' in text
                assert f'href="?period={period}" aria-current="page"' in text
                assert "<b>1</b> visits in" in text

    def test_a_day_stays_in_10_minute_bars_when_a_second_passes_during_the_query(
        self, client: Client, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        Link.objects.create(key="abc", url="https://example.com/")
        ticks = iter(NOW.timestamp() + 30.995 + n / 100 for n in range(10_000))
        monkeypatch.setattr(clock, "now", lambda: next(ticks))  # a whole second goes by
        page = client.get("/links/abc/?period=24h").content.decode()
        assert "one bar per 10 minutes" in page
        assert page.count('<g class="bkt-mark">') == 145

    def test_zoom_into_an_hour_by_the_minute(self, client: Client) -> None:
        Link.objects.create(key="abc", url="https://example.com/")
        with frozen_clock(NOW - timedelta(hours=3)):
            client.get("/s/abc")
            metrics_app.flush()
        with frozen_clock(NOW):
            whole = client.get("/links/abc/").content.decode()
            assert '<option value="2026-11-22T10:00">Nov 22, 10:00</option>' in whole
            page = client.get("/links/abc/", {"zoom": "2026-11-22T10:00"})
        text = page.content.decode()
        assert text.count('<g class="bkt-mark">') == 60
        assert "<b>1</b> visits in 10:00\N{EN DASH}11:00 UTC, Nov 22" in text
        assert "one bar per 1 minute" in text
        assert "<title>2026-11-22 10:05 UTC: 1</title>" in text
        assert 'href="?period=24h" aria-current="page"' in text

    def test_an_unknown_period_shows_the_first(self, client: Client) -> None:
        Link.objects.create(key="abc", url="https://example.com/")
        page = client.get("/links/abc/?period=<script>")
        assert page.status_code == 200
        assert b'href="?period=24h" aria-current="page"' in page.content
        assert b"<script>" not in page.content

    def test_an_unknown_key_is_404(self, client: Client) -> None:
        assert client.get("/links/nope/").status_code == 404

    def test_scanning_link_pages_is_limited_per_ip(self, client: Client) -> None:
        Link.objects.create(key="abc", url="https://example.com/")
        with frozen_ratelimit_clock(1_800_000_000):
            codes = [client.get(f"/links/guess{n}/").status_code for n in range(31)]
            # Pages of links that exist are not guesses: they count nothing, and are refused
            # like the rest once the address is over the limit (the rule checks first).
            assert client.get("/links/abc/").status_code == 429
        assert codes == [404] * 30 + [429]

    def test_both_pages_share_one_budget(self, client: Client) -> None:
        with frozen_ratelimit_clock(1_800_000_000):
            codes = [
                client.get(f"/s/guess{n}" if n % 2 else f"/links/guess{n}/").status_code
                for n in range(31)
            ]
        assert codes == [404] * 30 + [429]

    def test_a_query_error_is_said_not_raised(
        self, client: Client, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        Link.objects.create(key="abc", url="https://example.com/")

        def refuse(*args: object, **kwargs: object) -> None:
            raise ValueError("step 60s is finer than the 300s buckets")

        monkeypatch.setattr(query, "series", refuse)
        page = client.get("/links/abc/")
        assert page.status_code == 200
        assert b"This period cannot be drawn right now" in page.content

    def test_urls_are_escaped(self, client: Client) -> None:
        Link.objects.create(key="abc", url='https://example.com/"><script>alert(1)</script>')
        for path in ("/", "/links/abc/"):
            page = client.get(path).content.decode()
            assert "<script>alert(1)</script>" not in page
            assert "&lt;script&gt;" in page

    def test_staff_get_a_link_to_the_admin_page(self, admin_client: Client) -> None:
        Link.objects.create(key="abc", url="https://example.com/")
        admin_client.get("/s/abc")
        metrics_app.flush()
        pk = Series.objects.get(name="shorturl:abc").pk
        page = admin_client.get("/links/abc/")
        assert f'href="/admin/metrics_app/series/{pk}/change/"'.encode() in page.content


def test_home_page_lists_recent_links_with_sparklines(client: Client) -> None:
    Link.objects.create(key="abc", url="https://example.com/one")
    with frozen_clock(NOW) as clock:
        client.get("/s/abc")
        client.get("/s/abc")
        metrics_app.flush()
        clock.advance(30)
        page = client.get("/")
    text = page.content.decode()
    assert page.status_code == 200
    assert 'href="/links/abc/"' in text
    assert "https://example.com/one" in text
    assert "/s/abc: 2 visits in the last 24 hours" in text  # the sparkline's title


def test_creating_links_is_limited_by_the_decorator(client: Client) -> None:
    with frozen_ratelimit_clock(1_800_000_000):
        codes = [shorten(client, f"https://example.com/{n}")[0] for n in range(11)]
        page = client.post("/", {"url": "https://example.com/more"})
        assert client.get("/").status_code == 200  # reading is not limited
    assert codes == [302] * 10 + [429]
    assert Link.objects.count() == 10
    assert page.status_code == 429
    text = page.content.decode()
    # The form again, with the URL as typed, saying that no link was made and when to retry
    # (the headers of ratelimit_app's own 429, which say the same wait).
    wait = int(page["Retry-After"])
    assert 55 <= wait <= 61
    assert errors_of(text) == [
        "Your link was not created: links are limited to 10/m per account (per address when "
        f"logged out). Try again in {wait} seconds."
    ]
    assert 'value="https://example.com/more"' in text
    assert page["RateLimit-Policy"] == (
        '"10/m";q=10;w=60, "100/d";q=100;w=86400, "1000/month (UTC)";q=1000;w=2682000'
    )
    assert page["RateLimit"].startswith('"10/m";r=0;t=')


def test_a_json_client_gets_the_problem(client: Client) -> None:
    with frozen_ratelimit_clock(1_800_000_000):
        for n in range(10):
            shorten(client, f"https://example.com/{n}")
        refused = client.post("/", {"url": "https://example.com/"}, HTTP_ACCEPT="application/json")
    assert refused.status_code == 429
    assert refused["Content-Type"] == "application/problem+json"
    assert refused.json()["retry_after"] == int(refused["Retry-After"]) > 0


class TestNotFound:
    """Unknown keys get the demo's 404 page, with DEBUG on (as make demo runs) and off."""

    @pytest.mark.parametrize("debug", [True, False])
    @pytest.mark.parametrize("path", ["/s/nope", "/links/nope/"])
    def test_unknown_keys(self, client: Client, debug: bool, path: str) -> None:
        with override_settings(DEBUG=debug):
            page = client.get(path)
        text = page.content.decode()
        assert page.status_code == 404
        assert "<h1>Nothing here</h1>" in text
        assert f"No page or short link is at <code>{path}</code>" in text
        assert 'class="brand"' in text  # the site's header, not Django's technical page
        assert "URLconf" not in text and "Http404" not in text

    def test_any_unknown_page_without_debug(self, client: Client) -> None:
        page = client.get("/nowhere/<b>x</b>")
        assert page.status_code == 404
        text = page.content.decode()
        assert "<h1>Nothing here</h1>" in text
        assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text


def test_a_links_status_is_an_async_view_with_a_limit_of_its_own(client: Client) -> None:
    """``/api/links/<key>/status/``: the demo's async view, its limit checked on the event
    loop; 60 a minute per address, then the site's 429."""
    Link.objects.create(key="abc", url="https://example.com/")
    with frozen_ratelimit_clock(1_800_000_000):
        unknown = client.get("/api/links/nope/status/")  # (its first of 60)
        answers = [client.get("/api/links/abc/status/") for _ in range(60)]
    assert unknown.status_code == 404 and unknown.json() == {"error": "no such link"}
    assert [a.status_code for a in answers] == [200] * 59 + [429]
    assert answers[0].json() == {
        "key": "abc",
        "url": "https://example.com/",
        "short_url": "http://testserver/s/abc",
    }
    assert '"60/m";q=60;w=60' in answers[0]["RateLimit-Policy"]
