"""Per-subject overrides (issue 26, part 3): the pure table, the model and admin, and the
overrides at work through settings rules, database rules, ``@ratelimit``, ``get_usage`` and
a DRF throttle, on every backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.utils import timezone

from ratelimit_app import core, store
from ratelimit_app.algorithms.rates import Rate
from ratelimit_app.config import versions
from ratelimit_app.config.policy import policy
from ratelimit_app.decorators import ratelimit
from ratelimit_app.engine.enforce import Decision
from ratelimit_app.identity.addresses import mask_ip
from ratelimit_app.models import Override, Rule
from ratelimit_app.overrides import applied
from ratelimit_app.overrides import table as overrides
from ratelimit_app.overrides.table import UNLIMITED, OverrideError
from ratelimit_app.testing import forget_refusals
from tests.ratelimit.test_admin import MIDDLEWARE

API = {"name": "api", "path": "/rules/named/", "key": "user", "rate": "2/m"}
LOGIN = {"name": "login", "path": "/rules/unnamed/", "key": "ip", "rate": "2/m"}
OFFICE = "203.0.113.0/24"


def nothing(*args: Any) -> Any:
    return None


def table(*rows: tuple[str, str, str]) -> overrides.Table:
    return overrides.compile_table([overrides.parse(*row) for row in rows], mask_ip)


def ask(
    found: overrides.Table,
    limit: str,
    kind: str,
    value: str,
    username: str | None = None,
    groups: tuple[str, ...] = (),
) -> Any:
    return found.lookup(limit, kind, value, lambda: username, lambda: groups)[0]


# -- the pure module -------------------------------------------------------------------------


class TestParse:
    @pytest.mark.parametrize(
        ("subject", "field", "words"),
        [
            ("203.0.113.7/24", "subject", "host bits set: the network is 203.0.113.0/24"),
            ("2001:db8::1/32", "subject", "host bits set"),
            ("203.0.113.300", "subject", "not a valid IP address"),
            ("10.0.0.0/33", "subject", "not a valid CIDR network"),
            ("group:", "subject", "'group:' needs a group name"),
            ("group:   ", "subject", "'group:' needs a group name"),
            ("group:" + "g" * 151, "subject", "at most 150"),
            ("x" * 321, "subject", "longer than 320"),
            ("\ufdfa" * 100, "subject", "longer than 320"),  # NFKC: 18 characters each
            ("al\u200bice", "subject", "invisible or control characters"),
            ("al\x00ice", "subject", "invisible or control characters"),
            ("\ud800", "subject", "invisible or control characters"),
            ("   ", "subject", "non-empty text"),
        ],
    )
    def test_bad_subjects_name_the_field(self, subject: str, field: str, words: str) -> None:
        with pytest.raises(OverrideError) as caught:
            overrides.parse("api", subject, "5/m")
        assert caught.value.field == field
        assert words in str(caught.value)

    def test_every_mistake_at_once(self) -> None:
        with pytest.raises(OverrideError) as caught:
            overrides.parse("two words", "", "5/M")
        assert [e.field for e in caught.value.errors] == ["limit", "subject", "rate"]
        assert "Invalid rate '5/M'" in str(caught.value.errors[2])
        assert "'unlimited'" in str(caught.value.errors[2])

    @pytest.mark.parametrize("limit", ["", "x" * 201, 5, None])
    def test_bad_limits(self, limit: Any) -> None:
        with pytest.raises(OverrideError) as caught:
            overrides.parse(limit, "alice", "5/m")
        assert caught.value.field == "limit"

    def test_subjects_are_normalised_as_the_keys_store_them(self) -> None:
        assert overrides.parse_subject("  partner\t") == ("value", "partner", None)
        assert overrides.parse_subject(" group: premium ") == ("group", "premium", None)
        mapped = overrides.parse_subject("::ffff:203.0.113.0/120")
        assert mapped.value == OFFICE
        assert overrides.parse_subject("::ffff:192.0.2.1").value == "192.0.2.1/32"
        assert overrides.parse_subject("2001:DB8::/48").value == "2001:db8::/48"
        assert overrides.parse_subject("a/b").kind == "value"  # a slash alone is no network

    def test_rates(self) -> None:
        assert overrides.parse_rate(" Unlimited ") == UNLIMITED
        assert overrides.parse_rate("5/m;100/d") == (Rate(5, 60), Rate(100, 86400))
        with pytest.raises(OverrideError, match="1 second and"):
            overrides.parse_rate("5/400d")


class TestTable:
    def test_exact_then_longest_prefix_then_none(self) -> None:
        found = table(
            ("login", "203.0.113.0/24", "unlimited"),
            ("login", "203.0.113.128/25", "50/m"),
            ("login", "203.0.113.200", "7/m"),
        )
        assert ask(found, "login", "ip", "203.0.113.200") == (Rate(7, 60),)
        assert ask(found, "login", "ip", "203.0.113.130") == (Rate(50, 60),)
        assert ask(found, "login", "ip", "203.0.113.1") == UNLIMITED
        assert ask(found, "login", "ip", "198.51.100.1") is None
        assert ask(found, "other", "ip", "203.0.113.1") is None

    def test_networks_only_for_ip_subjects_and_groups_only_for_users(self) -> None:
        found = table(("api", OFFICE, "unlimited"), ("api", "group:premium", "20/m"))
        assert ask(found, "api", "header:x-forwarded", "203.0.113.5") is None
        assert ask(found, "api", "email", "x@example.com", groups=("premium",)) is None
        assert ask(found, "api", "user", "7", "bob", ("premium",)) == (Rate(20, 60),)
        # user_or_ip counted the address of an anonymous request: networks, not groups.
        assert ask(found, "api", "user_or_ip", "203.0.113.5") == UNLIMITED
        assert ask(found, "api", "user_or_ip", "7", "bob", ("premium",)) == (Rate(20, 60),)

    def test_a_username_beats_a_group_and_the_most_generous_group_wins(self) -> None:
        found = table(
            ("api", "partner", "10000/h"),
            ("api", "group:premium", "100/m"),
            ("api", "group:staff", "5/s;1000/d"),
        )
        both = ("premium", "staff")
        assert ask(found, "api", "user", "3", "partner", both) == (Rate(10000, 3600),)
        # premium: 1.67/s in the long run; staff: 1000/d is 0.012/s.
        assert ask(found, "api", "user", "4", "carol", both) == (Rate(100, 60),)
        found = table(("api", "group:a", "100/m"), ("api", "group:b", "unlimited"))
        assert ask(found, "api", "user", "4", "carol", ("a", "b")) == UNLIMITED

    def test_groups_are_asked_only_when_a_group_override_could_apply(self) -> None:
        asked = []

        def groups() -> tuple[str, ...]:
            asked.append(1)
            return ()

        found = table(("api", "partner", "9/m"))
        assert found.lookup("api", "user", "3", lambda: "bob", groups) == (None, False)
        found = table(("api", "group:x", "9/m"))
        assert found.lookup("api", "ip", "192.0.2.1", nothing, groups) == (None, False)
        assert asked == []
        assert found.lookup("api", "user", "3", lambda: "bob", groups) == (None, True)
        assert asked == [1]

    def test_emails_fold_case_other_values_do_not(self) -> None:
        found = table(("signup", " Alice@Example.COM ", "9/m"), ("hdr", "Key-A", "8/m"))
        assert ask(found, "signup", "email", "alice@example.com") == (Rate(9, 60),)
        assert ask(found, "signup", "email:address", "alice@example.com") == (Rate(9, 60),)
        assert ask(found, "hdr", "header:x-api-key", "Key-A") == (Rate(8, 60),)
        assert ask(found, "hdr", "header:x-api-key", "key-a") is None

    def test_ipv6_within_the_mask_is_the_masked_subject(self) -> None:
        # The IP keys count a /64 as one client: an address or a /96 inside it names it.
        found = table(("x", "2001:db8::1", "1/s"), ("x", "2001:db8:1::/96", "2/s"))
        assert ask(found, "x", "ip", "2001:db8::") == (Rate(1, 1),)
        assert ask(found, "x", "ip", "2001:db8:1::") == (Rate(2, 1),)
        wide = table(("x", "2001:db8::/32", "3/s"))
        assert ask(wide, "x", "ip", "2001:db8:ffff::") == (Rate(3, 1),)
        assert ask(wide, "x", "ip", "2001:db9::") is None

    def test_ipv4_mapped_networks_match_ipv4_subjects(self) -> None:
        found = table(("login", "::ffff:203.0.113.0/120", "unlimited"))
        assert ask(found, "login", "ip", "203.0.113.9") == UNLIMITED
        assert not table()
        assert found


# -- the model and the admin -----------------------------------------------------------------


@pytest.fixture
def site() -> Iterator[None]:
    """The test views behind the middleware, with the API and login rules in the settings."""
    store.forget()
    applied.forget()
    forget_refusals()
    with override_settings(
        ROOT_URLCONF="tests.ratelimit.urls", MIDDLEWARE=MIDDLEWARE, RATELIMIT_RULES=[API, LOGIN]
    ):
        yield
    store.forget()
    applied.forget()
    forget_refusals()


def override(limit: str, subject: str, rate: str, **fields: Any) -> Override:
    row = Override(limit=limit, subject=subject, rate=rate, **fields)
    row.full_clean()
    row.save()
    return row


def user(name: str, *groups: str) -> User:
    found = User.objects.create_user(name, password="pw")
    for group in groups:
        found.groups.add(Group.objects.get_or_create(name=group)[0])
    return found


def signed_in(found: User) -> Client:
    client = Client()
    client.force_login(found)
    return client


@pytest.mark.django_db
@pytest.mark.db_matrix
@pytest.mark.usefixtures("site")
class TestModel:
    @pytest.mark.parametrize(
        ("fields", "field", "words"),
        [
            ({"rate": "5/M"}, "rate", "Invalid rate '5/M'"),
            ({"subject": "203.0.113.7/24"}, "subject", "host bits"),
            ({"subject": "group:"}, "subject", "needs a group name"),
            ({"limit": "two words"}, "limit", "holds a space"),
            ({"limit": "logni"}, "limit", "did you mean 'login'"),
            ({"limit": "drf:nope"}, "limit", "No DRF throttle scope"),
        ],
    )
    def test_form_errors_name_the_field(
        self, fields: dict[str, str], field: str, words: str
    ) -> None:
        row = Override(**{"limit": "api", "subject": "partner", "rate": "9/m", **fields})
        with pytest.raises(ValidationError) as caught:
            row.full_clean()
        assert words in " ".join(caught.value.message_dict[field])

    def test_a_leaky_bucket_rule_takes_one_rate(self) -> None:
        Rule.objects.create(
            name="meter", path="/m/", key="ip", rate="5/m", algorithm="leaky_bucket"
        )
        with pytest.raises(ValidationError) as caught:
            override("meter", "192.0.2.1", "5/m;100/d")
        assert "one leak rate" in caught.value.message_dict["rate"][0]
        override("meter", "192.0.2.2", "unlimited")

    def test_decorator_groups_and_database_rules_are_accepted(self) -> None:
        Rule.objects.create(name="db-rule", path="/x/", key="ip", rate="5/m")
        override("db-rule", "192.0.2.1", "9/m")
        override("tests.views.hello", "192.0.2.1", "9/m")
        override("premium-api", "group:premium", "9/m")  # nothing like a rule's name
        with pytest.raises(ValidationError, match="already exists"):
            override("db-rule", " 192.0.2.1 ", "1/m")  # stripped: the same subject

    def test_a_username_must_be_an_accounts(self) -> None:
        """Issue 35, item 9: an override for a name nobody holds would go to whoever signs
        up with it; the name is compared as Django's log-in compares it, case included."""
        with pytest.raises(ValidationError) as caught:
            override("api", "partner", "10000/h")
        assert "No account has the username 'partner'" in caught.value.message_dict["subject"][0]
        user("PARTNER")
        with pytest.raises(ValidationError, match="No account has the username"):
            override("api", "partner", "10000/h")
        user("partner")
        override("api", "partner", "10000/h")
        # Not a username: a network, a group; or a limit whose key is no user's.
        override("api", OFFICE, "unlimited")
        override("api", "group:nobody-yet", "9/m")
        override("login", "ghost", "9/m")
        override("tests.views.hello", "ghost", "9/m")  # a decorator's group: key unknown

    def test_user_keyed_database_rules_and_drf_scopes_need_an_account(self) -> None:
        import ratelimit_app.throttling  # noqa: F401 (registers the DRF scopes)

        Rule.objects.create(name="db-user", path="/x/", key="user_or_ip", rate="5/m")
        with pytest.raises(ValidationError, match="No account has the username 'ghost'"):
            override("db-user", "ghost", "9/m")
        override("db-user", "192.0.2.1", "9/m")
        with override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"user": "5/m"}}):
            with pytest.raises(ValidationError, match="No account has the username 'ghost'"):
                override("drf:user", "ghost", "10000/h")
            user("ghost")
            override("drf:user", "ghost", "10000/h")

    def test_a_rule_of_places_only_takes_no_override(self) -> None:
        Rule.objects.create(name="places", path="/p/", key="ip", rate="", concurrent=2)
        with pytest.raises(ValidationError) as caught:
            override("places", "192.0.2.1", "unlimited")
        assert "requests in flight only" in caught.value.message_dict["limit"][0]

    def test_rule_cost_and_dry_run(self) -> None:
        rule = Rule(name="r", path="/x/", key="ip", rate="5/m")
        assert "cost" not in rule.as_dict() and "shadow" not in rule.as_dict()
        rule.cost, rule.shadow = 5, True
        assert rule.as_dict()["cost"] == 5 and rule.as_dict()["shadow"] is True
        rule.cost = 0
        with pytest.raises(ValidationError) as caught:
            rule.full_clean()
        assert "cost" in caught.value.message_dict


@pytest.mark.django_db
@pytest.mark.usefixtures("site")
class TestAdmin:
    @pytest.fixture
    def admin(self) -> Client:
        found = User.objects.create_superuser("root", password="pw")
        return signed_in(found)

    def test_add_through_the_form_and_list(self, admin: Client) -> None:
        page = admin.get("/admin/ratelimit_app/override/add/?limit=api")
        assert b'value="api"' in page.content
        answer = admin.post(
            "/admin/ratelimit_app/override/add/",
            {"limit": "api", "subject": "203.0.113.7/24", "rate": "nope"},
        )
        assert answer.status_code == 200  # the form again, with its errors
        assert b"host bits set" in answer.content and b"Invalid rate" in answer.content
        user("partner")
        answer = admin.post(
            "/admin/ratelimit_app/override/add/",
            {"limit": "api", "subject": "partner", "rate": "10000/h"},
        )
        assert answer.status_code == 302
        listed = admin.get("/admin/ratelimit_app/override/").content.decode()
        assert "partner" in listed and "10000/h" in listed and "icon-yes" in listed

    def test_unlimited_on_a_value_the_request_sends_warns(self, admin: Client) -> None:
        """Issue 35, item 9: anyone who types the value escapes the limit; the form saves
        it, and says so."""
        signup = {"name": "signup", "path": "/signup/", "key": "post:email", "rate": "2/m"}
        with override_settings(RATELIMIT_RULES=[API, LOGIN, signup]):
            answer = admin.post(
                "/admin/ratelimit_app/override/add/",
                {"limit": "signup", "subject": "ceo@example.com", "rate": "unlimited"},
                follow=True,
            )
            shown = [(m.level_tag, str(m)) for m in answer.context["messages"]]
            assert Override.objects.filter(limit="signup").exists()  # saved all the same
            assert any(
                tag == "warning" and "keyed on post:email" in text and "anyone who sends" in text
                for tag, text in shown
            ), shown
            for rate, limit in (("50/m", "signup"), ("unlimited", "login")):
                answer = admin.post(
                    "/admin/ratelimit_app/override/add/",
                    {"limit": limit, "subject": "other@example.com", "rate": rate},
                    follow=True,
                )
                assert answer.status_code == 200
                assert not [m for m in answer.context["messages"] if m.level_tag == "warning"]

    def test_the_form_refuses_a_username_nobody_holds(self, admin: Client) -> None:
        answer = admin.post(
            "/admin/ratelimit_app/override/add/",
            {"limit": "api", "subject": "partner", "rate": "10000/h"},
        )
        assert answer.status_code == 200 and b"No account has the username" in answer.content
        assert not Override.objects.exists()

    def test_overrides_are_listed_beside_their_rule(self, admin: Client) -> None:
        rule = Rule.objects.create(name="db-rule", path="/x/", key="ip", rate="5/m")
        mine = override("db-rule", OFFICE, "unlimited")
        user("partner")
        override("api", "partner", "10000/h")
        listed = admin.get("/admin/ratelimit_app/rule/").content.decode()
        assert f"/admin/ratelimit_app/override/{mine.pk}/change/" in listed
        assert f"{OFFICE}: unlimited" in listed
        assert "partner: 10000/h" in listed  # the settings rule's row
        page = admin.get(f"/admin/ratelimit_app/rule/{rule.pk}/change/").content.decode()
        assert f"{OFFICE}: unlimited" in page and "partner" not in page
        assert 'name="cost"' in page and 'name="shadow"' in page


# -- at work ---------------------------------------------------------------------------------


def statuses(client: Client, path: str, n: int, **extra: Any) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(n)]


@pytest.mark.django_db
@pytest.mark.usefixtures("site")
class TestAtWork:
    def test_a_partner_account_gets_10000_an_hour(self, backend_kind: str) -> None:
        partner, other = signed_in(user("partner")), signed_in(user("someone"))
        override("api", "partner", "10000/h")
        assert statuses(partner, "/rules/named/", 5) == [200] * 5
        assert statuses(other, "/rules/named/", 3) == [200, 200, 429]
        headers = partner.get("/rules/named/").headers
        assert '"api:10000/h"' in headers["RateLimit-Policy"]

    def test_a_username_in_other_case_is_another_account(self, backend_kind: str) -> None:
        """Issue 35, item 8: ``PARTNER`` is not ``partner`` (Django's log-in tells them
        apart), so it does not get partner's rates."""
        partner, shouty = signed_in(user("partner")), signed_in(user("PARTNER"))
        override("api", "partner", "10000/h")
        assert statuses(partner, "/rules/named/", 4) == [200] * 4
        assert statuses(shouty, "/rules/named/", 3) == [200, 200, 429]

    def test_the_office_network_is_exempt_from_the_login_rule(self, backend_kind: str) -> None:
        override("login", OFFICE, "unlimited")
        client = Client()
        office = statuses(client, "/rules/unnamed/", 4, REMOTE_ADDR="203.0.113.9")
        assert office == [200] * 4
        mapped = statuses(client, "/rules/unnamed/", 4, REMOTE_ADDR="::ffff:203.0.113.10")
        assert mapped == [200] * 4
        answer = client.get("/rules/unnamed/", REMOTE_ADDR="203.0.113.9")
        assert "RateLimit" not in answer.headers  # counted nowhere, shown nowhere
        outside = statuses(client, "/rules/unnamed/", 3, REMOTE_ADDR="198.51.100.1")
        assert outside == [200, 200, 429]

    def test_a_database_rule(self, backend_kind: str) -> None:
        Rule.objects.create(name="db-rule", path="/rules/status/", key="ip", rate="1/m")
        override("db-rule", "192.0.2.7", "3/m")
        client = Client()
        assert statuses(client, "/rules/status/200/", 4, REMOTE_ADDR="192.0.2.7") == [
            200,
            200,
            200,
            429,
        ]
        assert statuses(client, "/rules/status/200/", 2, REMOTE_ADDR="192.0.2.8") == [200, 429]

    def test_the_premium_group_gets_ten_times_the_default(self, backend_kind: str) -> None:
        override("tests.overrides.premium", "group:premium", "20/m")
        premium, plain = user("gold", "premium"), user("tin")
        view = premium_view()
        assert decorated(view, premium, 12) == [200] * 12
        assert decorated(view, plain, 3) == [200, 200, 429]

    def test_get_usage_none_when_unlimited(self, backend_kind: str) -> None:
        override("usage-group", "192.0.2.1", "unlimited")
        override("usage-group", "192.0.2.2", "7/m")
        store.current()  # no middleware here: load the configuration
        rf = RequestFactory()

        def usage(ip: str) -> Any:
            request = rf.get("/", REMOTE_ADDR=ip)
            return core.get_usage(request, "usage-group", key="ip", rate="2/m", increment=True)

        assert usage("192.0.2.1") is None
        found = usage("192.0.2.2")
        assert found["limit"] == 7 and found["count"] == 1
        assert usage("192.0.2.3")["limit"] == 2

    def test_a_drf_throttle(self, backend_kind: str) -> None:
        from ratelimit_app.throttling import UserRateThrottle
        from tests.drf.conftest import api_view, get

        class Throttle(UserRateThrottle):
            scope = "partners"
            rate = "2/m"

        with override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"partners": "2/m"}}):
            partner, other = user("partner"), user("other")
            override("drf:partners", "partner", "10000/h")
            store.current()
            view = api_view(Throttle)
            assert [get(view, user=partner).status_code for _ in range(4)] == [200] * 4
            assert [get(view, user=other).status_code for _ in range(3)] == [200, 200, 429]

    def test_expired_overrides_do_not_apply_and_the_snapshot_looks_again(
        self, backend_kind: str
    ) -> None:
        past, soon = timezone.now() - timedelta(seconds=1), timezone.now() + timedelta(hours=1)
        override("login", "192.0.2.1", "unlimited", expires=past)
        override("login", "192.0.2.2", "unlimited", expires=soon)
        client = Client()
        assert statuses(client, "/rules/unnamed/", 3, REMOTE_ADDR="192.0.2.1")[-1] == 429
        assert statuses(client, "/rules/unnamed/", 3, REMOTE_ADDR="192.0.2.2") == [200] * 3
        assert store.current().override_ends[0][0] == pytest.approx(soon.timestamp())

    def test_a_change_reaches_the_process_without_restart(self, backend_kind: str) -> None:
        client = Client()
        with mock.patch.object(store, "CONFIG_REFRESH", 0):
            assert statuses(client, "/rules/unnamed/", 3, REMOTE_ADDR="192.0.2.5")[-1] == 429
            assert not store.current().overriding
            # Another process saved it: the row and the shared counter's bump, not ours.
            Override.objects.bulk_create(
                [Override(limit="login", subject="192.0.2.0/24", rate="unlimited")]
            )
            versions.version_op(increment=True)
            assert client.get("/rules/unnamed/", REMOTE_ADDR="192.0.2.5").status_code == 200
            assert store.current().overriding
            Override.objects.all().delete()  # our own delete: post_delete bumps
            assert client.get("/rules/unnamed/", REMOTE_ADDR="192.0.2.5").status_code == 429
            assert not store.current().overriding

    def test_no_query_per_request(self, backend_kind: str, django_assert_num_queries: Any) -> None:
        gold, partner = signed_in(user("gold", "premium")), signed_in(user("partner"))
        override("api", "group:premium", "50/m")
        override("api", "partner", "50/m")
        gold.get("/rules/named/")  # loads the configuration, and gold's groups
        partner.get("/rules/named/")
        # Left: the session and user the auth middleware reads, nothing of ours.
        with django_assert_num_queries(4):
            gold.get("/rules/named/")
            partner.get("/rules/named/")
        with mock.patch.object(applied, "GROUPS_FOR", 0.0):
            applied.forget()
            store.forget()
            gold.get("/rules/named/")  # loads again
            with django_assert_num_queries(3):  # session, user, and the groups again
                gold.get("/rules/named/")

    def test_one_check_object_per_subject(self, backend_kind: str) -> None:
        partner = user("partner")
        override("api", "partner", "50/m")
        store.current()
        lim = store.current().rules.by_name["api"].limit
        rf = RequestFactory()
        made = []
        for _ in range(2):
            request = rf.get("/rules/named/")
            request.user = partner
            check = lim.check(request)
            assert check is not None
            d = Decision(policy(lim, name="api", fail_open=True), check)
            applied.apply(request, [d])
            made.append(d.check)
        assert made[0] is made[1]
        assert made[0].rates == (Rate(50, 60),) and made[0].scope != lim.static_scope


def premium_view() -> Callable[..., HttpResponse]:
    @ratelimit(group="tests.overrides.premium", key="user", rate="2/m")
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    return view


def decorated(view: Callable[..., Any], who: User, n: int) -> list[int]:
    store.current()  # no middleware here: load the configuration (then decide refreshes it)
    rf = RequestFactory()
    found = []
    for _ in range(n):
        request = rf.get("/")
        request.user = who
        try:
            found.append(view(request).status_code)
        except Exception as exc:  # Ratelimited
            found.append(429 if type(exc).__name__ == "Ratelimited" else 500)
    return found


@pytest.mark.django_db
@pytest.mark.usefixtures("site")
def test_without_overrides_decide_does_not_look() -> None:
    Rule.objects.create(name="db-rule", path="/rules/status/", key="ip", rate="5/m")
    with mock.patch.object(applied, "prefilter", side_effect=AssertionError("looked")):
        assert Client().get("/rules/status/200/").status_code == 200
        assert not store.current().overriding
        override("db-rule", "192.0.2.1", "unlimited")
        with pytest.raises(AssertionError, match="looked"):
            Client().get("/rules/status/200/")


@pytest.mark.django_db
@pytest.mark.usefixtures("site")
def test_a_subject_no_override_names_is_not_looked_up() -> None:
    """With overrides in force, a request whose subjects none of them names passes by the
    table (one look-up of its value): the crowd's requests pay nothing more."""
    Rule.objects.create(name="db-rule", path="/rules/status/", key="ip", rate="5/m")
    override("db-rule", "192.0.2.1", "unlimited")
    override("db-rule", "alice@example.org", "unlimited")  # another kind's value
    with mock.patch.object(applied, "apply", side_effect=AssertionError("looked")):
        assert Client().get("/rules/status/200/").status_code == 200  # 127.0.0.1
        assert store.current().overriding
        with pytest.raises(AssertionError, match="looked"):
            Client(REMOTE_ADDR="192.0.2.1").get("/rules/status/200/")


@pytest.mark.django_db
def test_the_demo_seeds_the_three_examples() -> None:
    from demo_site.shortener.overrides import EXAMPLES, seed_overrides

    assert seed_overrides() == 3
    assert seed_overrides() == 0  # once
    # The partner account is the demo's, not whoever signs up first as "partner".
    partner = User.objects.get(username="partner")
    assert not partner.has_usable_password()
    for row in Override.objects.all():
        assert row.parsed().limit in {limit for limit, *_ in EXAMPLES}
    assert Group.objects.filter(name="premium").exists()
