"""The abuse scenarios docs/rules.rst documents, each with its rules, on every backend.

* at most 5 wrong passwords per email per minute and 10 per day;
* at most 5 password resets per email per hour;
* at most 20 sign-ups per IP per day;
* one message per second per user;
* per-IP and per-account limits together on a login (each alone is weak).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client, override_settings

from ratelimit_app.testing import frozen_clock

T0 = 1_800_000_000.0
LOGIN = "/accounts/login/"

RATELIMIT_RULES = [
    {
        "name": "login-email",
        "path": "/accounts/login/",
        "methods": ["POST"],
        "key": "email:username",  # the login form's field, normalised as an email
        "rate": "5/m;10/d",
        "count": "failures",
    },
    {
        "name": "login-ip",
        "path": "/accounts/login/",
        "methods": ["POST"],
        "key": "ip",
        "rate": "30/h",
        "count": "failures",
    },
    {
        "name": "password-reset",
        "path": "/accounts/password_reset/",
        "methods": ["POST"],
        "key": "email",
        "rate": "5/h",
    },
    {
        "name": "signup",
        "path": "/accounts/signup/",
        "methods": ["POST"],
        "key": "ip",
        "rate": "20/d",
    },
    {
        "name": "messages",
        "url_name": "send_message",
        "methods": ["POST"],
        "key": "user",
        "rate": "1/s",
    },
]


@pytest.fixture(autouse=True)
def site(backend_kind: str, db: Any) -> Iterator[None]:
    middleware = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "ratelimit_app.middleware.RatelimitMiddleware",
    ]
    with override_settings(
        ROOT_URLCONF="tests.ratelimit.urls",
        MIDDLEWARE=middleware,
        RATELIMIT_RULES=RATELIMIT_RULES,
    ):
        yield


def login(client: Client, username: str, password: str, ip: str = "192.0.2.1") -> int:
    data = {"username": username, "password": password}
    return client.post(LOGIN, data, REMOTE_ADDR=ip).status_code


class TestWrongPasswords:
    """At most 5 wrong passwords per email per minute and 10 per day."""

    def test_five_per_minute_then_ten_per_day(self, client: Client) -> None:
        User.objects.create_user("alice@example.com", password="right")
        with frozen_clock(T0) as clock:
            assert [login(client, "alice@example.com", "wrong") for _ in range(5)] == [200] * 5
            # The limit blocks before the view: the right password does not get through.
            assert login(client, "alice@example.com", "right") == 429
            assert login(client, "ALICE@example.com ", "wrong") == 429  # same email
            clock.advance(61)
            assert [login(client, "alice@example.com", "wrong") for _ in range(5)] == [200] * 5
            clock.advance(61)
            # Ten failures today: the daily rate holds although the minute has room.
            assert login(client, "alice@example.com", "right") == 429
            # The day's failures leave the window a day later (plus up to one bucket, 1/60 of
            # the window: the limiter blocks early by at most that, never lets more through).
            clock.advance(86400 - 122 + 1440)
            assert login(client, "alice@example.com", "right") == 302

    def test_other_accounts_are_not_affected(self, client: Client) -> None:
        User.objects.create_user("bob@example.com", password="right")
        with frozen_clock(T0):
            for _ in range(6):
                login(client, "alice@example.com", "wrong")
            assert login(client, "bob@example.com", "right") == 302

    def test_successful_logins_do_not_count(self, client: Client) -> None:
        User.objects.create_user("carol@example.com", password="right")
        with frozen_clock(T0):
            assert [login(client, "carol@example.com", "right") for _ in range(8)] == [302] * 8


class TestLoginByIpAndAccount:
    """Per account alone, one IP sprays many accounts; per IP alone, a botnet spreads one
    account's guesses over many IPs. Together, each attack meets a limit."""

    def test_one_ip_many_accounts_meets_the_ip_limit(self, client: Client) -> None:
        with frozen_clock(T0):
            codes = [login(client, f"user{n}@example.com", "guess") for n in range(31)]
        assert codes == [200] * 30 + [429]  # never 5 failures on one account

    def test_many_ips_one_account_meets_the_account_limit(self, client: Client) -> None:
        with frozen_clock(T0):
            codes = [
                login(client, "dave@example.com", "guess", ip=f"198.51.100.{n}") for n in range(6)
            ]
        assert codes == [200] * 5 + [429]  # never 2 failures from one IP


class TestPasswordReset:
    def test_five_per_email_per_hour(self, client: Client) -> None:
        User.objects.create_user("erin", email="erin@example.com", password="x")
        with frozen_clock(T0) as clock:
            codes = [
                client.post("/accounts/password_reset/", {"email": "erin@example.com"}).status_code
                for _ in range(6)
            ]
            assert codes == [302] * 5 + [429]
            assert len(mail.outbox) == 5  # the sixth request sent nothing
            other = {"email": "frank@example.com"}
            assert client.post("/accounts/password_reset/", other).status_code == 302
            clock.advance(3600 + 60)  # an hour, plus up to one bucket (1/60 of it)
            again = {"email": "Erin@Example.com"}
            assert client.post("/accounts/password_reset/", again).status_code == 302


class TestSignup:
    def test_twenty_per_ip_per_day(self, client: Client) -> None:
        def signup(n: int, ip: str) -> int:
            data = {
                "username": f"new{n}",
                "password1": "a-Long-pw-123",
                "password2": "a-Long-pw-123",
            }
            return client.post("/accounts/signup/", data, REMOTE_ADDR=ip).status_code

        with frozen_clock(T0):
            assert [signup(n, "203.0.113.5") for n in range(21)] == [302] * 20 + [429]
            assert signup(99, "203.0.113.6") == 302
        assert User.objects.filter(username__startswith="new").count() == 21


class TestMessages:
    def test_one_per_second_per_user(self, client: Client) -> None:
        ann = User.objects.create_user("ann", password="pw")
        ben = User.objects.create_user("ben", password="pw")
        other = Client()
        client.force_login(ann)
        other.force_login(ben)
        with frozen_clock(T0) as clock:
            assert client.post("/messages/send/").status_code == 200
            refused = client.post("/messages/send/")
            assert refused.status_code == 429
            # The hit leaves the window 1 s plus one bucket (1/60 s) later: rounded up.
            assert refused["Retry-After"] == "2"
            assert other.post("/messages/send/").status_code == 200
            clock.advance(1 + 1 / 60)
            assert client.post("/messages/send/").status_code == 200
