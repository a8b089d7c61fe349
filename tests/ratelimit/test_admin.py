"""The ratelimit admin and database rules: validation, propagation, permissions, reset."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.cache import caches
from django.core.exceptions import ValidationError
from django.test import Client, override_settings
from django.utils import timezone

from ratelimit_app import core, store
from ratelimit_app.config import versions
from ratelimit_app.models import AccessEntry, Rule
from ratelimit_app.testing import frozen_clock

T0 = 1_800_000_000.0
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "ratelimit_app.middleware.RatelimitMiddleware",
]
SETTINGS_RULE = {"name": "from-settings", "path": "/rules/unnamed/", "key": "ip", "rate": "9/m"}
USAGE = "/admin/ratelimit_app/rule/usage/"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    with override_settings(
        ROOT_URLCONF="tests.ratelimit.urls",
        MIDDLEWARE=MIDDLEWARE,
        RATELIMIT_RULES=[SETTINGS_RULE],
    ):
        store.forget()
        caches["default"].clear()  # the counters of other tests
        yield
    store.forget()


def db_rule(**fields: Any) -> Rule:
    values = {"name": "db-rule", "path": "/rules/named/", "key": "ip", "rate": "2/m", **fields}
    rule = Rule(**values)
    rule.full_clean()
    rule.save()
    return rule


def staff(*perms: str, superuser: bool = False) -> Client:
    user = User.objects.create_user(f"staff{len(perms)}{superuser}", password="pw", is_staff=True)
    user.is_superuser = superuser
    user.save()
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


class TestDatabaseRules:
    def test_a_saved_rule_applies_at_once_beside_the_settings(self, client: Client) -> None:
        with frozen_clock(T0):
            assert client.get("/rules/named/").status_code == 200  # no rule yet
            db_rule()
            assert [client.get("/rules/named/").status_code for _ in range(3)] == [200, 200, 429]
        assert set(store.current().rules.by_name) == {"from-settings", "db-rule"}

    def test_disabled_and_deleted_rules_stop_applying(self, client: Client) -> None:
        rule = db_rule(rate="0/m")
        assert client.get("/rules/named/").status_code == 429
        rule.enabled = False
        rule.save()
        assert client.get("/rules/named/").status_code == 200
        rule.enabled = True
        rule.save()
        assert client.get("/rules/named/").status_code == 429
        rule.delete()
        assert client.get("/rules/named/").status_code == 200

    def test_another_process_sees_a_change_through_the_version_counter(
        self, client: Client
    ) -> None:
        store.forget()
        with mock.patch.object(store, "CONFIG_REFRESH", 0):  # every request looks
            assert client.get("/rules/named/").status_code == 200
            loaded = store.current()
            # Another process saved a rule: the row, and its bump of the shared counter, but
            # not this process's own invalidation.
            Rule.objects.bulk_create(
                [Rule(name="elsewhere", path="/rules/named/", key="ip", rate="0/m")]
            )
            assert store.current() is loaded  # no change announced: no query
            versions.version_op(increment=True)
            assert client.get("/rules/named/").status_code == 429

    def test_no_database_query_per_request(
        self, client: Client, django_assert_num_queries: Any
    ) -> None:
        db_rule(rate="100/m")
        client.get("/rules/named/")  # loads the configuration
        with django_assert_num_queries(0):
            for _ in range(5):
                assert client.get("/rules/named/").status_code == 200

    @pytest.mark.parametrize(
        ("fields", "field", "words"),
        [
            ({"rate": "5/M"}, "rate", "Invalid rate '5/M'"),
            ({"key": "cookie:x"}, "key", "cookie:x"),
            ({"path": "no-slash/"}, "path", "starts with '/'"),
            ({"path": "", "url_name": ""}, "path", "needs a 'path' prefix"),
            ({"name": "from-settings"}, "name", "already has a rule of this name"),
            ({"name": "two words"}, "name", "without spaces"),
            ({"burst": "3"}, "burst", "capacity of a leaky bucket"),
            ({"algorithm": "leaky_bucket", "rate": "5/m;10/d"}, "rate", "one leak rate"),
        ],
    )
    def test_invalid_rules_are_form_errors_naming_the_field(
        self, fields: dict[str, Any], field: str, words: str
    ) -> None:
        admin = staff(superuser=True)
        data = {
            "name": "r",
            "enabled": "on",
            "path": "/x/",
            "url_name": "",
            "methods": "",
            "key": "ip",
            "rate": "5/m",
            "count": "all",
            "algorithm": "sliding_window",
            "burst": "",
            "block": "on",
            "fail_open": "on",
            "note": "",
            **fields,
        }
        response = admin.post("/admin/ratelimit_app/rule/add/", data)
        assert response.status_code == 200  # the form again, never a 500
        errors = response.context["adminform"].form.errors
        assert words in " ".join(errors[field])
        assert not Rule.objects.exists()

    def test_a_leaky_bucket_rule(self, client: Client) -> None:
        db_rule(algorithm="leaky_bucket", rate="1/m", burst=2)
        with frozen_clock(T0) as clock:
            assert [client.get("/rules/named/").status_code for _ in range(3)] == [200, 200, 429]
            clock.advance(60)  # one request leaks out per minute
            assert [client.get("/rules/named/").status_code for _ in range(2)] == [200, 429]
            page = staff(superuser=True).post(USAGE, {"rule": "db-rule", "subject": "127.0.0.1"})
        assert "Leaky bucket: level 2.00 of 2" in page.content.decode()

    def test_the_changelist_shows_settings_rules_read_only(self) -> None:
        db_rule()
        page = staff(superuser=True).get("/admin/ratelimit_app/rule/")
        assert page.status_code == 200
        html = page.content.decode()
        assert "db-rule" in html and "from-settings" in html and "9/m" in html
        assert "/admin/ratelimit_app/rule/from-settings" not in html  # not editable

    def test_the_rules_in_force_come_before_the_database_list(self) -> None:
        client = staff(superuser=True)
        html = client.get("/admin/ratelimit_app/rule/").content.decode()
        assert html.index('id="settings-rules"') < html.index('id="no-database-rules"')
        assert 'id="result_list"' not in html and "0 rules" not in html
        db_rule()
        html = client.get("/admin/ratelimit_app/rule/").content.decode()
        assert html.index('id="settings-rules"') < html.index('id="result_list"')
        assert 'id="no-database-rules"' not in html

    def test_filters_only_for_a_list_long_enough_to_filter(self) -> None:
        from ratelimit_app.operators.admin import FILTER_FROM

        client = staff(superuser=True)
        for n in range(FILTER_FROM):
            filters = client.get("/admin/ratelimit_app/rule/").context["cl"].has_filters
            assert not filters, f"filters beside {n} rules"
            db_rule(name=f"rule-{n}")
        assert client.get("/admin/ratelimit_app/rule/").context["cl"].has_filters

    def test_the_form_escapes_help_text_and_puts_the_note_last(self) -> None:
        html = staff(superuser=True).get("/admin/ratelimit_app/rule/add/").content.decode()
        assert "&#x27;email:&lt;field&gt;&#x27;" in html
        assert html.index('id="id_fail_open"') < html.index('id="id_note"')


class TestAccessEntries:
    def test_database_lists_merge_with_the_settings(self, client: Client) -> None:
        AccessEntry.objects.create(list="deny", value="127.0.0.1", note="test")
        assert client.get("/rules/status/200/").status_code == 403
        AccessEntry.objects.all().delete()
        assert client.get("/rules/status/200/").status_code == 200

    def test_expired_entries_do_not_apply(self, client: Client) -> None:
        past = timezone.now() - timedelta(seconds=1)
        soon = timezone.now() + timedelta(hours=1)
        AccessEntry.objects.create(list="deny", value="127.0.0.1", expires=past)
        AccessEntry.objects.create(list="deny", value="192.0.2.1", expires=soon)
        assert client.get("/rules/status/200/").status_code == 200
        assert client.get("/rules/status/200/", REMOTE_ADDR="192.0.2.1").status_code == 403
        assert store.current().expires == pytest.approx(soon.timestamp())

    def test_invalid_entries_are_form_errors(self) -> None:
        admin = staff(superuser=True)
        data = {"list": "deny", "value": "10.0.0.0/33", "note": "", "expires": ""}
        response = admin.post("/admin/ratelimit_app/accessentry/add/", data)
        assert response.status_code == 200
        assert "10.0.0.0/33" in " ".join(response.context["adminform"].form.errors["value"])


class TestUsagePage:
    def hit(self, client: Client, n: int) -> list[int]:
        return [client.get("/rules/named/").status_code for _ in range(n)]

    def test_lookup_and_reset(self, client: Client) -> None:
        db_rule()
        admin = staff("view_rule", "reset_counters")
        with frozen_clock(T0):
            assert self.hit(client, 3) == [200, 200, 429]
            page = admin.post(USAGE, {"rule": "db-rule", "subject": "127.0.0.1", "lookup": "1"})
            assert page.status_code == 200
            usage = page.context["usage"]
            assert usage["count"] == 2 and usage["should_limit"]
            assert "127.0.0.1 under rule db-rule" in page.content.decode()
            done = admin.post(USAGE, {"rule": "db-rule", "subject": "127.0.0.1", "reset": "1"})
            assert done.context["usage"]["count"] == 0
            assert self.hit(client, 1) == [200]
        entry = LogEntry.objects.get()
        assert entry.object_repr == "db-rule" and "127.0.0.1" in entry.change_message

    def test_settings_rules_can_be_looked_up_too(self) -> None:
        admin = staff(superuser=True)
        page = admin.post(USAGE, {"rule": "from-settings", "subject": "192.0.2.9"})
        assert page.context["usage"]["count"] == 0
        assert page.context["usage"]["limit"] == 9

    def test_bad_subjects_are_form_errors(self) -> None:
        admin = staff(superuser=True)
        page = admin.post(USAGE, {"rule": "from-settings", "subject": "not-an-ip"})
        assert page.status_code == 200 and page.context["usage"] is None
        assert page.context["form"].errors["subject"]
        unknown = admin.post(USAGE, {"rule": "nope", "subject": "192.0.2.9"})
        assert unknown.context["form"].errors["rule"]

    def test_reset_needs_its_permission(self, client: Client) -> None:
        db_rule()
        viewer = staff("view_rule")
        self.hit(client, 2)
        page = viewer.post(USAGE, {"rule": "db-rule", "subject": "127.0.0.1"})
        assert page.status_code == 200 and b"Reset counters" not in page.content
        refused = viewer.post(USAGE, {"rule": "db-rule", "subject": "127.0.0.1", "reset": "1"})
        assert refused.status_code == 403
        assert core.lookup("db-rule", "127.0.0.1")["count"] == 2  # type: ignore[index]
        assert not LogEntry.objects.exists()


PAGES = [
    "/admin/ratelimit_app/rule/",
    "/admin/ratelimit_app/rule/add/",
    "/admin/ratelimit_app/accessentry/",
    USAGE,
]


@pytest.mark.parametrize("url", PAGES)
def test_pages_need_staff_and_permission(url: str) -> None:
    db_rule(name="secret-rule")
    AccessEntry.objects.create(list="allow", value="203.0.113.77")
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    user = User.objects.create_user("plain", password="pw")
    plain = Client()
    plain.force_login(user)
    assert plain.get(url).status_code == 302
    bare_staff = staff()
    refused = bare_staff.get(url)
    assert refused.status_code == 403
    for response in (anonymous, refused):
        assert b"secret-rule" not in response.content and b"203.0.113.77" not in response.content
    allowed = staff(superuser=True).get(url)
    assert allowed.status_code == 200


def test_limited_requests_become_a_metrics_series(client: Client) -> None:
    import metrics_app
    from metrics_app.models import Series

    metrics_app.flush()  # what earlier tests left in this process's buffer
    db_rule(name="metered", rate="1/m")
    with frozen_clock(T0):
        assert [client.get("/rules/named/").status_code for _ in range(4)] == [200, 429, 429, 429]
    metrics_app.flush()
    assert Series.objects.get(name="ratelimit:metered").total == 3


def test_a_rule_with_several_mistakes_shows_each_under_its_field() -> None:
    """The admin's form shows every mistake of a rule at once (the system checks do too)."""
    rule = Rule(name="bad", path="", key="os.system", rate="ten/m")
    with pytest.raises(ValidationError) as caught:
        rule.full_clean()
    errors = caught.value.message_dict
    assert {"key", "rate"} <= set(errors), errors
    assert any(
        "path" in message or "url_name" in message
        for message in errors.get("__all__", errors.get("path", []))
    )
