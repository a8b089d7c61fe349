"""Refused lately (issue 27): who each limit refused, what the page shows of them, and the
charts of decorator limits' refusals. Driven through real requests (the ``ratelimited``
signal's receiver in :mod:`ratelimit_app.operators.metrics`) and the admin page."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import caches
from django.test import Client, RequestFactory, override_settings

import metrics_app
from metrics_app import buffer
from metrics_app.models import Series, TopKey
from metrics_app.testing import frozen_clock
from metrics_app.topk import CAPACITY
from ratelimit_app import store
from ratelimit_app.operators import metrics

pytestmark = pytest.mark.django_db

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "ratelimit_app.middleware.RatelimitMiddleware",
]
RULES = [
    {"name": "by-ip", "path": "/rules/unnamed/", "key": "ip", "rate": "2/m"},
    {"name": "by-email", "path": "/rules/named/", "key": "email", "rate": "0/m"},
    {"name": "by-user", "path": "/rules/async/", "key": "user", "rate": "0/m"},
]
PAGE = "/admin/ratelimit_app/rule/refused/"
USAGE = "/admin/ratelimit_app/rule/usage/"
GROUP = "tests.ratelimit.views.blocking"  # @ratelimit(key="ip", rate="3/m") on /blocking/
T0 = 1_800_000_000.0


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    buffer.reset()
    with override_settings(
        ROOT_URLCONF="tests.ratelimit.urls",
        MIDDLEWARE=MIDDLEWARE,
        RATELIMIT_RULES=RULES,
    ):
        store.forget()
        caches["default"].clear()
        yield
    store.forget()
    buffer.reset()


def refused(limit: str) -> dict[str, TopKey]:
    metrics_app.flush()
    return {r.label or r.key: r for r in TopKey.objects.filter(name=f"ratelimit:{limit}")}


def hit(client: Client, url: str, n: int, **extra: str) -> list[int]:
    return [client.get(url, **extra).status_code for _ in range(n)]  # type: ignore[arg-type]


def staff(*perms: str) -> Client:
    user = User.objects.create_user("staff-" + "-".join(perms), password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


# -- what is kept of a subject ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "address", "label", "ref"),
    [
        ("masked", "203.0.113.9", "203.0.113.0/24", ""),
        ("masked", "::ffff:203.0.113.9", "203.0.113.0/24", ""),  # IPv4-mapped: as IPv4
        ("masked", "2001:db8::1", "2001:db8::/64", "2001:db8::"),  # the key keeps a /64
        ("full", "203.0.113.9", "203.0.113.9", "203.0.113.9"),
        ("full", "::ffff:203.0.113.9", "203.0.113.9", "203.0.113.9"),
        ("hashed", "203.0.113.9", "", ""),
        ("bogus", "203.0.113.9", "", ""),  # a mistake shows the least
    ],
)
def test_an_address_is_kept_as_the_setting_allows(
    client: Client, mode: str, address: str, label: str, ref: str
) -> None:
    with override_settings(RATELIMIT_REFUSED_SUBJECTS=mode):
        assert hit(client, "/rules/unnamed/", 3, REMOTE_ADDR=address) == [200, 200, 429]
    (row,) = refused("by-ip").values()
    assert (row.label, row.ref, row.count) == (label, ref, 1)
    assert row.key.startswith("{") and address not in row.key  # the hashed namespace


def test_the_refused_subject_is_not_read_again_from_the_request(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine hands the receiver the subject it checked, while it signals: the key is
    not read a second time (a crowd's every 429 paid for it), and what is kept is the same."""

    def no_second_reading(*args: object) -> None:
        raise AssertionError("the refused subject's key was read again")

    monkeypatch.setattr(metrics, "limit_key", no_second_reading)
    with override_settings(RATELIMIT_REFUSED_SUBJECTS="masked"):
        assert hit(client, "/rules/unnamed/", 3, REMOTE_ADDR="203.0.113.9") == [200, 200, 429]
        assert client.post("/rules/named/", {"email": "Foo@Example.com"}).status_code == 429
    assert refused("by-ip")["203.0.113.0/24"].count == 1
    assert list(refused("by-email")) == ["…@example.com"]


@pytest.mark.parametrize(
    ("mode", "email", "label", "ref"),
    [
        ("masked", " Foo@Example.COM ", "…@example.com", ""),
        ("full", " Foo@Example.COM\u200b", "foo@example.com", "foo@example.com"),
        ("masked", "x" * 5000 + "@example.com", "", ""),  # too long: kept as a hash of itself
        ("hashed", "foo@example.com", "", ""),
    ],
)
def test_an_email_is_kept_as_the_setting_allows(
    client: Client, mode: str, email: str, label: str, ref: str
) -> None:
    with override_settings(RATELIMIT_REFUSED_SUBJECTS=mode):
        assert client.post("/rules/named/", {"email": email}).status_code == 429
    (row,) = refused("by-email").values()
    assert (row.label, row.ref) == (label, ref)


def test_an_email_that_is_no_text_is_never_shown_masked(client: Client) -> None:
    body = json.dumps({"email": "\ud800@example.com"})  # a lone surrogate
    assert client.post("/rules/named/", body, content_type="application/json").status_code == 429
    (row,) = refused("by-email").values()
    assert (row.label, row.ref) == ("", "")


@pytest.mark.parametrize("mode", ["masked", "full"])
def test_a_user_is_shown_by_name_and_acted_on_by_id(client: Client, mode: str) -> None:
    user = User.objects.create_user("alice", password="pw")
    client.force_login(user)
    with override_settings(RATELIMIT_REFUSED_SUBJECTS=mode):
        assert client.get("/rules/async/").status_code == 429
    (row,) = refused("by-user").values()
    assert (row.label, row.ref) == ("alice", str(user.pk))


def test_dry_runs_are_not_listed_but_charted_apart(client: Client) -> None:
    dry = {"name": "dry", "path": "/rules/unnamed/", "key": "ip", "rate": "2/m", "shadow": True}
    with override_settings(RATELIMIT_RULES=[dry]):
        store.forget()
        assert hit(client, "/rules/unnamed/", 5) == [200] * 5
    assert refused("dry") == {}
    assert Series.objects.get(name="ratelimit-shadow:dry").total == 3


def test_a_decorator_limit_s_refusals_are_charted_and_listed(client: Client) -> None:
    assert hit(client, "/blocking/", 5) == [200, 200, 200, 429, 429]
    assert refused(GROUP)["127.0.0.0/24"].count == 2
    assert Series.objects.get(name=f"ratelimit:{GROUP}").total == 2
    # The usage lookup of the group links to that chart.
    admin = staff("view_rule", "view_series")
    page = admin.post(USAGE, {"rule": GROUP, "subject": "127.0.0.1"})
    assert page.status_code == 200
    assert (
        page.context["chart"]
        == f"/admin/metrics_app/series/{Series.objects.get(name=f'ratelimit:{GROUP}').pk}/change/"
    )


def test_rows_are_kept_a_week_after_the_last_refusal(client: Client) -> None:
    hit(client, "/rules/unnamed/", 3)
    (row,) = refused("by-ip").values()
    assert row.expires - row.last_seen == timedelta(days=metrics.RETENTION_DAYS) == timedelta(7)


# -- the page --------------------------------------------------------------------------------


def test_the_page_shows_counts_first_and_last_and_acts_through_the_usage_page(
    client: Client,
) -> None:
    with override_settings(RATELIMIT_REFUSED_SUBJECTS="full"):
        with frozen_clock(T0 - 7200):  # two hours ago: in the day, not the hour
            hit(client, "/rules/unnamed/", 4, REMOTE_ADDR="203.0.113.9")
        metrics_app.flush()
        with frozen_clock(T0):  # (the counters' clock is the real one: still refused)
            hit(client, "/rules/unnamed/", 1, REMOTE_ADDR="203.0.113.9")
            hit(client, "/rules/unnamed/", 4, REMOTE_ADDR="198.51.100.7")
            metrics_app.flush()
            admin = staff("view_rule", "reset_counters", "view_ban")
            page = admin.get(PAGE)
    assert page.status_code == 200
    (limit,) = page.context["limits"]
    assert limit.limit == "by-ip"
    rows = [(s.label, s.hour, s.day) for s in limit.subjects]
    assert rows == [("203.0.113.9", 1, 3), ("198.51.100.7", 2, 2)]
    first = limit.subjects[0]
    assert (first.first.timestamp(), first.last.timestamp()) == (T0 - 7200, T0)
    html = page.content.decode()
    assert f'action="{USAGE}"' in html
    assert 'name="subject" value="203.0.113.9"' in html
    assert 'name="reset"' in html
    assert "/admin/ratelimit_app/ban/?limit__exact=by-ip&amp;q=203.0.113.9" in html
    # What the reset button posts resets the subject.
    assert client.get("/rules/unnamed/", REMOTE_ADDR="198.51.100.7").status_code == 429
    done = admin.post(USAGE, {"rule": "by-ip", "subject": "198.51.100.7", "reset": "1"})
    assert done.status_code == 200
    assert client.get("/rules/unnamed/", REMOTE_ADDR="198.51.100.7").status_code == 200


def test_a_hidden_subject_links_to_the_lookup_and_no_reset_without_the_permission(
    client: Client,
) -> None:
    hit(client, "/rules/unnamed/", 3, REMOTE_ADDR="203.0.113.9")
    metrics_app.flush()
    html = staff("view_rule").get(PAGE).content.decode()
    assert "203.0.113.0/24" in html and "203.0.113.9" not in html
    assert f'<a href="{USAGE}"' in html
    assert 'name="reset"' not in html and "/ban/" not in html


def test_the_page_needs_the_rules_view_permission() -> None:
    assert staff().get(PAGE).status_code == 403  # staff without ratelimit_app.view_rule
    viewer = staff("view_rule")
    assert viewer.get(PAGE).status_code == 200
    assert viewer.post(PAGE, {}).status_code == 200  # read-only: a post changes nothing


def test_a_bad_subjects_setting_is_said_on_the_page(client: Client) -> None:
    with override_settings(RATELIMIT_REFUSED_SUBJECTS=["full"]):
        hit(client, "/rules/unnamed/", 3)
        metrics_app.flush()
        page = staff("view_rule").get(PAGE)
    assert page.status_code == 200
    assert "RATELIMIT_REFUSED_SUBJECTS is [&#x27;full&#x27;]" in page.content.decode()
    assert page.context["limits"][0].subjects[0].label == ""


def test_nothing_refused_says_so() -> None:
    page = staff("view_rule").get(PAGE)
    assert "No subject was refused in the last day." in page.content.decode()


# -- the bound ---------------------------------------------------------------------------------


def test_a_flood_of_100000_distinct_subjects_stays_within_the_bounds() -> None:
    """Through the receiver, as the ``ratelimited`` signal calls it, flushed every 10,000."""
    factory = RequestFactory()
    tops = buffer.current().tops
    with frozen_clock(T0):
        for i in range(100_000):
            request = factory.get(
                "/rules/unnamed/", REMOTE_ADDR=f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}"
            )
            metrics._remember(
                None, group="g", subject=f"{{{i:032x}}}", request=request, rule="by-ip"
            )
            if i % 10_000 == 9_999:
                assert tops.size() <= CAPACITY
                metrics_app.flush()
    assert TopKey.objects.filter(name="ratelimit:by-ip").count() <= CAPACITY
    assert TopKey.objects.count() <= CAPACITY


ATTACKER = "203.0.113.66"


def flood(order: str, one_offs: int, refusals: int = 20, first: int = 0) -> list[str]:
    """The addresses refused, in order: ``refusals`` of :data:`ATTACKER` and ``one_offs``
    others refused once each (numbered from ``first``), the attacker first, after the flood,
    or spread evenly through it."""
    crowd = [f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}" for i in range(first, first + one_offs)]
    if order == "attacker first":
        return [ATTACKER] * refusals + crowd
    if order == "flood first":
        return crowd + [ATTACKER] * refusals
    step = one_offs // refusals
    stream = []
    for i in range(refusals):
        stream += [*crowd[i * step : (i + 1) * step], ATTACKER]
    return stream + crowd[refusals * step :]


def refuse_all(addresses: list[str]) -> None:
    """Refuse each address once under ``by-ip``, as the ``ratelimited`` signal does."""
    factory = RequestFactory()
    for address in addresses:
        request = factory.get("/rules/unnamed/", REMOTE_ADDR=address)
        metrics._remember(
            None, group="g", subject="{" + address + "}", request=request, rule="by-ip"
        )


def shown_subjects() -> list[tuple[str, int, int]]:
    """``(key, last hour, last day)`` of each ``by-ip`` subject the page lists, in order."""
    page = staff("view_rule").get(PAGE)
    (limit,) = page.context["limits"]
    return [(s.key, s.hour, s.day) for s in limit.subjects]


@pytest.mark.parametrize("order", ["attacker first", "flood first", "interleaved"])
def test_a_subject_refused_20_times_is_listed_through_2500_refused_once(order: str) -> None:
    """Issue 35: plain space-saving lost the attacker among 2,500 subjects refused once in
    one flush, and listed 25 of them as refused 26 times. Counts are now never above the
    truth, and the attacker comes first (its first refusal is forgotten when it is spread
    thinner than the sketch's 100 places: only its return is certain)."""
    stream = flood(order, 2500)
    with override_settings(RATELIMIT_REFUSED_SUBJECTS="full"), frozen_clock(T0):
        refuse_all(stream)
        metrics_app.flush()
        listed = shown_subjects()
    true = Counter("{" + address + "}" for address in stream)
    key, hour, day = listed[0]
    assert key == "{" + ATTACKER + "}"
    assert hour == day and (19 if order == "interleaved" else 20) <= day <= 20
    assert all(day <= true[key] for key, _, day in listed)
    assert [day for _, _, day in listed[1:]] == [1] * (len(listed) - 1)


def test_the_attacker_stays_first_across_flushes_of_one_offs() -> None:
    """Four flushes, each 5 refusals of the attacker among 625 subjects refused once: the
    page adds up each flush's certain counts (16 to 20), and the table's bound (100 rows a
    limit and bucket) keeps the attacker."""
    stream: list[str] = []
    with override_settings(RATELIMIT_REFUSED_SUBJECTS="full"), frozen_clock(T0):
        for flush in range(4):
            part = flood("interleaved", 625, refusals=5, first=flush * 625)
            stream += part
            refuse_all(part)
            metrics_app.flush()
        listed = shown_subjects()
    true = Counter("{" + address + "}" for address in stream)
    key, _, day = listed[0]
    assert key == "{" + ATTACKER + "}" and 16 <= day <= 20
    assert all(day <= true[key] for key, _, day in listed)
    assert TopKey.objects.filter(name="ratelimit:by-ip").count() <= CAPACITY


def test_a_subject_is_banned_from_the_page(client: Client) -> None:
    """The page's *ban 1 h* button: the subject's requests to that limit are refused for
    an hour (a limit without a ban of its own too), and a reset lifts it."""
    from ratelimit_app.models import Ban

    with override_settings(RATELIMIT_REFUSED_SUBJECTS="full"):
        hit(client, "/rules/unnamed/", 3, REMOTE_ADDR="203.0.113.66")
        metrics_app.flush()
        admin = staff("view_rule", "add_ban", "reset_counters")
        html = admin.get(PAGE).content.decode()
        assert "ban 1 h" in html
        done = admin.post(
            "/admin/ratelimit_app/rule/ban/",
            {"rule": "by-ip", "subject": "203.0.113.66", "hours": "1"},
            follow=True,
        )
    assert "Banned 203.0.113.66 from by-ip until" in done.content.decode()
    ban = Ban.objects.get()
    assert (ban.limit, ban.label, ban.seconds) == ("by-ip", "203.0.113.66", 3600)
    refused_now = client.get("/rules/unnamed/", REMOTE_ADDR="203.0.113.66")
    assert refused_now.status_code == 429 and int(refused_now["Retry-After"]) > 3000
    assert staff("view_rule").post("/admin/ratelimit_app/rule/ban/", {}).status_code == 403
