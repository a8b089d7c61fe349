"""The demo's JSON API, built with Django REST framework, behind ``ratelimit_app.throttling``.

* ``POST /api/links/`` with ``{"url": "https://..."}``: a new short link (201, with its
  ``Location``), or the URL's error (400);
* ``GET /api/links/<key>/visits/?period=24h|7d|30d|1y``: the link's visits from
  ``metrics_app`` (its all-time total and one count per bucket of the period).

Every API view is throttled by ``REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]`` (our
``AnonRateThrottle`` and ``UserRateThrottle``: the one-line switch from DRF's), with the
rates of ``DEFAULT_THROTTLE_RATES``. A view's throttles are checked in one round trip,
answers carry the ``RateLimit`` headers, and a 429 its ``Retry-After`` (see
``docs/drf.rst``).

Three limits are not DRF's throttles, because a throttle cannot hold them:

* a password (HTTP Basic) is checked before any throttle runs: the log-in rules of the
  settings count wrong ones, with the log-in form's, in one budget per account
  (:mod:`demo_site.accounts.passwords`); the API reads Basic credentials on POST only,
  the method those rules cover (:class:`demo_site.authentication.BasicAuthenticationOnPost`);
* creating a link counts in the shortener form's budget, one per account or address
  whichever door is used (:data:`demo_site.shortener.views.CREATE_LIMIT`);
* an unknown key (404) counts in the ``shorturl-scan`` rule, with the pages that take a key.
"""

from __future__ import annotations

import logging
from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from rest_framework.exceptions import Throttled
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from demo_site.shortener.forms import LinkForm
from demo_site.shortener.keys import KeyspaceExhausted, create_link
from demo_site.shortener.models import Link
from demo_site.shortener.views import CREATE_LIMIT, bounds, link_status, short_url
from metrics_app import query
from metrics_app.admin import period_from, step_of
from metrics_app.buffer import flusher
from ratelimit_app import core, responses
from ratelimit_app.config import limits
from ratelimit_app.config.policy import policy
from ratelimit_app.core import limit_decision
from ratelimit_app.throttling import ThrottleUnavailable

logger = logging.getLogger(__name__)


class DemoAPIView(APIView):
    """JSON only (no browsable API: ``rest_framework`` need not be an installed app), and
    the authentication and throttles the settings name now."""

    renderer_classes = [JSONRenderer]

    def get_authenticators(self) -> list[Any]:
        # APIView keeps the classes it found when DRF was imported; read them now, so that
        # the settings (and a test's override_settings) decide.
        return [cls() for cls in api_settings.DEFAULT_AUTHENTICATION_CLASSES]

    def get_throttles(self) -> list[Any]:
        return [cls() for cls in api_settings.DEFAULT_THROTTLE_CLASSES]


def link_json(request: Request, link: Link) -> dict[str, Any]:
    """A link as the API shows it."""
    return {
        "key": link.key,
        "url": link.url,
        "short_url": short_url(request, link.key),
        "visits_url": request.build_absolute_uri(reverse("api-link-visits", args=[link.key])),
        "created": link.created.isoformat(),
    }


class LinkList(DemoAPIView):
    """``POST``: shorten ``{"url": ...}`` (validated as the form validates it)."""

    def post(self, request: Request) -> Response:
        self.count_creation(request)
        data = request.data
        url = data.get("url") if hasattr(data, "get") else None
        form = LinkForm({"url": url if isinstance(url, str) else ""})
        if not form.is_valid():
            return Response({"url": form.errors["url"]}, status=400)
        try:
            link = create_link(form.cleaned_data["url"], user=request.user)
        except KeyspaceExhausted as exc:
            logger.error("api: %s", exc)
            return Response({"detail": "No free short key was found. Try again."}, status=503)
        found = link_json(request, link)
        return Response(found, status=201, headers={"Location": found["short_url"]})

    def count_creation(self, request: Request) -> None:
        """Count the request in the budget the shortener's form counts in (every POST,
        valid or not, as there); over it, DRF's 429 (``Throttled``: a ``Ratelimited``
        raised here would be DRF's 403), with the ``RateLimit`` headers either way. When
        the counters are down and ``RATELIMIT_FAIL_OPEN`` is off, a 503, as the form's
        decorator answers: the client did nothing wrong."""
        decision = limit_decision(request._request, policy(limits.build(**CREATE_LIMIT)))
        if decision is None:
            return
        if decision.shown and core.show(request, [decision]) is not None:
            # No layer outside the view shows limits (no rule matched): the view writes its
            # own, after its throttles' (one list of policies).
            core.release(request)
            for name, value in responses.decision_headers([decision]).items():
                known = self.headers.get(name)
                self.headers[name] = f"{known}, {value}" if known else value
        if decision.result is None:  # the counters are down and the limit fails closed
            raise ThrottleUnavailable(CREATE_LIMIT["group"])
        usage = decision.usage()
        if usage is not None and usage["should_limit"]:
            raise Throttled(wait=usage["retry_after"])


class LinkVisits(DemoAPIView):
    """``GET``: a link's visits, counted by ``metrics_app`` as its redirects are served
    (they reach the database when the web process flushes, every 10 seconds)."""

    def get(self, request: Request, key: str) -> Response:
        link = get_object_or_404(Link, key=key)
        period = period_from(request)
        start, end = bounds(period)
        found: dict[str, Any] = {
            **link_json(request, link),
            "total": query.total(link.series_name),
            "period": period.key,
            "flush_interval": flusher.FLUSH_INTERVAL,
        }
        try:
            points = query.series(link.series_name, start, end)
        except ValueError as exc:  # a range the stored buckets cannot answer: no 500
            logger.warning("api: no visits for %s: %s", link.series_name, exc)
            return Response({**found, "detail": "This period cannot be read right now."})
        found.update(
            step=step_of(points, end),
            period_total=sum(count for _, count in points),
            visits=[{"start": at.isoformat(), "count": count} for at, count in points],
        )
        return Response(found)


urlpatterns = [
    path("links/", LinkList.as_view(), name="api-links"),
    path("links/<slug:key>/visits/", LinkVisits.as_view(), name="api-link-visits"),
    # An async Django view beside the DRF ones: its limit is checked on the event loop.
    path("links/<slug:key>/status/", link_status, name="api-link-status"),
]
