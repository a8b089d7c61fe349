from __future__ import annotations

from django.urls import path

from tests.ratelimit import views

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
]
