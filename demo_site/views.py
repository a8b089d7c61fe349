"""Views of the demo site."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from metrics_app import query
from metrics_app.decorators import count_visits
from ratelimit_app.core import get_usage
from ratelimit_app.decorators import ratelimit

HOME_RATE = "5/m;20/h"


@ratelimit(group="demo:home", key="ip", rate=HOME_RATE)
@count_visits(series="demo:home")
def hello(request: HttpRequest) -> HttpResponse:
    """The home page, limited per IP to 5 a minute and 20 an hour (429 beyond), its visits
    counted in memory and flushed to the database every METRICS_FLUSH_INTERVAL seconds."""
    usage = get_usage(request, group="demo:home", key="ip", rate=HOME_RATE) or {}
    lines = [
        "Hello from the django-bucketry demo.",
        "",
        f"This page admits {HOME_RATE} per IP (sliding windows). Reload it a few times.",
    ]
    lines += [
        f"  {r['rate']:>6}: {r['count']} used, {r['remaining']} left, "
        f"empty again in {r['reset']} s"
        for r in usage.get("rates", [])
    ]
    lines += [
        "",
        f"Visits counted so far: {query.total('demo:home')} "
        "(flushed from memory every few seconds; reload to see it grow).",
    ]
    return HttpResponse("\n".join(lines) + "\n", content_type="text/plain")
