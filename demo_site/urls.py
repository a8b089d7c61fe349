"""URLs of the demo site."""

from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern, URLResolver, path

from demo_site import views

urlpatterns: list[URLPattern | URLResolver] = [
    path("", views.hello, name="hello"),
    path("admin/", admin.site.urls),
]
