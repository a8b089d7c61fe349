"""Views decorated every way a project decorates them."""

from __future__ import annotations

import threading
import time

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View

from ratelimit_app.decorators import ratelimit
from ratelimit_app.exceptions import Ratelimited


@ratelimit(key="ip", rate="3/m")
def blocking(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(key="ip", rate="2/m", block=False)
def annotating(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"limited": request.limited})  # type: ignore[attr-defined]


@ratelimit(key="ip", rate="2/m", method="POST")
def post_only(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(key="ip", rate="2/m")
async def async_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(group="shared", key="ip", rate="2/m")
@ratelimit(group="shared-daily", key="ip", rate="100/d")
def stacked(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class MethodDecorated(View):
    @method_decorator(ratelimit(key="ip", rate="2/m"))
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


class PlainMethod(View):
    @ratelimit(key="ip", rate="2/m")
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


@ratelimit(key="ip", rate="2/m")
class ClassDecorated(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


@ratelimit(key="ip", rate="2/m")
class AsyncClassDecorated(View):
    async def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


def custom_ratelimited_view(request: HttpRequest, exception: Exception) -> HttpResponse:
    return HttpResponse("slow down", status=429)


class TooMany(Ratelimited):
    pass


# -- views behind RATELIMIT_RULES (tests/ratelimit/test_middleware.py, test_scenarios.py) --


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


async def async_plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def status(request: HttpRequest, code: int) -> HttpResponse:
    """Answers with the status in the URL (failure-only rules count 400, 401, 403)."""
    return HttpResponse(f"status {code}", status=code)


def annotated(request: HttpRequest) -> HttpResponse:
    """What a ``block: False`` rule tells the view."""
    usage = getattr(request, "ratelimit_usage", {})
    return JsonResponse(
        {
            "limited": getattr(request, "limited", False),
            "rules": {name: u["count"] for name, u in usage.items()},
        }
    )


def signup(request: HttpRequest) -> HttpResponse:
    """A sign-up form: Django's UserCreationForm, a redirect when it is valid."""
    from django.contrib.auth.forms import UserCreationForm
    from django.contrib.auth.models import User
    from django.shortcuts import redirect

    form: UserCreationForm[User] = UserCreationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        form.save()
        return redirect("/")
    return HttpResponse(f"<form>{form}</form>")


def send_message(request: HttpRequest) -> HttpResponse:
    """Sends a message as the logged-in user (one per second per user)."""
    if not request.user.is_authenticated:
        return HttpResponse("log in first", status=401)
    return HttpResponse("sent")


@ratelimit(key="user_or_ip", rate="2/m")
async def async_user_or_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(key="user", rate="2/m")
async def async_user(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class SlowFailures:
    """A view that takes a while and answers the status in its URL, counting the requests
    that reach it: what concurrent password guesses look like to a failure-only rule."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reached = 0
        self.delay = 0.2

    def __call__(self, request: HttpRequest, code: int) -> HttpResponse:
        with self.lock:
            self.reached += 1
        time.sleep(self.delay)
        return HttpResponse(f"status {code}", status=code)


slow_status = SlowFailures()
