"""Every door of the demo that checks a password, under one budget per account.

The doors: the log-in form, the admin's log-in, the password changes (the old password) and
the JSON API's HTTP Basic. The rules (``demo_site/settings.py``): ``login-pair`` (per account
and address, ``5/m;20/d``), ``login-account`` (per account, ``100/d``) and ``login-ip``
(``20/m;200/d``), failures only. Clocks are frozen, so "within a minute" is exact.
"""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import AsyncClient, Client, RequestFactory
from rest_framework.authentication import BasicAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from demo_site.accounts.passwords import basic_username
from demo_site.shortener.models import Link
from ratelimit_app.testing import frozen_clock
from tests.demo.conftest import PASSWORD

T0 = 1_800_000_000.0
#: The address the tests' own requests come from, unless they say otherwise.
HOME = "192.0.2.1"
STRANGER = "198.51.100.7"


def basic(username: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"HTTP_AUTHORIZATION": f"Basic {token}"}


def log_in(username: str, password: str, ip: str = HOME, path: str = "/accounts/login/") -> int:
    data = {"username": username, "password": password}
    return Client().post(path, data, REMOTE_ADDR=ip).status_code


def api_create(
    credentials: dict[str, str] | None = None, ip: str = HOME, url: str = "https://example.com/"
) -> int:
    return (
        Client()
        .post(
            "/api/links/",
            json.dumps({"url": url}),
            content_type="application/json",
            REMOTE_ADDR=ip,
            **(credentials or {}),
        )
        .status_code
    )


def change_password(session: Client, old: str, ip: str = HOME, **extra: str) -> int:
    data = {"old_password": old, "new_password1": "a new pass phrase", **extra}
    data["new_password2"] = data["new_password1"]
    return session.post("/accounts/password_change/", data, REMOTE_ADDR=ip).status_code


def signed_in(user: User) -> Client:
    session = Client()
    session.force_login(user)
    return session


class TestTheAPI:
    def test_guessing_through_basic_auth_is_limited(self, alice: User) -> None:
        with frozen_clock(T0):
            codes = [api_create(basic("alice", f"guess{n}")) for n in range(100)]
            right = api_create(basic("alice", PASSWORD))
            form = log_in("alice", PASSWORD)
        assert codes == [401] * 5 + [429] * 95
        # The right password is refused too, at the API and at the form: one budget.
        assert right == form == 429
        assert not Link.objects.exists()

    def test_the_user_name_is_compared_as_the_forms(self, alice: User) -> None:
        with frozen_clock(T0):
            for name in ("alice", " ALICE", "Alice ", "alice", "ALICE"):
                assert api_create(basic(name, "wrong")) == 401
            assert log_in("alice", PASSWORD) == 429

    def test_anonymous_use_is_not_counted(self, alice: User) -> None:
        """API requests without credentials that fail count in no log-in rule: a key
        without an account falls back to the address, and these must not lock it out."""
        with frozen_clock(T0):
            unknown = [Client().get(f"/api/links/nope{n}/visits/").status_code for n in range(20)]
            bad = [api_create(url="javascript:alert(1)", ip="127.0.0.1") for _ in range(5)]
            good = api_create(ip="127.0.0.1")
            # The log-in rules of that address are untouched: five wrong passwords fit.
            wrong = [log_in(f"user{n}", "wrong", ip="127.0.0.1") for n in range(20)]
        assert unknown == [404] * 20
        assert bad == [400] * 5
        assert good == 201
        assert wrong == [200] * 20

    def test_a_failed_post_with_the_right_password_is_no_wrong_password(self, alice: User) -> None:
        with frozen_clock(T0):
            bad = [
                api_create(basic("alice", PASSWORD), url="javascript:alert(1)") for _ in range(8)
            ]
            # The account's five wrong passwords are all still there.
            wrong = [log_in("alice", "wrong") for _ in range(6)]
        assert bad == [400] * 8
        assert wrong == [200] * 5 + [429]

    @pytest.mark.parametrize("method", ["get", "head", "options", "put", "patch", "delete"])
    @pytest.mark.parametrize("path", ["/api/links/", "/api/links/abc/visits/"])
    def test_no_password_is_checked_outside_the_rules_methods(
        self, alice: User, method: str, path: str
    ) -> None:
        """The rules cover POST: any other method that checked a password would be an
        unlimited door. Wrong credentials there are not even read (no 401), and count
        nothing."""
        Link.objects.create(key="abc", url="https://example.com/")
        with frozen_clock(T0):
            codes = [
                getattr(Client(), method)(path, **basic("alice", f"guess{n}")).status_code
                for n in range(10)
            ]
            assert log_in("alice", PASSWORD) == 302
        assert 401 not in codes
        assert set(codes) <= {200, 204, 405}

    @pytest.mark.parametrize(
        "header",
        [
            "Basic " + base64.b64encode(b"bob:pw:with:colons").decode(),
            "basic " + base64.b64encode(b"bob:pw").decode(),
            "Basic " + base64.b64encode("zo\u00eb:pw".encode()).decode(),
            "Basic " + base64.b64encode("zo\u00eb:pw".encode("latin-1")).decode(),
            "Basic " + base64.b64encode(b" Bob :pw").decode(),
            "Basic " + base64.b64encode(b":pw").decode(),
            "Basic " + base64.b64encode(b"no colon").decode(),
            "Basic " + base64.b64encode(b"bob:pw").decode() + " extra",
            "Basic",
            "Basic !!!",
            "Basic YWxpY2U6cHc",  # no padding
            "Bearer abc",
            "",
        ],
    )
    def test_the_basic_header_is_read_as_drf_reads_it(
        self, header: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The key reads the user name DRF would check the password of, or None where DRF
        checks no password (no header, another scheme, a header it refuses unread)."""
        checked: list[str] = []

        def check(self: BasicAuthentication, userid: str, password: str, request: Any) -> Any:
            checked.append(userid)
            return None

        monkeypatch.setattr(BasicAuthentication, "authenticate_credentials", check)
        django_request = RequestFactory().post("/", HTTP_AUTHORIZATION=header)
        with contextlib.suppress(AuthenticationFailed):  # refused: no password checked
            BasicAuthentication().authenticate(Request(django_request))
        assert basic_username(django_request) == (checked[0] if checked else None)


class TestThePasswordChange:
    def test_wrong_old_passwords_are_counted(self, alice: User) -> None:
        session = signed_in(alice)
        with frozen_clock(T0):
            codes = [change_password(session, f"guess{n}") for n in range(30)]
            right = change_password(session, PASSWORD)
        assert codes == [400] * 5 + [429] * 25
        assert right == 429
        alice.refresh_from_db()
        assert alice.check_password(PASSWORD)  # never changed

    def test_the_right_old_password_changes_it(self, alice: User) -> None:
        session = signed_in(alice)
        page = session.get("/accounts/password_change/")
        assert page.status_code == 200
        assert b"Change your password" in page.content
        with frozen_clock(T0):
            assert change_password(session, "wrong") == 400
            assert change_password(session, PASSWORD) == 302
        alice.refresh_from_db()
        assert alice.check_password("a new pass phrase")

    def test_a_named_username_does_not_move_the_count(
        self, alice: User, django_user_model: Any
    ) -> None:
        """The account is the signed-in user's: a ``username`` field added to the form
        cannot charge the guesses to someone else."""
        django_user_model.objects.create_user("bob", password=PASSWORD)
        session = signed_in(alice)
        with frozen_clock(T0):
            codes = [change_password(session, f"guess{n}", username=f"bob{n}") for n in range(6)]
            assert log_in("bob", PASSWORD) == 302
        assert codes == [400] * 5 + [429]

    def test_the_admins_password_change_is_counted(self, django_user_model: Any) -> None:
        staff = django_user_model.objects.create_user("staff", password=PASSWORD, is_staff=True)
        session = signed_in(staff)
        data = {"old_password": "wrong", "new_password1": "x9!long-enough", "new_password2": ""}
        with frozen_clock(T0):
            page = session.get("/admin/password_change/")
            codes = [
                session.post("/admin/password_change/", data, REMOTE_ADDR=HOME).status_code
                for _ in range(6)
            ]
            assert log_in("staff", PASSWORD, path="/admin/login/") == 429
        assert page.status_code == 200
        assert codes == [400] * 5 + [429]

    def test_the_admins_password_change_still_works(self, django_user_model: Any) -> None:
        staff = django_user_model.objects.create_user("staff", password=PASSWORD, is_staff=True)
        session = signed_in(staff)
        data = {
            "old_password": PASSWORD,
            "new_password1": "a new pass phrase",
            "new_password2": "a new pass phrase",
        }
        answer = session.post("/admin/password_change/", data)
        assert answer.status_code == 302
        assert answer["Location"] == "/admin/password_change/done/"
        staff.refresh_from_db()
        assert staff.check_password("a new pass phrase")
        # Only staff reach it, as the admin's own page.
        other = signed_in(django_user_model.objects.create_user("joe", password=PASSWORD))
        assert other.get("/admin/password_change/").status_code == 302


def test_one_budget_whichever_door(alice: User) -> None:
    session = signed_in(alice)
    with frozen_clock(T0):
        assert log_in("alice", "wrong") == 200
        assert log_in("Alice", "wrong", path="/admin/login/") == 200
        assert api_create(basic("ALICE", "wrong")) == 401
        assert change_password(session, "wrong") == 400
        assert api_create(basic(" alice ", "wrong")) == 401
        # Five wrong passwords from this address: every door refuses, the right password too.
        assert log_in("alice", PASSWORD) == 429
        assert log_in("alice", PASSWORD, path="/admin/login/") == 429
        assert api_create(basic("alice", PASSWORD)) == 429
        assert change_password(session, PASSWORD) == 429


def test_a_basic_header_on_the_form_does_not_move_the_count(
    alice: User, django_user_model: Any
) -> None:
    """The log-in form checks its ``username`` field: a Basic header naming someone else
    does not charge the guesses to them."""
    django_user_model.objects.create_user("bob", password=PASSWORD)
    with frozen_clock(T0):
        codes = [
            Client()
            .post(
                "/accounts/login/",
                {"username": "alice", "password": f"guess{n}"},
                REMOTE_ADDR=HOME,
                **basic(f"bob{n}", "x"),
            )
            .status_code
            for n in range(6)
        ]
    assert codes == [200] * 5 + [429]


class TestLockOut:
    def test_a_stranger_cannot_lock_the_owner_out(self, alice: User) -> None:
        with frozen_clock(T0) as clock:
            codes = []
            for _ in range(4):
                codes += [log_in("alice", "wrong", ip=STRANGER) for _ in range(5)]
                clock.advance(61)
            # The stranger's twenty for the day are used: refused, even the right password...
            assert log_in("alice", PASSWORD, ip=STRANGER) == 429
            # ...but the owner, from their own address, logs in.
            assert log_in("alice", PASSWORD, ip=HOME) == 302
            assert api_create(basic("alice", PASSWORD), ip=HOME) == 201
        assert codes == [200] * 20

    def test_the_account_ceiling_stops_a_distributed_guesser(self, alice: User) -> None:
        with frozen_clock(T0):
            # A hundred addresses, one guess each: every one far below its own pair limit.
            codes = [
                log_in("alice", f"guess{n}", ip=f"10.0.{n // 200}.{n % 200 + 1}")
                for n in range(100)
            ]
            refused = Client().post(
                "/accounts/login/",
                {"username": "alice", "password": "guess"},
                REMOTE_ADDR="10.9.9.9",
            )
            # The price: the owner is refused too, until the day's failures age out.
            owner = log_in("alice", PASSWORD, ip=HOME)
            other = log_in("bob", "wrong", ip="10.9.9.9")
        assert codes == [200] * 100
        assert refused.status_code == 429
        assert "<code>login-account</code>" in refused.content.decode()
        assert "Too many wrong passwords were tried for this account in" in (
            refused.content.decode()
        )
        assert owner == 429
        assert other == 200

    def test_each_address_gets_twenty_a_day_per_account(self, alice: User) -> None:
        with frozen_clock(T0) as clock:
            codes = []
            for _ in range(4):
                for ip in ("10.1.0.1", "10.1.0.2", "10.1.0.3"):
                    codes += [log_in("alice", "wrong", ip=ip) for _ in range(5)]
                clock.advance(61)
            # Three addresses, twenty each: sixty guesses, then each pair is spent.
            assert codes == [200] * 60
            assert [log_in("alice", "wrong", ip=ip) for ip in ("10.1.0.1", "10.1.0.3")] == [
                429
            ] * 2
            assert log_in("alice", "wrong", ip="10.1.0.4") == 200


@pytest.mark.django_db(transaction=True)
async def test_the_doors_under_asgi(alice: User) -> None:
    """The same budget when the site runs under ASGI (``demo_site.asgi``): the keys read
    the form, the header and the session user off the event loop. (Every request comes
    from the test client's one address.)"""
    client = AsyncClient()
    token = basic("alice", "x")["HTTP_AUTHORIZATION"]
    with frozen_clock(T0):
        login = await client.post("/accounts/login/", {"username": "alice", "password": "x"})
        api = await client.post(
            "/api/links/",
            json.dumps({"url": "https://example.com/"}),
            content_type="application/json",
            headers={"Authorization": token},
        )
        await client.aforce_login(alice)
        data = {"old_password": "x", "new_password1": "a b c d e", "new_password2": "a b c d e"}
        changes = [
            (await client.post("/accounts/password_change/", data)).status_code for _ in range(4)
        ]
    assert (login.status_code, api.status_code) == (200, 401)
    assert changes == [400, 400, 400, 429]
