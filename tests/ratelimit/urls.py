from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from tests.ratelimit import views

inner = ([path("inner/", views.plain, name="rules-inner")], "ns")

urlpatterns = [
    path("blocking/", views.blocking),
    path("annotating/", views.annotating),
    path("post-only/", views.post_only),
    path("async/", views.async_view),
    path("stacked/", views.stacked),
    path("method-decorated/", views.MethodDecorated.as_view()),
    path("plain-method/", views.PlainMethod.as_view()),
    path("class-decorated/", views.ClassDecorated.as_view()),
    path("async-class/", views.AsyncClassDecorated.as_view()),
    path("async-user-or-ip/", views.async_user_or_ip),
    path("async-user/", views.async_user),
    # Behind RATELIMIT_RULES.
    path("admin/", admin.site.urls),
    path("rules/named/", views.plain, name="rules-named"),
    path("rules/unnamed/", views.plain),
    path("rules/ns/", include(inner)),
    path("rules/async/", views.async_plain),
    path("rules/status/<int:code>/", views.status),
    path("rules/slow/<int:code>/", views.slow_status),
    path("rules/annotated/", views.annotated),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(template_name="admin/login.html"),
        name="login",
    ),
    path(
        "accounts/password_reset/",
        auth_views.PasswordResetView.as_view(success_url="/accounts/password_reset/done/"),
        name="password_reset",
    ),
    path(
        "accounts/reset/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(),
        name="password_reset_confirm",
    ),
    path("accounts/signup/", views.signup, name="signup"),
    path("messages/send/", views.send_message, name="send_message"),
]
