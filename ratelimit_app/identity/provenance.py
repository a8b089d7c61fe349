"""Whether a request is the client's own act, or something a page made its browser send.

A page of another site (a forum post, an HTML e-mail) can make every reader's browser send
requests to this site, from the reader's address and with the reader's cookies: an ``<img>``
per URL, a form that submits itself. Such requests are still counted and refused by a limit,
but they must not get the reader banned (:func:`page_sent`), and a form that fails the CSRF
check tried no password: it is no failure of a failure-only rule (:func:`csrf_refused`).

Asked only on the rare path (a refusal of a limit that bans; a failure-only rule's failed
request), never of an admitted request.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.module_loading import import_string

from ratelimit_app.runtime import RUNTIME

__all__ = ["csrf_refused", "page_sent"]

#: ``Sec-Fetch-Site`` of a request the user asked for: typed, bookmarked.
_USERS_OWN = "none"
_SAME_ORIGIN = "same-origin"
#: The methods Django's CSRF check lets through unchecked (RFC 9110's safe methods).
_SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS", "TRACE"))


def page_sent(request: Any, strict: bool) -> bool:
    """True when a page made the browser send ``request``, rather than its user or a
    program of the client's own.

    Read from Fetch Metadata (``Sec-Fetch-Site``, sent by every browser since 2023 to an
    HTTPS or localhost origin): ``none`` (typed, a bookmark) is the user's own; ``cross-site``,
    ``same-site`` and any unknown value are a page's; ``same-origin`` is the client's own,
    except with ``strict`` (a site-wide ban), where only a top-level navigation is: a page of
    the site itself may carry content anyone planted (an ``<img>`` in a forum post). Without
    Fetch Metadata (a program, an older browser, plain HTTP): an ``Origin`` or ``Referer`` of
    another host, or ``Origin: null``, is a page's. ``request``: Django's, DRF's, or None
    (False). A client can claim to be a page (these are its own headers): what that earns it
    is no ban, never a request more past the limit.
    """
    request = getattr(request, "_request", request)  # a DRF Request wraps Django's
    meta = getattr(request, "META", None)
    if meta is None:
        return False
    site = meta.get("HTTP_SEC_FETCH_SITE")
    if site is not None:
        site = site.strip().lower()
        if site == _USERS_OWN:
            return False
        if site != _SAME_ORIGIN:
            return True
        if not strict:
            return False
        mode = meta.get("HTTP_SEC_FETCH_MODE", "").strip().lower()
        dest = meta.get("HTTP_SEC_FETCH_DEST", "").strip().lower()
        return not (mode == "navigate" and dest == "document")
    origin = meta.get("HTTP_ORIGIN")
    if origin is not None and (origin.strip() == "null" or _elsewhere(request, origin)):
        return True
    referer = meta.get("HTTP_REFERER")
    return referer is not None and _elsewhere(request, referer)


def _elsewhere(request: Any, url: str) -> bool:
    """True when ``url`` names a host other than the one ``request`` was sent to (a URL with
    no host, or one that cannot be read, names none)."""
    theirs = _hostname(url.strip())
    if not theirs:
        return False
    try:
        ours = request.get_host()
    except Exception:  # DisallowedHost: the Host header as sent
        ours = request.META.get("HTTP_HOST", "")
    return theirs != _hostname("//" + ours)


def _hostname(url: str) -> str:
    """The host ``url`` names, as compared (lower case, no port, brackets or final dot)."""
    try:
        return (urlsplit(url).hostname or "").rstrip(".")
    except ValueError:
        return ""


def csrf_refused(request: Any, response: Any) -> bool:
    """True when ``response`` is the 403 of Django's CSRF check refusing ``request``.

    ``CsrfViewMiddleware.process_view`` marks a request it accepts
    (``csrf_processing_done``) and not one it refuses; it does not look at a safe method's,
    a ``csrf_exempt`` view's (whose own 403 is the view's answer) or a test client's that
    turned the check off. So: an unsafe method, the middleware installed, the view resolved
    and not exempt, the check on, the request unmarked, and a 403.
    """
    if response.status_code != 403:
        return False
    request = getattr(request, "_request", request)  # a DRF Request wraps Django's
    if request is None or getattr(request, "method", None) in _SAFE_METHODS:
        return False
    if getattr(request, "csrf_processing_done", False):
        return False
    if getattr(request, "_dont_enforce_csrf_checks", False):
        return False
    match = getattr(request, "resolver_match", None)
    if match is None or getattr(match.func, "csrf_exempt", False):
        return False
    return RUNTIME.part(_csrf_checked)


def _csrf_checked() -> bool:
    """True when ``MIDDLEWARE`` holds Django's CSRF middleware or a subclass of it (a part
    of the runtime: found once per setting of ``MIDDLEWARE``)."""
    for path in getattr(settings, "MIDDLEWARE", None) or ():
        try:
            found = import_string(path)
        except ImportError:  # Django fails at start-up on it; nothing to say here
            continue
        if isinstance(found, type) and issubclass(found, CsrfViewMiddleware):
            return True
    return False
