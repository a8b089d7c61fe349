"""What a limited (429), denied (403) or unprotected (503) request is answered with.

* ``Retry-After``: whole seconds until the window admits again, never below 1.
* The IETF draft headers (draft-ietf-httpapi-ratelimit-headers)::

      RateLimit-Policy: "login-ip:5/m";q=5;w=60
      RateLimit: "login-ip:5/m";r=0;t=17

  naming each policy ``<rule>:<rate>`` (a decorator's limits: the rate alone).
* The body follows content negotiation: clients that prefer JSON get an RFC 9457 problem
  (``application/problem+json``: ``type``, ``title``, ``status``, ``detail``, plus
  ``retry_after`` and ``rule``); others get the template ``ratelimit_app/429.html`` (override
  it in your templates), rendered from its context alone (no request, no context
  processors) and kept, so a flood of refusals renders each distinct page once.
  ``RATELIMIT_VIEW`` (a dotted path to ``view(request, exception)``), when set, answers
  limited requests instead, as in django-ratelimit: a page that needs the request.
* The page says whom the limit counted (``counted``, from the limit's key: the client's
  address, its account, an account or address the request named...), so a per-account
  limit does not tell a visitor that the requests "came from you".
* A refusal by a ban (:mod:`ratelimit_app.bans.applied`) says so, and until when (UTC):
  ``banned_until`` in the problem (ISO 8601) and the page, and the ``detail``. A usage dict
  of one without a decision says it with ``banned: True``.
* A limit that cannot be checked because the counter backend is down and the limit fails
  closed is not the client's doing: :func:`unavailable` answers 503 (service unavailable),
  for rules, ``@ratelimit`` and the DRF throttles alike.
* Every word a client reads (the page, the problem's ``title`` and ``detail``) is in the
  active language (``LANGUAGE_CODE``, or ``LocaleMiddleware``'s pick from
  ``Accept-Language``); French, German and Spanish ship in ``locale/``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import re
from collections.abc import Iterable
from http import HTTPStatus
from types import MappingProxyType
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template import loader
from django.utils.module_loading import import_string
from django.utils.translation import get_language, gettext, gettext_lazy, ngettext

from ratelimit_app import clock
from ratelimit_app.algorithms.windows import Usage
from ratelimit_app.backends import base
from ratelimit_app.conf import conf
from ratelimit_app.config.limits import Limit
from ratelimit_app.engine.enforce import Decision
from ratelimit_app.engine.result import binding
from ratelimit_app.runtime import COMPILED_MEMO, RUNTIME, kept

logger = logging.getLogger("ratelimit_app")

JSON_TYPES = ("application/json", "application/problem+json")
PROBLEM_TYPE = "about:blank"
_NOT_TOKEN = re.compile(r'[^\x20-\x7e]|["\\]')

#: The titles of the statuses this app answers, translated (RFC 9457 lets a problem's title
#: be localised); another status keeps its English phrase.
_TITLES = MappingProxyType(
    {
        403: gettext_lazy("Forbidden"),
        429: gettext_lazy("Too Many Requests"),
        503: gettext_lazy("Service Unavailable"),
    }
)

#: (policy label, usage dict) pairs: a rule's name, or None for a decorator's limit.
Policies = Iterable[tuple[str | None, dict[str, Any]]]


def _sf_string(text: str) -> str:
    """A structured-field string: printable ASCII, quotes and backslashes escaped."""
    return '"' + _NOT_TOKEN.sub(lambda m: "\\" + m[0] if m[0] in '"\\' else "?", text) + '"'


# The same rules come back on every request: their headers' parts are formatted once, and
# kept in the runtime (``RUNTIME.compiled``).


def _name(label: str | None, rate: str) -> str:
    return RUNTIME.compile(("header-name", label, rate), _named, label, rate)


def _named(label: str | None, rate: str) -> str:
    return _sf_string(f"{label}:{rate}" if label else rate)


def _policy(label: str | None, rates: tuple[tuple[str, int, int], ...]) -> str:
    return RUNTIME.compile(("header-policy", label, rates), _policies, label, rates)


def _policies(label: str | None, rates: tuple[tuple[str, int, int], ...]) -> str:
    return ", ".join(f"{_name(label, rate)};q={limit};w={window}" for rate, limit, window in rates)


def _policy1(label: str | None, rate: str, limit: int, window: int) -> tuple[str, str]:
    """A limit of one rate (the common case): its policy, and its name as the RateLimit
    header's entry starts."""
    return RUNTIME.compile(
        ("header-policy1", label, rate, limit, window), _policy_of_one, label, rate, limit, window
    )


def _policy_of_one(label: str | None, rate: str, limit: int, window: int) -> tuple[str, str]:
    name = _name(label, rate)
    return f"{name};q={limit};w={window}", name


def ratelimit_headers(policies: Policies) -> dict[str, str]:
    """``RateLimit-Policy`` (every rate of every limit) and ``RateLimit`` (the rate that
    decides each limit: the one that fired when a limit is exceeded)."""
    policy, state = [], []
    for label, usage in policies:
        each = usage.get("rates")
        rate = usage.get("rate")
        name = None  # the rate's name, once known
        if each and len(each) == 1:
            r = each[0]
            one, name = _policy1(label, r["rate"], r["limit"], r["window"])
            policy.append(one)
            if rate != r["rate"]:
                name = None
        elif each:
            key = tuple([(r["rate"], r["limit"], r["window"]) for r in each])
            policy.append(_policy(label, key))
        if rate:
            if usage["should_limit"]:
                remaining, wait = 0, usage["retry_after"]
            else:
                remaining, wait = usage["remaining"], usage["reset"]
            if name is None:
                name = _name(label, rate)
            state.append(f"{name};r={remaining};t={max(0, int(wait))}")
    headers = {}
    if policy:
        headers["RateLimit-Policy"] = ", ".join(policy)
    if state:
        headers["RateLimit"] = ", ".join(state)
    return headers


def limit_policy(
    label: str | None, scope: str, rates: tuple[Any, ...], capacity: int | None
) -> tuple[str, tuple[str, ...]]:
    """The ``RateLimit-Policy`` entry of a limit's rates (a leaky bucket's quota is its
    capacity) and each rate's name in the ``RateLimit`` header, formatted once per rule:
    kept by the label, the scope of the counters and the capacity (an entry holds its
    rates: other rates under the same scope are formatted again)."""
    memo = RUNTIME.compiled
    key = ("header-limit", label, scope, capacity)
    found = memo.get(key)
    if found is None or found[0] is not rates:
        found = (rates, *_limit_policy_of(label, rates, capacity))
        if len(memo) >= COMPILED_MEMO:
            memo.clear()
        memo[key] = found
    return found[1], found[2]


def _limit_policy_of(
    label: str | None, rates: tuple[Any, ...], capacity: int | None
) -> tuple[str, tuple[str, ...]]:
    names = tuple([_name(label, r.text) for r in rates])
    text = ", ".join(
        f"{name};q={r.count if capacity is None else capacity};w={r.seconds}"
        for name, r in zip(names, rates, strict=True)
    )
    return text, names


#: What the ``RateLimit`` headers show of a limit: its decision, or the entry of a count it
#: admitted (its :func:`limit_policy`, its place among the request's limits and its usages:
#: the compiled path's, :class:`~ratelimit_app.engine.compiled.Admitted`).
Shown = Decision | tuple[tuple[str, tuple[str, ...]], int, list[Usage]]


def decision_headers(decisions: Iterable[Shown]) -> dict[str, str]:
    """:func:`ratelimit_headers` of decided limits, read off their results (no usage
    dict): the same headers."""
    policy, state = [], []
    for d in decisions:
        if type(d) is tuple:  # an admitted count (no result made)
            (text, names), _, usages = d
            limited = False
        else:
            r = d.result  # type: ignore[union-attr]
            if r is None:
                continue
            meter = r.meter
            capacity = None if meter is None else meter.meter.capacity
            check, usages, limited = d.check, r.usages, r.limited  # type: ignore[union-attr]
            text, names = limit_policy(d.name, check.scope, check.rates, capacity)  # type: ignore[union-attr]
        policy.append(text)
        if len(usages) == 1:
            u, name = usages[0], names[0]
        else:  # each rate's usage is in the order of the rates
            u = binding(usages)
            name = names[[x is u for x in usages].index(True)]
        if limited:
            remaining, wait = 0, max(1, math.ceil(u.retry_after))
        else:  # (a usage's reset is never negative)
            remaining, wait = u.remaining, math.ceil(u.reset)
        state.append(f"{name};r={remaining};t={wait}")
    if not policy:
        return {}
    return {"RateLimit-Policy": ", ".join(policy), "RateLimit": ", ".join(state)}


def add_headers(response: HttpResponse, headers: dict[str, str]) -> HttpResponse:
    """Add the RateLimit ``headers`` to ``response`` unless it has its own."""
    return put_headers(response, headers, keep=True)


def put_headers(
    response: HttpResponse, headers: dict[str, str], keep: bool = False
) -> HttpResponse:
    """Set our ``headers`` (names of ASCII letters and dashes) on ``response``; ``keep``:
    not those it has already (a view's own).

    As Django's ``response[name] = value`` stores them, for less: Django checks both the
    name and the value in two calls each, on every admitted request that shows a limit and
    every 429. Ours are written straight into the headers' own dict (by lower-case name, as
    Django keeps them) when the value is ASCII without a line break, the values Django keeps
    as they are; any other value, or a response whose headers are kept otherwise, is set
    through Django (which encodes it, or refuses a line break)."""
    stored = getattr(response.headers, "_store", None)
    if type(stored) is not dict:
        for name, value in headers.items():
            if not keep or name not in response:
                response[name] = value
        return response
    for name, value in headers.items():
        lower = name.lower()
        if keep and lower in stored:
            continue
        if value.isascii() and "\n" not in value and "\r" not in value:
            stored[lower] = (name, value)
        else:
            response[name] = value
    return response


def wants_json(request: HttpRequest) -> bool:
    """True when the client prefers JSON to HTML (a missing Accept means HTML)."""
    # META, not request.headers: that would build a dict of every header, on every 429.
    accept = request.META.get("HTTP_ACCEPT", "")
    if "json" not in accept:
        return False
    return request.get_preferred_type(["text/html", *JSON_TYPES]) in JSON_TYPES


def problem(
    request: HttpRequest,
    status: int,
    detail: str,
    template: str = "ratelimit_app/problem.html",
    page: dict[str, Any] | None = None,
    language: str | None = None,
    **extra: Any,
) -> HttpResponse:
    """A negotiated error response: a JSON problem or the rendered ``template``.

    ``extra`` goes into both; ``page`` into the template's context only. ``language``: the
    active one, when the caller has read it already (reading it takes a context-local
    look up, which a flood's every refusal would pay twice)."""
    if language is None:
        language = get_language()
    title = _title(status, language)
    body = {"type": PROBLEM_TYPE, "title": title, "status": status, "detail": detail, **extra}
    if wants_json(request):
        return HttpResponse(
            json.dumps(body), status=status, content_type="application/problem+json"
        )
    context = {**body, **page} if page else body
    try:
        # From its context alone, and kept: during a flood every refusal renders the same
        # few pages, and rendering costs more than the check.
        page_bytes = _rendered(template, language, tuple(context.items()))
    except Exception:  # a broken override must not turn a 429 into a 500
        logger.exception("ratelimit: cannot render %s; answering in plain text", template)
        return HttpResponse(f"{title}: {detail}\n", status=status, content_type="text/plain")
    return HttpResponse(page_bytes, status=status)


#: The answers a process keeps made (each starts over when full): the translated titles,
#: the rendered pages and the 429s' details, by what makes them (the active language among
#: it). A flood's waits are many: they are kept apart from the compiled limits, whose plans
#: they would otherwise push out.
TITLES, PAGES, DETAILS = 64, 512, 1024


class _Answers:
    """The answers made lately (a part of the runtime)."""

    __slots__ = ("details", "pages", "titles")

    def __init__(self) -> None:
        self.titles: dict[tuple[Any, ...], str] = {}
        self.pages: dict[tuple[Any, ...], bytes] = {}
        self.details: dict[tuple[Any, ...], str] = {}


def _title(status: int, language: str | None) -> str:
    """The problem's title for ``status`` in ``language`` (the active one: part of the key).
    Translated once per language: a flood answers thousands of refusals a second."""
    return kept(RUNTIME.part(_Answers).titles, TITLES, (status, language), _title_of, status)


def _title_of(status: int) -> str:
    return str(_TITLES[status]) if status in _TITLES else HTTPStatus(status).phrase


def _rendered(template: str, language: str | None, context: tuple[tuple[str, Any], ...]) -> bytes:
    """The page, encoded as the response will be (``DEFAULT_CHARSET``): kept as bytes, so a
    refusal does not encode a page of a few kilobytes again (about 10k instructions)."""
    # ``language`` (the active one, which the page is rendered in) is part of the key.
    charset = settings.DEFAULT_CHARSET
    key = (template, language, charset, context)
    return kept(RUNTIME.part(_Answers).pages, PAGES, key, _render, template, context, charset)


def _render(template: str, context: tuple[tuple[str, Any], ...], charset: str) -> bytes:
    return loader.render_to_string(template, dict(context)).encode(charset)


def exception(decision: Decision) -> Exception:
    """``RATELIMIT_EXCEPTION_CLASS`` for a refusal, carrying the ``decision`` and, for
    projects' handlers, its ``usage`` dict and ``rule`` name."""
    exc = conf.EXCEPTION_CLASS()
    with contextlib.suppress(AttributeError):  # a custom class may use __slots__
        exc.decision = decision  # type: ignore[attr-defined]
        exc.limit = decision.limit  # type: ignore[attr-defined]
        exc.usage = decision.usage()  # type: ignore[attr-defined]
        exc.rule = decision.name  # type: ignore[attr-defined]
    return exc


def too_many_requests(
    request: HttpRequest,
    exception: Exception,
    usage: dict[str, Any] | None = None,
    rule: str | None = None,
    decision: Decision | None = None,
) -> HttpResponse:
    """The 429 for a limited request (``RATELIMIT_VIEW`` when it is set). The refusal is
    ``decision``, else the one ``exception`` carries (:func:`exception`); ``usage`` and
    ``rule`` describe one without a decision (a project's own ``Ratelimited``)."""
    if decision is None:
        decision = getattr(exception, "decision", None)
    if decision is not None:
        usage = usage or decision.usage()
        rule = rule or decision.name
    elif usage is None:
        usage = getattr(exception, "usage", None)
    retry_after = max(1, int((usage or {}).get("retry_after") or 1))
    headers = {"Retry-After": str(retry_after)}
    banned = (usage or {}).get("banned", False)
    if decision is not None and decision.result is not None:
        banned = banned or decision.result.banned
    if usage and usage.get("rate"):
        headers.update(ratelimit_headers([(rule, usage)]))
    if conf.VIEW:
        return _projects_view(request, exception, headers)
    limit = decision.limit if decision is not None else getattr(exception, "limit", None)
    response = _refusal_page(
        request,
        retry_after,
        (usage or {}).get("rate"),
        rule,
        limit if isinstance(limit, Limit) else None,
        banned_until(retry_after) if banned else None,
    )
    return put_headers(response, headers)


def banned_until(wait: int) -> str:
    """When a ban that ends in ``wait`` seconds (as ``Retry-After`` says it) ends, in UTC
    and ISO 8601, to the second (``2027-01-15T08:00:00Z``): the client may come back then."""
    until = dt.datetime.fromtimestamp(math.floor(clock.now()) + wait, dt.UTC)
    return until.strftime("%Y-%m-%dT%H:%M:%SZ")


def _projects_view(
    request: HttpRequest, exception: Exception, headers: dict[str, str]
) -> HttpResponse:
    """``RATELIMIT_VIEW``'s answer, with our headers where it answered 429 without them."""
    view: Any = conf.VIEW
    handler = import_string(view) if isinstance(view, str) else view
    response: HttpResponse = handler(request, exception)
    if getattr(response, "status_code", None) == 429:
        for name, value in headers.items():
            if name not in response:
                response[name] = value
    return response


def _refusal_page(
    request: HttpRequest,
    retry_after: int,
    rate: str | None,
    rule: str | None,
    limit: Limit | None,
    until: str | None = None,
) -> HttpResponse:
    """The 429 problem (JSON or the page) saying what was exceeded, by whom, and when to
    come back (``until``: the end of the ban that refused it, from :func:`banned_until`)."""
    counted = counted_by(request, limit)
    language = get_language()
    page: dict[str, Any] = {"counted": counted} if counted else {}
    extra: dict[str, Any] = {}
    if until is not None:
        page["until"] = _readable(until)
        extra["banned_until"] = until
    return problem(
        request,
        429,
        _refusal_detail(language, rate, rule, retry_after, until),
        language=language,
        template="ratelimit_app/429.html",
        page=page or None,
        retry_after=retry_after,
        rule=rule,
        rate=rate,
        **extra,
    )


def _refusal_detail(
    language: str | None, rate: str | None, rule: str | None, wait: int, until: str | None = None
) -> str:
    """The 429's ``detail`` in ``language`` (the active one: part of the key), made once per
    answer: a flood repeats a few of them thousands of times a second, and each translation
    looks the active language up again. ``until``: the end of the ban that refused it."""
    key = (language, rate, rule, wait, until)
    memo = RUNTIME.part(_Answers).details
    return kept(memo, DETAILS, key, _detail, rate, rule, wait, until)


def _detail(rate: str | None, rule: str | None, wait: int, until: str | None) -> str:
    if until is not None:
        return f"{_banned(rate, rule, until)} {try_again(wait)}"
    if rate and rule:
        exceeds = gettext("This request exceeds the limit %(rate)s of rule %(rule)s.")
    elif rate:
        exceeds = gettext("This request exceeds the limit %(rate)s.")
    elif rule:
        exceeds = gettext("This request exceeds a rate limit of rule %(rule)s.")
    else:
        exceeds = gettext("This request exceeds a rate limit.")
    exceeds %= {"rate": rate, "rule": repr(rule)}
    return f"{exceeds} {try_again(wait)}"


def _banned(rate: str | None, rule: str | None, until: str) -> str:
    """What a banned client is told: that it is banned, by what, and until when (UTC)."""
    if rate and rule:
        text = gettext(
            "This client is banned from rule %(rule)s until %(until)s: too many of its "
            "requests exceeded the limit %(rate)s."
        )
    elif rate:
        text = gettext(
            "This client is banned until %(until)s: too many of its requests exceeded the "
            "limit %(rate)s."
        )
    else:
        text = gettext(
            "This client is banned until %(until)s: too many of its requests exceeded a "
            "rate limit."
        )
    return text % {"rate": rate, "rule": repr(rule), "until": _readable(until)}


def _readable(until: str) -> str:
    """:func:`banned_until`'s time as people read it: ``2027-01-15 08:00:00 UTC``."""
    return until.replace("T", " ").replace("Z", " UTC")


#: What the 429 page says a limit counted, by the kind of its key (``counted`` in the
#: template's context; "" for keys it cannot name, such as a function's).
ADDRESS, ACCOUNT, NAMED, HEADER, DEVICE = "address", "account", "named", "header", "device"
_NAMED_KINDS = ("email:", "post:", "get:")


def counted_by(request: HttpRequest, limit: Limit | None) -> str:
    """Whom ``limit`` counted for ``request``: :data:`ADDRESS` (the client's IP address),
    :data:`ACCOUNT` (the signed-in user), :data:`NAMED` (an account or address the request
    names: an email, a form or query field), :data:`HEADER`, :data:`DEVICE`, or ""."""
    kind = limit.kind if limit is not None else ""
    if kind in ("user", "user_or_ip"):
        # An anonymous request is counted by its address (see identity.keys); the user
        # was loaded to count it, so asking costs nothing more.
        user = getattr(request, "user", None)
        return ACCOUNT if user is not None and user.is_authenticated else ADDRESS
    if kind == "ip":
        return ADDRESS
    if kind == "email" or kind.startswith(_NAMED_KINDS):
        return NAMED
    if kind.startswith("header:"):
        return HEADER
    return DEVICE if kind == "device" else ""


def try_again(seconds: int) -> str:
    """The "Try again in N seconds." that ends each refusal, in the active language."""
    return ngettext(
        "Try again in %(seconds)d second.", "Try again in %(seconds)d seconds.", seconds
    ) % {"seconds": seconds}


def denied(request: HttpRequest) -> HttpResponse:
    """The 403 for a client on the deny list."""
    return problem(request, 403, gettext("Requests from this client are not accepted."))


#: The status of a fail-closed limit's answer while the counter backend is down: the failure
#: is the server's (a 429 would blame the client).
FAIL_CLOSED_STATUS = 503


def unavailable(request: HttpRequest, decision: Decision | None = None) -> HttpResponse:
    """The answer of a fail-closed limit (a rule, or ``@ratelimit`` with
    ``RATELIMIT_FAIL_OPEN = False``) while the counter backend is down: the service is
    unavailable (:data:`FAIL_CLOSED_STATUS`), which is not the client's doing."""
    status = FAIL_CLOSED_STATUS
    rule = decision.name if decision is not None else None
    retry_after = max(1, int(base.DEAD_RETRY))
    if rule:
        which = gettext("The rate limit of rule %(rule)s cannot be checked right now.")
    else:
        which = gettext("The rate limit of this page cannot be checked right now.")
    response = problem(
        request,
        status,
        f"{which % {'rule': repr(rule)}} {try_again(retry_after)}",
        retry_after=retry_after,
        rule=rule,
    )
    response["Retry-After"] = str(retry_after)
    return response
