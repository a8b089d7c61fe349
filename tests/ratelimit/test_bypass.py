"""Attacks on how the limiter reads a request, end to end through ``RatelimitMiddleware``
with the demo's kinds of rules, on local memory, real memcached and real Redis.

Each test is an attack that once got through: a padded account name (Django's forms strip
the padding and act on the account, the limiter fell back to the client IP), a JSON body
pushed over a size the limiter gave up at, a lone surrogate (a 500), an IPv4 proxy seen
through a dual-stack socket, a deny entry or an address in another form. The threat table
in ``docs/security.rst`` names them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_login_failed
from django.core import mail
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path

from tests.ratelimit import urls as site_urls
from tests.ratelimit.conftest import MIDDLEWARE

_ids = itertools.count()
#: Over the 1,280 characters after which a value used to be dropped before stripping.
PAD = " " * 2000
ALICE = "alice@example.com"


def json_reset(request: HttpRequest) -> HttpResponse:
    """A JSON API's password reset, as such views are written: the body parsed whatever
    its ``Content-Type``, the address stripped and compared without case."""
    data = json.loads(request.body)
    return JsonResponse({"sent_to": str(data.get("email", "")).strip().lower()})


urlpatterns = [path("api/reset/", json_reset), *site_urls.urlpatterns]


@contextlib.contextmanager
def site(*rules: dict[str, Any], **settings: Any) -> Iterator[list[str]]:
    """The rules (fresh names, so no counter is shared with another test) behind the
    middleware; yields the names."""
    named = [{**rule, "name": f"{rule['name']}-{next(_ids)}"} for rule in rules]
    with override_settings(
        ROOT_URLCONF=__name__, MIDDLEWARE=MIDDLEWARE, RATELIMIT_RULES=named, **settings
    ):
        yield [rule["name"] for rule in named]


#: The demo's log-in rule: wrong passwords per account, only failures count.
LOGIN_ACCOUNT = {
    "name": "login-account",
    "path": "/accounts/login/",
    "methods": ["POST"],
    "key": "email:username",
    "rate": "5/m",
    "count": "failures",
}
#: The demo's password-reset rule: every request counts, per address.
PASSWORD_RESET = {
    "name": "password-reset",
    "path": ["/accounts/password_reset/", "/api/reset/"],
    "methods": ["POST"],
    "key": "email",
    "rate": "5/h",
}


@pytest.fixture
def password_checks() -> Iterator[list[str]]:
    """The user names whose password Django checked and found wrong."""
    checked: list[str] = []

    def receiver(credentials: dict[str, Any], **kwargs: Any) -> None:
        checked.append(credentials.get("username", ""))

    user_login_failed.connect(receiver, dispatch_uid="test_bypass")
    yield checked
    user_login_failed.disconnect(dispatch_uid="test_bypass")


def test_a_padded_account_name_is_limited_with_the_account(
    backend_kind: str, db: Any, password_checks: list[str]
) -> None:
    """Once locked, an account stays locked for the padded name from fresh addresses: no
    wrong password reaches Django's check, the right one does not log in."""
    User.objects.create_user(ALICE, password="right-password")
    client = Client()
    with site(LOGIN_ACCOUNT):
        wrong = {"username": ALICE, "password": "wrong"}
        codes = [client.post("/accounts/login/", wrong).status_code for _ in range(6)]
        assert codes == [200] * 5 + [429]  # LoginView re-renders a failed log-in: 200
        assert len(password_checks) == 5
        for n in range(20):
            padded = {"username": PAD + ALICE + PAD, "password": "wrong"}
            response = client.post("/accounts/login/", padded, REMOTE_ADDR=f"192.0.2.{n}")
            assert response.status_code == 429
        assert len(password_checks) == 5
        right = {"username": ALICE + PAD, "password": "right-password"}
        assert client.post("/accounts/login/", right, REMOTE_ADDR="192.0.2.99").status_code == 429
        assert "_auth_user_id" not in client.session


def test_a_padded_address_sends_no_more_reset_mails(backend_kind: str, db: Any) -> None:
    User.objects.create_user("alice", email=ALICE, password="pw")
    with site(PASSWORD_RESET):
        client = Client()
        sent = [
            client.post("/accounts/password_reset/", {"email": ALICE}).status_code
            for _ in range(5)
        ]
        assert sent == [302] * 5 and len(mail.outbox) == 5
        for n in range(10):
            padded = {"email": "\t" * 1500 + ALICE.upper() + PAD}
            response = client.post(
                "/accounts/password_reset/", padded, REMOTE_ADDR=f"198.51.100.{n}"
            )
            assert response.status_code == 429
        assert len(mail.outbox) == 5


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"],
)
def test_a_json_body_pushed_over_64_kib_is_still_read(
    backend_kind: str, content_type: str
) -> None:
    """One extra field made the body too big for the limiter (64 KiB), not for the view;
    and a body sent as plain text or as a form is JSON to a view that parses it."""
    with site(PASSWORD_RESET):
        client = Client()
        for n in range(6):
            body = {"email": ALICE, "filler": "f" * 70_000 * (n % 2)}
            response = client.post(
                "/api/reset/",
                json.dumps(body),
                content_type=content_type,
                REMOTE_ADDR=f"203.0.113.{n}",
            )
            assert response.status_code == (200 if n < 5 else 429), n


@pytest.mark.parametrize(
    "email",
    [
        PAD + ALICE,
        ALICE.upper() + "\u200b" + PAD,
        "\u3000" * 1500 + "ａｌｉｃｅ@example.com",
    ],
    ids=["spaces", "case-zero-width", "ideographic-fullwidth"],
)
def test_a_padded_denied_email_is_refused(backend_kind: str, email: str) -> None:
    with site(PASSWORD_RESET, RATELIMIT_DENY=[ALICE]):
        client = Client()
        assert client.post("/accounts/password_reset/", {"email": email}).status_code == 403
        body = json.dumps({"email": email, "filler": "f" * 70_000})
        refused = client.post("/api/reset/", body, content_type="application/json")
        assert refused.status_code == 403


@pytest.mark.parametrize(
    "entry", ["email:" + PAD + ALICE, "email:" + "\u3000" * 1500 + ALICE.upper() + "\u200b"]
)
def test_a_padded_deny_entry_denies_the_address(backend_kind: str, entry: str) -> None:
    """Padded inside its ``email:`` prefix, an entry was too long before stripping: the
    list was refused (the check, or a log line and no list)."""
    with site(PASSWORD_RESET, RATELIMIT_DENY=[entry]):
        response = Client().post("/accounts/password_reset/", {"email": ALICE})
        assert response.status_code == 403


def test_a_lone_surrogate_is_a_subject_of_its_own_not_a_500(backend_kind: str) -> None:
    with site(PASSWORD_RESET):
        client = Client()

        def send(email: str, remote: str) -> int:
            body = json.dumps({"email": email})  # "\ud800" escaped: valid JSON
            response = client.post(
                "/api/reset/", body, content_type="application/json", REMOTE_ADDR=remote
            )
            return response.status_code

        codes = [send("\ud800", f"203.0.113.{n}") for n in range(6)]
        assert codes == [200] * 5 + [429]  # from six addresses: one subject, not the IP
        assert send("\udfff", "203.0.113.1") == 200  # another value, another subject


def test_a_trusted_proxy_on_a_dual_stack_socket_keeps_clients_apart(backend_kind: str) -> None:
    """gunicorn ``-b [::]:8000`` behind nginx on 127.0.0.1: the peer is
    ``::ffff:127.0.0.1``. Untrusted, every client was the proxy: one counter for all."""
    per_ip = {"name": "per-ip", "path": "/accounts/password_reset/", "key": "ip", "rate": "2/m"}
    with site(per_ip, RATELIMIT_TRUSTED_PROXIES=["127.0.0.1", "10.0.0.0/8"]):
        client = Client()

        def send(forwarded: str) -> int:
            return client.get(
                "/accounts/password_reset/",
                REMOTE_ADDR="::ffff:127.0.0.1",
                HTTP_X_FORWARDED_FOR=forwarded,
            ).status_code

        assert [send("198.51.100.1") for _ in range(3)] == [200, 200, 429]
        assert send("198.51.100.2") == 200
        # A mapped hop of a trusted network is skipped too.
        assert send("198.51.100.3, ::ffff:10.0.0.5") == 200
        assert send("198.51.100.3, 10.0.0.6") == 200
        assert send("198.51.100.3") == 429


@pytest.mark.parametrize(
    ("entry", "remote"),
    [
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("::ffff:203.0.113.0/120", "203.0.113.7"),
        ("::ffff:203.0.113.0/120", "::ffff:203.0.113.7"),
    ],
)
def test_deny_entries_in_mapped_form_deny_the_ipv4_client(
    backend_kind: str, entry: str, remote: str
) -> None:
    with site(PASSWORD_RESET, RATELIMIT_DENY=[entry]):
        response = Client().get("/accounts/password_reset/", REMOTE_ADDR=remote)
        assert response.status_code == 403


@override_settings(RATELIMIT_IP_META_KEY="HTTP_X_REAL_IP")
def test_a_padded_address_is_still_denied(backend_kind: str) -> None:
    """The limiter counted ``" 203.0.113.7"`` as 203.0.113.7, the deny list did not see it."""
    with site(PASSWORD_RESET, RATELIMIT_DENY=["203.0.113.7"]):
        response = Client().get("/accounts/password_reset/", HTTP_X_REAL_IP=" 203.0.113.7 ")
        assert response.status_code == 403
