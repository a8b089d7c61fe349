"""Which account a request tries a password for: the keys of the demo's log-in rules.

A password is checked at five doors, and a guesser picks whichever is cheapest, so the rules
``login-pair``, ``login-account`` and ``login-ip`` (``RATELIMIT_RULES`` in the settings)
cover them all, with one budget per account whichever door is used:

* the log-in forms, ``/accounts/login/`` and ``/admin/login/``: the ``username`` field;
* the password changes, ``/accounts/password_change/`` and ``/admin/password_change/``,
  which check the old password of the signed-in user (a stolen session is enough to guess
  it): that user;
* the JSON API (Django REST framework), whose HTTP Basic authentication checks the password
  before any throttle runs: the user name of the ``Authorization`` header. The API reads it
  on POST only (:class:`demo_site.authentication.BasicAuthenticationOnPost`), the method the rules
  cover.

Each door is told by the URL name its path resolves to, and reads the account only where
that door reads it: a ``username`` field added to a password change, or a Basic header sent
to the log-in form, names nobody, so a guesser cannot charge the guesses to another account.

Account names are compared as emails are (stripped, NFKC, case-folded): ``" Alice"`` and
``"alice"`` share one budget. A request that names no account (no field, no credentials)
gives None, and the rule counts the client's address instead; such a request fails only
when it is malformed (a 401 for a broken Basic header) or goes to a page that does not
exist (404), so the API's ordinary anonymous use never counts.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from django.http import HttpRequest
from django.urls import Resolver404, resolve
from rest_framework.authentication import get_authorization_header
from rest_framework.views import APIView

from ratelimit_app.keys import client_ip, form_value, normalize_email

#: URL names of the log-in forms: the account is their ``username`` field.
FORM_DOORS = frozenset(["login", "admin:login"])
#: URL names of the password changes: the account is the signed-in user.
SIGNED_IN_DOORS = frozenset(["password_change", "admin-password-change"])

#: Where the account a request names is kept once found (the rules ask for it twice).
_FOUND = "_demo_named_account"


def basic_username(request: HttpRequest) -> str | None:
    """The user name of an ``Authorization: Basic`` header, read as Django REST framework's
    ``BasicAuthentication`` reads it (None when it would refuse the header unread)."""
    try:
        auth = get_authorization_header(request).split()
    except UnicodeError:
        return None
    if len(auth) != 2 or auth[0].lower() != b"basic":
        return None
    try:
        raw = base64.b64decode(auth[1])
    except (binascii.Error, ValueError):
        return None
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        decoded = raw.decode("latin-1")
    userid, colon, _ = decoded.partition(":")
    return userid if colon else None


def _door(request: HttpRequest) -> Any:
    """What the door the request goes to reads as the account, unnormalised."""
    try:
        match = resolve(request.path_info, getattr(request, "urlconf", None))
    except Resolver404:
        return None
    if match.view_name in FORM_DOORS:
        return form_value(request, "username")
    if match.view_name in SIGNED_IN_DOORS:
        user = getattr(request, "user", None)
        return user.get_username() if user is not None and user.is_authenticated else None
    view_class = getattr(match.func, "cls", None)
    if isinstance(view_class, type) and issubclass(view_class, APIView):
        return basic_username(request)
    return None


def named_account(request: HttpRequest) -> str | None:
    """The account whose password the request tries, normalised; None when it names none."""
    found: str | None
    try:
        found = request.__dict__[_FOUND]
    except KeyError:
        found = normalize_email(_door(request))
        request.__dict__[_FOUND] = found
    return found


def account(group: str, request: HttpRequest) -> str | None:
    """Key of ``login-account``: the account, whatever the address."""
    return named_account(request)


def account_and_address(group: str, request: HttpRequest) -> str | None:
    """Key of ``login-pair``: the account and the client's address, together.

    The address is the ``ip`` key's (masked, proxies honoured), after a space: no address
    holds one, so two pairs never read alike.
    """
    name = named_account(request)
    if name is None:
        return None
    return f"{name} {client_ip(request)}"
