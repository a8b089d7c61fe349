"""The demo's stylesheet: one cached file every page links, served by Django itself."""

from __future__ import annotations

from django.test import Client

from demo_site.views import STYLESHEET


def test_every_page_links_the_stylesheet_and_carries_no_css(client: Client) -> None:
    page = client.get("/accounts/login/")
    text = page.content.decode()
    assert page.status_code == 200
    assert '<link rel="stylesheet" href="/site.css">' in text
    assert "<style" not in text


def test_the_stylesheet_is_served_cached_and_revalidated(client: Client) -> None:
    css = client.get("/site.css")
    assert css.status_code == 200
    assert css["Content-Type"] == "text/css; charset=utf-8"
    assert css["Cache-Control"] == "public, max-age=3600"
    assert css.content == STYLESHEET
    assert b"--accent:" in css.content  # the site's colours, as the pages use them
    again = client.get("/site.css", HTTP_IF_NONE_MATCH=css["ETag"])
    assert again.status_code == 304
    assert again.content == b""
    assert client.post("/site.css").status_code == 405
