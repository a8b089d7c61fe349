"""Site-wide pages of the demo: the limits in force and how to try each one, the 404, and the
stylesheet every page links."""

from __future__ import annotations

import hashlib
from pathlib import Path

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import etag, require_safe

from demo_site.shortener.views import CREATE_QUOTA, CREATE_RATE
from ratelimit_app.conf import conf
from ratelimit_app.config import declared

#: How to reach each rule's 429 from a browser (docs/demo.rst says the same).
HOW_TO_TRY = {
    "login-pair": "Log in as demo with a wrong password six times within a minute: the "
    "sixth attempt is refused, even with the right password, from your address only. The "
    "log-in forms, the password changes and the API's HTTP Basic share this budget.",
    "login-account": "Fail 100 log-ins for one account within a day, 20 from each of five "
    "addresses: the 101st is refused from every address, even with the right password.",
    "login-ip": "Fail 21 log-ins within a minute, each with another username: the 21st is "
    "refused.",
    "password-reset": "Ask for a password reset for one address six times within an hour "
    "(the emails are printed in the terminal that runs make demo).",
    "password-reset-ip": "Ask for password resets for eleven different addresses within an "
    "hour: the eleventh is refused.",
    "signup": "Sign up 21 times in a day from one address (docs/demo.rst has a shell loop).",
    "signup-strict": "A dry run: sign up four times within an hour; nothing is refused, the "
    "terminal logs 'dry run: signup-strict would refuse', and the admin's rules page links "
    "its 'would refuse' chart.",
    "link-pages": "Each link page counts ten: open link pages 31 times within an hour and "
    "the 31st is refused. At most three are drawn at once for you: a fourth at the same "
    "moment is told to retry in a second.",
    "send-message": "Send two messages within a second: double-click Send.",
    "shorturl-scan": "Open 31 short links, link pages or API visits that do not exist "
    "within a minute (/s/nope1, /links/nope2/, /api/links/nope3/visits/, ...). Five more "
    "refusals within ten minutes ban your address from the whole site for 15 minutes (the "
    "admin's Bans page lists it; a reset lifts it).",
}
#: What the demo's own keys count, as the page says it.
KEY_TEXT = {
    "demo_site.accounts.passwords.account_and_address": "account and address",
    "demo_site.accounts.passwords.account": "account",
}


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """The demo's 404 page (``handler404``): the site's look, the path asked for, a way on.

    Django calls it only with ``DEBUG`` off; the shortener calls it for unknown keys with
    ``DEBUG`` on too (:func:`demo_site.shortener.views.not_found`).
    """
    return render(request, "404.html", status=404)


@require_safe
def limits(request: HttpRequest) -> HttpResponse:
    """``/limits/``: the rules of ``RATELIMIT_RULES`` and the decorator, with how to try them."""
    rules = []
    for rule in declared.rules():
        described = rule.describe()
        rules.append(
            {
                "name": rule.name,
                "paths": described.get("path", []),
                "url_names": described.get("url_name", []),
                "methods": described["methods"]
                if isinstance(described["methods"], str)
                else " ".join(described["methods"]),
                "key": KEY_TEXT.get(described["key"], described["key"]),
                "rate": described["rate"],
                "failures_only": rule.failures_only,
                "cost": described.get("cost", 1),
                "concurrent": described.get("concurrent"),
                "ban": rule.limit.ban,
                "shadow": rule.shadow,
                "how": HOW_TO_TRY.get(rule.name, ""),
            }
        )
    backend = settings.CACHES.get(conf.USE_CACHE, {}).get("BACKEND", "")
    context = {
        "rules": rules,
        "create_rate": CREATE_RATE,
        "create_quota": CREATE_QUOTA,
        "counters_shared": not backend.endswith("LocMemCache"),
    }
    return render(request, "limits.html", context)


#: The demo's stylesheet, read once. Linked rather than inlined: a page (a 429 during a flood
#: among them) then carries 1.5 KB instead of 7, and a browser fetches the CSS once.
STYLESHEET = (Path(__file__).resolve().parent / "static" / "demo_site" / "site.css").read_bytes()
STYLESHEET_ETAG = hashlib.sha256(STYLESHEET).hexdigest()[:16]


@require_safe
@etag(lambda request: STYLESHEET_ETAG)
def stylesheet(request: HttpRequest) -> HttpResponse:
    """``/site.css``, served by Django itself so the demo looks the same under ``runserver``
    and under gunicorn without static files set up (an hour's caching, then a 304)."""
    response = HttpResponse(STYLESHEET, content_type="text/css; charset=utf-8")
    response["Cache-Control"] = "public, max-age=3600"
    return response
