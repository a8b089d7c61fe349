"""Views whose throttles of ours cannot count (for the system check E021); URLconf below."""

from __future__ import annotations

from django.urls import include, path
from rest_framework.views import APIView

from ratelimit_app import throttling


class BadRate(throttling.AnonRateThrottle):
    rate = "10/M"


class TwoRatesLeaky(throttling.AnonRateThrottle):
    rate = "1/s;10/m"
    algorithm = "leaky_bucket"


class NoRate(throttling.AnonRateThrottle):
    rate = None  # DRF's "throttle nothing": fine


class BadRateView(APIView):
    throttle_classes = [BadRate, NoRate]


class LeakyView(APIView):
    throttle_classes = [TwoRatesLeaky]


class UnknownScopeView(APIView):
    throttle_classes = [throttling.ScopedRateThrottle]
    throttle_scope = "nowhere"


class UnscopedView(APIView):
    throttle_classes = [throttling.ScopedRateThrottle]  # no scope: not throttled, fine


urlpatterns = [
    path("bad/", BadRateView.as_view()),
    path("leaky/", LeakyView.as_view()),
    # Nested: the check walks included URLconfs too.
    path("api/", include([path("scope/", UnknownScopeView.as_view())])),
    path("unscoped/", UnscopedView.as_view()),
]
