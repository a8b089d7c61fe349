"""What a limited (429), denied (403) or unprotected (503) request is answered with.

* ``Retry-After``: whole seconds until the window admits again, never below 1.
* The IETF draft headers (draft-ietf-httpapi-ratelimit-headers)::

      RateLimit-Policy: "login-ip:5/m";q=5;w=60
      RateLimit: "login-ip:5/m";r=0;t=17

  naming each policy ``<rule>:<rate>`` (a decorator's limits: the rate alone).
* The body follows content negotiation: clients that prefer JSON get an RFC 9457 problem
  (``application/problem+json``: ``type``, ``title``, ``status``, ``detail``, plus
  ``retry_after`` and ``rule``); others get the template ``ratelimit_app/429.html`` (override
  it in your templates). ``RATELIMIT_VIEW`` (a dotted path to ``view(request, exception)``),
  when set, answers limited requests instead, as in django-ratelimit.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Iterable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.template import loader
from django.utils.module_loading import import_string

from ratelimit_app.conf import conf

logger = logging.getLogger("ratelimit_app")

JSON_TYPES = ("application/json", "application/problem+json")
PROBLEM_TYPE = "about:blank"
_NOT_TOKEN = re.compile(r'[^\x20-\x7e]|["\\]')

#: (policy label, usage dict) pairs: a rule's name, or None for a decorator's limit.
Policies = Iterable[tuple[str | None, dict[str, Any]]]


def _sf_string(text: str) -> str:
    """A structured-field string: printable ASCII, quotes and backslashes escaped."""
    return '"' + _NOT_TOKEN.sub(lambda m: "\\" + m[0] if m[0] in '"\\' else "?", text) + '"'


@functools.lru_cache(maxsize=1024)
def _name(label: str | None, rate: str) -> str:
    return _sf_string(f"{label}:{rate}" if label else rate)


@functools.lru_cache(maxsize=1024)
def _policy(label: str | None, rates: tuple[tuple[str, int, int], ...]) -> str:
    # The same rules come back on every request: their policies are formatted once.
    return ", ".join(f"{_name(label, rate)};q={limit};w={window}" for rate, limit, window in rates)


def ratelimit_headers(policies: Policies) -> dict[str, str]:
    """``RateLimit-Policy`` (every rate of every limit) and ``RateLimit`` (the rate that
    decides each limit: the one that fired when a limit is exceeded)."""
    policy, state = [], []
    for label, usage in policies:
        each = usage.get("rates")
        if each:
            key: tuple[tuple[str, int, int], ...] = ()
            for r in each:
                key += ((r["rate"], r["limit"], r["window"]),)
            policy.append(_policy(label, key))
        if usage.get("rate"):
            wait = usage["retry_after"] if usage["should_limit"] else usage["reset"]
            remaining = 0 if usage["should_limit"] else usage["remaining"]
            state.append(f"{_name(label, usage['rate'])};r={remaining};t={max(0, int(wait))}")
    headers = {}
    if policy:
        headers["RateLimit-Policy"] = ", ".join(policy)
    if state:
        headers["RateLimit"] = ", ".join(state)
    return headers


def add_headers(response: HttpResponse, policies: Policies) -> HttpResponse:
    """Add the RateLimit headers to ``response`` unless it has its own."""
    for name, value in ratelimit_headers(policies).items():
        if name not in response:
            response[name] = value
    return response


def wants_json(request: HttpRequest) -> bool:
    """True when the client prefers JSON to HTML (a missing Accept means HTML)."""
    accept = request.headers.get("Accept", "")
    if "json" not in accept:
        return False
    return request.get_preferred_type(["text/html", *JSON_TYPES]) in JSON_TYPES


def problem(
    request: HttpRequest,
    status: int,
    detail: str,
    template: str = "ratelimit_app/problem.html",
    **extra: Any,
) -> HttpResponse:
    """A negotiated error response: a JSON problem or the rendered ``template``."""
    title = HTTPStatus(status).phrase
    body = {"type": PROBLEM_TYPE, "title": title, "status": status, "detail": detail, **extra}
    if wants_json(request):
        return HttpResponse(
            json.dumps(body), status=status, content_type="application/problem+json"
        )
    try:
        if conf.CACHE_PAGES or _own(template):
            # During a flood every refusal renders the same few pages: rendering costs more
            # than the check, so the page of each distinct answer is kept.
            html = _rendered(template, tuple(body.items()))
        else:  # a project's own template may use the request and its context processors
            html = loader.render_to_string(template, body, request)
    except Exception:  # a broken override must not turn a 429 into a 500
        logger.exception("ratelimit: cannot render %s; answering in plain text", template)
        return HttpResponse(f"{title}: {detail}\n", status=status, content_type="text/plain")
    return HttpResponse(html, status=status)


#: This app's templates: a page rendered from them depends on its context alone.
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"


@functools.lru_cache(maxsize=32)
def _own(template: str) -> bool:
    """True when ``template`` and the page it extends are this app's own (not overridden)."""
    names = {template, "ratelimit_app/problem.html"}
    try:
        origins = [getattr(loader.get_template(name), "origin", None) for name in names]
    except Exception:  # not found or broken: rendered the ordinary way, which reports it
        return False
    return all(
        o is not None and Path(str(o.name)).resolve().is_relative_to(TEMPLATES_DIR)
        for o in origins
    )


@functools.lru_cache(maxsize=512)
def _rendered(template: str, context: tuple[tuple[str, Any], ...]) -> str:
    return loader.render_to_string(template, dict(context))


@receiver(setting_changed)
def _templates_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("TEMPLATES", "INSTALLED_APPS"):
        _own.cache_clear()
        _rendered.cache_clear()


def too_many_requests(
    request: HttpRequest,
    exception: Exception,
    usage: dict[str, Any] | None,
    rule: str | None = None,
) -> HttpResponse:
    """The 429 for a limited request (``RATELIMIT_VIEW`` when it is set)."""
    retry_after = max(1, int((usage or {}).get("retry_after") or 1))
    headers = {"Retry-After": str(retry_after)}
    if usage and usage.get("rate"):
        headers.update(ratelimit_headers([(rule, usage)]))
    view = conf.VIEW
    if view:
        handler = import_string(view) if isinstance(view, str) else view
        response = handler(request, exception)
        if getattr(response, "status_code", None) == 429:
            for name, value in headers.items():
                if name not in response:
                    response[name] = value
        return response
    rate = (usage or {}).get("rate")
    what = f"the limit {rate}" if rate else "a rate limit"
    if rule:
        what += f" of rule {rule!r}"
    unit = "second" if retry_after == 1 else "seconds"
    response = problem(
        request,
        429,
        f"This request exceeds {what}. Try again in {retry_after} {unit}.",
        template="ratelimit_app/429.html",
        retry_after=retry_after,
        rule=rule,
        rate=rate,
    )
    for name, value in headers.items():
        response[name] = value
    return response


def denied(request: HttpRequest) -> HttpResponse:
    """The 403 for a client on the deny list."""
    return problem(request, 403, "Requests from this client are not accepted.")


def unavailable(request: HttpRequest, rule: str) -> HttpResponse:
    """The answer of a fail-closed rule while the counter backend is down."""
    status = conf.FAIL_CLOSED_STATUS
    retry_after = max(1, int(conf.DEAD_RETRY))
    response = problem(
        request,
        status,
        f"The rate limit of rule {rule!r} cannot be checked right now. "
        f"Try again in {retry_after} seconds.",
        retry_after=retry_after,
        rule=rule,
    )
    response["Retry-After"] = str(retry_after)
    return response
