"""URLs of the demo site."""

from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

from demo_site import views
from demo_site.accounts.views import admin_password_change

urlpatterns: list[URLPattern | URLResolver] = [
    path("", include("demo_site.shortener.urls")),
    path("", include("demo_site.accounts.urls")),
    # login/, logout/, password_reset/, reset/<uidb64>/<token>/, password_change/...
    path("accounts/", include("django.contrib.auth.urls")),
    path("limits/", views.limits, name="limits"),
    path("site.css", views.stylesheet, name="stylesheet"),
    # The JSON API (Django REST framework, on ratelimit_app.throttling).
    path("api/", include("demo_site.api")),
    # The admin's password change checks the old password: the demo's form reports a wrong
    # one to the log-in rules (demo_site/accounts/passwords.py lists every such door).
    path(
        "admin/password_change/",
        admin.site.admin_view(admin_password_change, cacheable=True),
        name="admin-password-change",
    ),
    path("admin/", admin.site.urls),
]

# The demo's own 404 page (Django's technical page stays for DEBUG, except on the shortener's
# pages, which render this one for an unknown key).
handler404 = "demo_site.views.not_found"
