"""URLs of the load bench: one plain view, counted or not, behind rules or decorators or not;
then every URL of demo_site (``/s/<key>`` among them).

The view answers any method; the bench POSTs ``email=...&password=...`` (a login form), so the
``email`` rule and django-ratelimit's ``post:email`` key have a value to count. CSRF is off
for these views only: wrk sends no token.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, include, path
from django.views.decorators.csrf import csrf_exempt
from django_ratelimit.decorators import ratelimit

from bench.load_site import HUGE
from metrics_app.decorators import count_visits

#: The series the counted bench views record into.
SERIES = "bench:visits"


def plain(request: HttpRequest) -> HttpResponse:
    """Read the form's email, as a login view would, and answer ``ok``."""
    request.POST.get("email")
    return HttpResponse(b"ok", content_type="text/plain")


counted = count_visits(series=SERIES)(plain)

# django-ratelimit 4.1, three stacked decorators with the keys and rates of the three rules.
# block=True: a refused (or, without RATELIMIT_FAIL_OPEN, failed) check raises, which the
# bench sees as a non-2xx answer.
decorated = plain
for key, period in (("ip", "d"), ("post:email", "h"), ("ip", "m")):
    decorated = ratelimit(key=key, rate=f"{HUGE}/{period}", block=True)(decorated)

# The same flood against django-ratelimit: one decorator, a limit the client is over after
# its first request; its refusal raises Ratelimited, a PermissionDenied: Django's 403.
flooded = ratelimit(key="ip", rate="1/h", block=True)(plain)

urlpatterns: list[URLPattern | URLResolver] = [
    path("bench/plain/", csrf_exempt(plain)),
    path("bench/counted/", csrf_exempt(counted)),
    # RATELIMIT_RULES match path prefixes: both are behind the bench's three rules.
    path("bench/rules/", csrf_exempt(plain)),
    path("bench/rules/counted/", csrf_exempt(counted)),
    path("bench/one/counted/", csrf_exempt(counted)),
    path("bench/django-ratelimit/", csrf_exempt(decorated)),
    # Behind the bench's leaky bucket (bench.claims.memos).
    path("bench/leaky/counted/", csrf_exempt(counted)),
    # Behind the bench's flood rules (429 from the second request of each client on).
    path("bench/flood/", csrf_exempt(plain)),
    path("bench/botnet/", csrf_exempt(plain)),
    path("bench/django-ratelimit/flood/", csrf_exempt(flooded)),
    # bench.load_floor.RoundTripFloor makes one round trip for these (no rule covers them).
    path("bench/floor/counted/", csrf_exempt(counted)),
    path("", include("demo_site.urls")),
]
