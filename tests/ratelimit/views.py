"""Views decorated every way a project decorates them."""

from __future__ import annotations

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
