"""URLs of the demo's accounts, beside django.contrib.auth's under /accounts/ (included
before them: the password change here replaces Django's)."""

from __future__ import annotations

from django.urls import URLPattern, path

from demo_site.accounts import views

urlpatterns: list[URLPattern] = [
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/password_change/", views.PasswordChange.as_view(), name="password_change"),
    path("messages/", views.board, name="messages"),
    path("messages/send/", views.send_message, name="send_message"),
]
