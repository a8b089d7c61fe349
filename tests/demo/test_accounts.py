"""Each limit of the demo reaches its 429, through the demo's URLconf, middleware and rules.

Clocks are frozen (``ratelimit_app.testing.frozen_clock``), so "within a minute" and "a day
later" are exact, not a race with the wall clock.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core import mail
from django.test import Client

from demo_site.accounts.models import Message
from ratelimit_app.testing import frozen_clock
from tests.demo.conftest import PASSWORD

T0 = 1_800_000_000.0


def log_in(client: Client, username: str, password: str, ip: str = "192.0.2.1") -> int:
    data = {"username": username, "password": password}
    return client.post("/accounts/login/", data, REMOTE_ADDR=ip).status_code


def assert_demo_429(response: Any, rule: str) -> None:
    """The 429 is the demo's page (its nav, the rule), with Retry-After."""
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    text = response.content.decode()
    assert "<h1>Slow down</h1>" in text
    assert f"<code>{rule}</code>" in text
    assert 'aria-label="Main"' in text  # the site's own layout, not the library's page
    # A flood is answered with this page: it links the site's stylesheet rather than carrying
    # it (7 KB a refusal before, sent and read on every refused request).
    assert '<link rel="stylesheet" href="/site.css">' in text
    assert "<style" not in text
    assert len(response.content) < 2048


class TestLogin:
    def test_five_wrong_passwords_a_minute_per_account_and_address(
        self, client: Client, alice: User
    ) -> None:
        with frozen_clock(T0) as clock:
            assert [log_in(client, "alice", "wrong") for _ in range(5)] == [200] * 5
            refused = client.post(
                "/accounts/login/",
                {"username": "alice", "password": PASSWORD},
                REMOTE_ADDR="192.0.2.1",
            )
            assert_demo_429(refused, "login-pair")
            # The page blames the account at this address, and nothing else.
            text = refused.content.decode()
            assert "Too many wrong passwords were tried for this account from your" in text
            assert log_in(client, " ALICE ", "wrong") == 429  # the same account
            assert log_in(client, "bob", "wrong") == 200  # another account
            assert log_in(client, "alice", PASSWORD, ip="192.0.2.9") == 302  # another address
            clock.advance(61)
            assert log_in(client, "alice", PASSWORD) == 302

    def test_twenty_wrong_passwords_a_day_per_account_and_address(
        self, client: Client, alice: User
    ) -> None:
        with frozen_clock(T0) as clock:
            for _ in range(4):
                assert [log_in(client, "alice", "wrong") for _ in range(5)] == [200] * 5
                clock.advance(61)
            assert log_in(client, "alice", PASSWORD) == 429  # the day's twenty are used
            # A day later, plus up to one fine bucket (1/60 of the window): the limiter may
            # block early by that much, never late.
            clock.advance(86400 + 1440)
            assert log_in(client, "alice", PASSWORD) == 302

    def test_successful_logins_do_not_count(self, client: Client, alice: User) -> None:
        with frozen_clock(T0):
            assert [log_in(Client(), "alice", PASSWORD) for _ in range(8)] == [302] * 8

    def test_twenty_failures_a_minute_per_ip(self, client: Client) -> None:
        with frozen_clock(T0):
            codes = [log_in(client, f"user{n}", "guess") for n in range(21)]
            assert codes == [200] * 20 + [429]
            assert log_in(client, "user99", "guess", ip="192.0.2.2") == 200

    def test_the_admin_login_has_the_same_limits(self, client: Client, alice: User) -> None:
        with frozen_clock(T0):
            data = {"username": "alice", "password": "wrong", "next": "/admin/"}
            codes = [client.post("/admin/login/", data).status_code for _ in range(6)]
        assert codes == [200] * 5 + [429]


class TestPasswordReset:
    def test_five_per_address_an_hour(self, client: Client, alice: User) -> None:
        with frozen_clock(T0) as clock:
            codes = [
                client.post("/accounts/password_reset/", {"email": "alice@example.com"})
                for _ in range(6)
            ]
            assert [r.status_code for r in codes] == [302] * 5 + [429]
            assert_demo_429(codes[-1], "password-reset")
            assert len(mail.outbox) == 5
            assert "/accounts/reset/" in mail.outbox[0].body
            # Another address has its own five; an unknown one counts the same (no hint).
            other = {"email": "nobody@example.com"}
            assert client.post("/accounts/password_reset/", other).status_code == 302
            clock.advance(3600 + 60)
            again = {"email": "Alice@Example.com"}
            assert client.post("/accounts/password_reset/", again).status_code == 302

    def test_the_reset_link_works(self, client: Client, alice: User) -> None:
        client.post("/accounts/password_reset/", {"email": "alice@example.com"})
        link = next(line for line in mail.outbox[0].body.splitlines() if "/reset/" in line)
        page = client.get(link.strip().replace("http://testserver", ""), follow=True)
        assert page.status_code == 200
        assert b"Choose a new password" in page.content

    @staticmethod
    def ask_reset(email: str, ip: str = "203.0.113.9") -> int:
        """A fresh client's password reset request for ``email``: its status."""
        return (
            Client()
            .post("/accounts/password_reset/", {"email": email}, REMOTE_ADDR=ip)
            .status_code
        )

    def test_one_address_cannot_mail_every_account(self, django_user_model: Any) -> None:
        for n in range(12):
            django_user_model.objects.create_user(
                f"user{n}", email=f"user{n}@example.com", password=PASSWORD
            )
        with frozen_clock(T0) as clock:
            codes = [self.ask_reset(f"user{n}@example.com") for n in range(12)]
            assert codes == [302] * 10 + [429] * 2
            assert len(mail.outbox) == 10
            # Another address still gets its resets; the hour's ten come back an hour later.
            assert self.ask_reset("user11@example.com", ip="192.0.2.8") == 302
            clock.advance(3600 + 60)
            assert self.ask_reset("user10@example.com") == 302

    def test_thirty_a_day_per_address(self, django_user_model: Any) -> None:
        with frozen_clock(T0) as clock:
            codes = []
            for hour in range(4):
                codes += [self.ask_reset(f"nobody{hour}-{n}@example.com") for n in range(10)]
                clock.advance(3600 + 60)
        assert codes == [302] * 30 + [429] * 10


class TestSignup:
    @staticmethod
    def sign_up(client: Client, n: int, ip: str = "203.0.113.5") -> int:
        data = {
            "username": f"new{n}",
            "email": f"new{n}@example.com",
            "password1": PASSWORD,
            "password2": PASSWORD,
        }
        return client.post("/accounts/signup/", data, REMOTE_ADDR=ip).status_code

    def test_twenty_a_day_per_ip(self) -> None:
        with frozen_clock(T0):
            codes = [self.sign_up(Client(), n) for n in range(21)]
            assert codes == [302] * 20 + [429]
            assert self.sign_up(Client(), 99, ip="203.0.113.6") == 302
        assert User.objects.filter(username__startswith="new").count() == 21

    def test_a_sign_up_logs_in(self, client: Client) -> None:
        assert self.sign_up(client, 1) == 302
        assert b"new1" in client.get("/").content

    def test_forms_with_errors_are_400_and_count(self) -> None:
        with frozen_clock(T0):
            bad = {"username": "x", "email": "not-an-email", "password1": "a", "password2": "b"}
            codes = [
                Client().post("/accounts/signup/", bad, REMOTE_ADDR="203.0.113.7").status_code
                for _ in range(21)
            ]
        assert codes == [400] * 20 + [429]

    def test_probing_for_taken_names_is_limited(self, alice: User) -> None:
        """The form says when a username or an address has an account (it must, to be
        usable): every such probe is a sign-up POST, twenty a day per address."""
        data = {"username": "alice", "email": "ALICE@example.com", "password1": "x"}
        with frozen_clock(T0):
            answers = [
                Client().post("/accounts/signup/", data, REMOTE_ADDR="203.0.113.8")
                for _ in range(21)
            ]
        assert [a.status_code for a in answers] == [400] * 20 + [429]
        assert b"A user with that username already exists." in answers[0].content
        assert b"An account already uses this address." in answers[0].content

    def test_one_account_per_email(self, client: Client, alice: User) -> None:
        data = {
            "username": "alice2",
            "email": "ALICE@example.com",
            "password1": PASSWORD,
            "password2": PASSWORD,
        }
        response = client.post("/accounts/signup/", data)
        assert response.status_code == 400
        assert b"An account already uses this address." in response.content


class TestMessages:
    def test_one_a_second_per_user(self, client: Client, alice: User) -> None:
        bob = User.objects.create_user("bob", password=PASSWORD)
        other = Client()
        client.force_login(alice)
        other.force_login(bob)
        with frozen_clock(T0) as clock:
            assert client.post("/messages/send/", {"text": "hello"}).status_code == 302
            refused = client.post("/messages/send/", {"text": "again"})
            assert_demo_429(refused, "send-message")
            assert other.post("/messages/send/", {"text": "hi"}).status_code == 302
            clock.advance(1 + 1 / 60)
            assert client.post("/messages/send/", {"text": "later"}).status_code == 302
        assert list(Message.objects.order_by("id").values_list("text", flat=True)) == [
            "hello",
            "hi",
            "later",
        ]
        board = client.get("/messages/")
        assert board.status_code == 200
        assert b"later" in board.content

    def test_the_board_needs_an_account(self, client: Client) -> None:
        response = client.get("/messages/")
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
        assert client.post("/messages/send/", {"text": "x"}).status_code == 302
        assert not Message.objects.exists()

    def test_an_empty_message_is_a_form_error(self, client: Client, alice: User) -> None:
        client.force_login(alice)
        response = client.post("/messages/send/", {"text": ""})
        assert response.status_code == 400
        assert b"This field is required." in response.content


def test_pages_render(client: Client, alice: User) -> None:
    for path in (
        "/",
        "/limits/",
        "/accounts/login/",
        "/accounts/signup/",
        "/accounts/password_reset/",
    ):
        response = client.get(path)
        assert response.status_code == 200, path
    limits = client.get("/limits/").content.decode()
    for rule in (
        "login-pair",
        "login-account",
        "login-ip",
        "password-reset",
        "password-reset-ip",
        "signup",
        "send-message",
        "shorturl-scan",
    ):
        assert f"<code>{rule}</code>" in limits
    # The demo's own keys are named as people say them, not by their module path.
    assert "<td>account and address</td>" in limits
    assert "demo_site.accounts.passwords" not in limits
    client.force_login(alice)
    page = client.get("/").content.decode()
    assert "alice" in page and "Log out" in page
    assert client.post("/accounts/logout/").status_code == 302
