"""URLs of the shortener: the form, the redirects and a page per link."""

from __future__ import annotations

from django.urls import URLPattern, path

from demo_site.shortener import views

app_name = "shortener"

urlpatterns: list[URLPattern] = [
    path("", views.index, name="index"),
    path("s/<slug:key>", views.follow, name="follow"),
    path("links/<slug:key>/", views.link, name="link"),
]
