"""Every limit found by the name people know it by: ``ratelimit_usage``, ``ratelimit_reset``,
the operations and the admin's usage lookup find a ``@ratelimit`` view by its URL name, URL
path, dotted path or group, and DRF scopes, and say what a name could have meant when it
stands for nothing, never a silent 0.

The counters are written by real requests through the Django test client and the URLconf of
this module; the main cases run on local memory, real memcached and real Redis.
"""

from __future__ import annotations

import io
import json
import types
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import include, path
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.cache import never_cache

from ratelimit_app import decorators, store
from ratelimit_app.config import sources, views
from ratelimit_app.decorators import ratelimit
from ratelimit_app.management.commands import ratelimit_usage
from ratelimit_app.operators import operations
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.views import ClassDecorated, MethodDecorated, PlainMethod

T0 = 1_800_000_000.0
HERE = __name__
VIEWS = "tests.ratelimit.views"


@ratelimit(key="ip", rate="5/m")
def hello(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(group="api", key="ip", rate="3/m")
def send(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(group="api", key="ip", rate="3/m")
def send_again(request: HttpRequest) -> HttpResponse:
    """Another view of group ``api``: the same counters, one limit."""
    return HttpResponse("ok")


@ratelimit(key="ip", rate="2/m")
@ratelimit(key="user_or_ip", rate="10/h")
def stacked(request: HttpRequest) -> HttpResponse:
    """Two limits under the one default group."""
    return HttpResponse("ok")


@ratelimit(group="mixed-ip", key="ip", rate="2/m")
@ratelimit(group="mixed-user", key="user", rate="10/h")
def mixed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def per_request(group: str, request: HttpRequest | None) -> str:
    return "4/m"


@ratelimit(key="ip", rate=per_request)
def dynamic(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(key="ip", rate="2/m")
async def async_hello(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@never_cache
@ratelimit(key="ip", rate="2/m")
def wrapped_again(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@method_decorator(ratelimit(key="ip", rate="2/m"), name="dispatch")
class DispatchDecorated(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


class Inherits(ClassDecorated):
    """Counted under its parent's group: the parent's wrapped ``dispatch`` runs."""


class Plain(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("admin/", admin.site.urls),
    path("hello/", hello, name="hello"),
    path("users/<int:pk>/", hello, name="user"),
    path("accounts/", include(([path("send/", send, name="send")], "accounts"))),
    path("send-again/", send_again),
    path("stacked/", stacked, name="stacked"),
    path("mixed/", mixed, name="mixed"),
    path("dynamic/", dynamic, name="dynamic"),
    path("async/", async_hello, name="async"),
    path("never-cache/", wrapped_again, name="never-cache"),
    path("cbv/method/", MethodDecorated.as_view(), name="cbv-method"),
    path("cbv/dispatch/", DispatchDecorated.as_view(), name="cbv-dispatch"),
    path("cbv/class/", ClassDecorated.as_view(), name="cbv-class"),
    path("cbv/inherits/", Inherits.as_view(), name="cbv-inherits"),
    path("cbv/plain/", PlainMethod.as_view(), name="cbv-plain"),
    path("cbv/wrapped/", ratelimit(key="ip", rate="2/m")(Plain.as_view()), name="cbv-wrapped"),
    path("plain/", plain, name="plain"),
]

RULES: list[dict[str, Any]] = [{"name": "api-ip", "path": "/plain/", "key": "ip", "rate": "3/m"}]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "ratelimit_app.middleware.RatelimitMiddleware",
]


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    with override_settings(ROOT_URLCONF=HERE, MIDDLEWARE=MIDDLEWARE, RATELIMIT_RULES=RULES):
        store.forget()
        caches["default"].clear()  # the counters of other tests
        forget_refusals()
        yield
    store.forget()


@pytest.fixture
def counters(backend_kind: str) -> str:
    """Local memory, real memcached and real Redis, fresh."""
    forget_refusals()
    return backend_kind


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def count(name: str, subject: str) -> int:
    usage: dict[str, Any] = json.loads(run("ratelimit_usage", name, subject, "--json"))
    return int(usage["count"])


def hits(url: str, ip: str, n: int) -> list[int]:
    client = Client()
    return [client.get(url, REMOTE_ADDR=ip).status_code for _ in range(n)]


# -- the example --------------------------------------------------------------------


def test_a_view_is_found_by_its_url_name_not_a_silent_zero(counters: str) -> None:
    with frozen_clock(T0):
        assert hits("/hello/", "192.0.2.10", 2) == [200, 200]
        output = run("ratelimit_usage", "hello", "192.0.2.10")
    assert output == (
        f"Group {HERE}.hello (key ip; @ratelimit on hello), subject 192.0.2.10:\n"
        "rate  count  limit  remaining  reset (s)  state\n"
        "5/m       2      5          3         61  ok\n"
        "Not limited: 3 more admitted now (5/m).\n"
    )


def test_reset_by_url_name_admits_again(counters: str) -> None:
    with frozen_clock(T0):
        assert hits("/hello/", "192.0.2.11", 6) == [200] * 5 + [429]
        assert run("ratelimit_reset", "hello", "192.0.2.11") == (
            f"Reset 192.0.2.11 for group {HERE}.hello.\n"
        )
        assert count("hello", "192.0.2.11") == 0
        assert hits("/hello/", "192.0.2.11", 1) == [200]


# -- every name of a limit ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "url", "group"),
    [
        ("hello", "/hello/", f"{HERE}.hello"),
        ("/hello/", "/hello/", f"{HERE}.hello"),
        (f"{HERE}.hello", "/hello/", f"{HERE}.hello"),
        ("  hello  ", "/hello/", f"{HERE}.hello"),
        ("/users/7/", "/users/7/", f"{HERE}.hello"),
        ("user", "/users/7/", f"{HERE}.hello"),
        ("https://testserver/hello/?next=/x/", "/hello/", f"{HERE}.hello"),
        ("/h%65llo/", "/hello/", f"{HERE}.hello"),
        ("accounts:send", "/accounts/send/", "api"),
        ("/accounts/send/", "/accounts/send/", "api"),
        ("api", "/send-again/", "api"),
        (f"{HERE}.send_again", "/accounts/send/", "api"),
        ("async", "/async/", f"{HERE}.async_hello"),
        ("never-cache", "/never-cache/", f"{HERE}.wrapped_again"),
        ("cbv-method", "/cbv/method/", f"{VIEWS}.MethodDecorated.MethodDecorated.get"),
        (
            "cbv-dispatch",
            "/cbv/dispatch/",
            "django.views.generic.base.DispatchDecorated.View.dispatch",
        ),
        ("cbv-class", "/cbv/class/", f"{VIEWS}.ClassDecorated"),
        (f"{VIEWS}.ClassDecorated", "/cbv/class/", f"{VIEWS}.ClassDecorated"),
        ("cbv-inherits", "/cbv/inherits/", f"{VIEWS}.ClassDecorated"),
        ("cbv-plain", "/cbv/plain/", f"{VIEWS}.PlainMethod.get"),
        ("cbv-wrapped", "/cbv/wrapped/", f"{HERE}.View.as_view.<locals>.view"),
    ],
)
def test_every_name_finds_the_counters_requests_wrote(name: str, url: str, group: str) -> None:
    """The group found is the one the requests counted under (a wrong group reads 0)."""
    (found,) = operations.find_limits(name)
    assert found.kind == "group" and found.name == group
    with frozen_clock(T0):
        assert hits(url, "192.0.2.12", 1) == [200]
        assert count(name, "192.0.2.12") == 1
        run("ratelimit_reset", name, "192.0.2.12")
        assert count(name, "192.0.2.12") == 0


def test_the_decorator_leaves_its_guards_on_the_view_stacked_ones_adding_up() -> None:
    assert [g.limit.group for g in stacked.ratelimit_limits] == [f"{HERE}.stacked"] * 2  # type: ignore[attr-defined]
    assert [g.limit.rate for g in mixed.ratelimit_limits] == ["10/h", "2/m"]  # type: ignore[attr-defined]
    assert [v.label for v in views.routed()][:3] == ["hello", "user", "accounts:send"]


def test_a_rule_name_and_a_drf_scope_are_found_as_before(counters: str) -> None:
    with frozen_clock(T0):
        assert hits("/plain/", "192.0.2.13", 2) == [200, 200]
        assert count("api-ip", "192.0.2.13") == 2
    assert [n.kind for n in operations.find_limits("api-ip")] == ["rule"]


@pytest.mark.usefixtures("counters")
def test_a_drf_scope_is_found_by_the_commands() -> None:
    from rest_framework.response import Response
    from rest_framework.settings import api_settings
    from rest_framework.test import APIRequestFactory
    from rest_framework.views import APIView

    from ratelimit_app.throttling import ScopedRateThrottle

    class Api(APIView):
        throttle_classes = [ScopedRateThrottle]
        throttle_scope = "every-limit"

        def get(self, request: Any) -> Response:
            return Response({"ok": True})

    view = Api.as_view()
    with override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"every-limit": "3/m"}}):
        api_settings.reload()
        try:
            with frozen_clock(T0):
                for _ in range(2):
                    view(APIRequestFactory().get("/api/", REMOTE_ADDR="192.0.2.14"))
                output = run("ratelimit_usage", "drf:every-limit", "192.0.2.14")
                assert output.startswith("Throttle drf:every-limit (key ")
                assert count("drf:every-limit", "192.0.2.14") == 2
                run("ratelimit_reset", "drf:every-limit", "192.0.2.14")
                assert count("drf:every-limit", "192.0.2.14") == 0
        finally:
            api_settings.reload()


# -- a name for several limits --------------------------------------------------------------


def test_a_view_with_two_limits_shows_and_resets_each(counters: str) -> None:
    with frozen_clock(T0):
        assert hits("/stacked/", "192.0.2.15", 2) == [200, 200]
        output = run("ratelimit_usage", "stacked", "192.0.2.15")
        assert output.count(f"Group {HERE}.stacked (key ") == 2
        assert "2/m       2      2" in output and "10/h      2     10" in output
        listed = json.loads(run("ratelimit_usage", "/stacked/", "192.0.2.15", "--json"))
        assert [(u["name"], u["rate"], u["count"]) for u in listed] == [
            (f"{HERE}.stacked", "10/h", 2),
            (f"{HERE}.stacked", "2/m", 2),
        ]
        assert run("ratelimit_reset", "stacked", "192.0.2.15").count("Reset 192.0.2.15") == 2
        assert [
            u["count"]
            for u in json.loads(run("ratelimit_usage", "stacked", "192.0.2.15", "--json"))
        ] == [0, 0]
    with pytest.raises(ValueError, match=r"names 2 limits .*key ip, 2/m.*give its key and rate"):
        operations.find_limit("stacked")


def test_limits_a_subject_cannot_be_counted_by_are_skipped_and_said() -> None:
    output = run("ratelimit_reset", "mixed", "alice")
    assert "Reset alice for group mixed-user." in output
    assert "Skipped group mixed-ip: 'alice' is not an IP address" in output
    with pytest.raises(CommandError, match=r"mixed-user: .*Skipped group mixed-ip: .*not an IP"):
        run("ratelimit_usage", "mixed", "\x00\u200b")
    assert operations.find_limit("mixed-ip").kind == "ip"  # each group alone


def test_views_of_one_group_are_one_limit() -> None:
    (found,) = operations.find_limits("api")
    assert found.limit.static_rates is not None and str(found.limit.static_rates[0]) == "3/m"


# -- names that stand for nothing -----------------------------------------------------------


@pytest.mark.parametrize("command", ["ratelimit_usage", "ratelimit_reset"])
def test_an_unknown_name_lists_what_it_could_have_meant(command: str) -> None:
    with pytest.raises(CommandError) as caught:
        run(command, "helo", "192.0.2.16")
    message = str(caught.value)
    assert message.startswith("No rule named 'helo'. Configured rules: api-ip.")
    assert "Views with @ratelimit: hello, user, accounts:send, /send-again/, stacked" in message
    assert "Did you mean 'hello'?" in message
    assert "pass --key and --rate" in message


@pytest.mark.parametrize(
    "name",
    [
        "/nope/",  # no view there
        "/plain/",  # a view without @ratelimit
        "plain",
        "",
        "   ",
        "hello\x00",
        "\udcff",
        "h" * 10_000,
        "/" + "a" * 5000,
        "http://[::1",  # no URL at all
    ],
)
def test_hostile_names_are_errors_never_zero(name: str) -> None:
    with pytest.raises(CommandError, match=r"^No rule named ") as caught:
        run("ratelimit_usage", name, "192.0.2.17")
    assert len(str(caught.value)) < 2000
    with pytest.raises(operations.UnknownLimit):
        operations.lookup(name, "192.0.2.17")


def test_the_command_line_exits_non_zero() -> None:
    command = ratelimit_usage.Command()
    with pytest.raises(SystemExit) as exit_info:
        command.run_from_argv(["manage.py", "ratelimit_usage", "helo", "192.0.2.18"])
    assert exit_info.value.code == 1


def test_a_urlconf_that_cannot_load_is_named_and_rules_still_work() -> None:
    with override_settings(ROOT_URLCONF="tests.ratelimit.no_such_urls"):
        with pytest.raises(CommandError, match=r"'hello': the URLconf could not be loaded"):
            run("ratelimit_usage", "hello", "192.0.2.19")
        assert count("api-ip", "192.0.2.19") == 0
        assert "Views with @ratelimit" not in operations.unknown("nope")


# -- limits that cannot be looked up without a request --------------------------------------


def test_a_rate_from_the_request_says_so_and_takes_rate(counters: str) -> None:
    with pytest.raises(CommandError, match=r"has a rate that depends on the request .*--rate"):
        run("ratelimit_usage", "dynamic", "192.0.2.20")
    with pytest.raises(ValueError, match="depends on the request"):
        operations.lookup("dynamic", "192.0.2.20")
    with frozen_clock(T0):
        assert hits("/dynamic/", "192.0.2.20", 2) == [200, 200]
        usage = json.loads(
            run("ratelimit_usage", "dynamic", "192.0.2.20", "--json", "--rate", "4/m")
        )
        assert (usage["count"], usage["limit"]) == (2, 4)


def test_a_decorator_without_a_limit_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decorators, "registry", {})  # what the system checks would report

    @ratelimit(key="ip")
    def unlimited(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    @ratelimit(key="nonsense", rate="5/m")
    def broken(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    conf = types.ModuleType("every_limit_urls")
    conf.urlpatterns = [  # type: ignore[attr-defined]
        path("unlimited/", unlimited),
        path("broken/", broken, name="broken"),
    ]
    with override_settings(ROOT_URLCONF=conf):
        with pytest.raises(CommandError, match=r"has no rate: it limits nothing"):
            run("ratelimit_usage", "/unlimited/", "192.0.2.21")
        with pytest.raises(CommandError, match=r"@ratelimit on .*broken: .*'nonsense'"):
            run("ratelimit_reset", "broken", "192.0.2.21")
        assert [n.name for n in operations.named_limits()] == ["api-ip"]


# -- subjects -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "typed"),
    [
        ("192.0.2.22", "::ffff:192.0.2.22"),
        ("192.0.2.23", " 192.0.2.23 "),
        ("2001:db8::1", "2001:db8::ffff"),  # the same /64
        ("2001:db8:1::2", "2001:DB8:1:0::2"),
    ],
)
def test_an_ip_is_typed_as_people_type_it(sent: str, typed: str) -> None:
    with frozen_clock(T0):
        assert hits("/hello/", sent, 2) == [200, 200]
        assert count("hello", typed) == 2


def test_a_subject_that_is_no_ip_is_an_error() -> None:
    with pytest.raises(CommandError, match=r"'alice' is not an IP address, and group .*hello"):
        run("ratelimit_usage", "hello", "alice")


# -- the list of limits, and the admin ------------------------------------------------------


def test_named_limits_lists_rules_scopes_and_groups_once() -> None:
    found = {n.name: n for n in operations.named_limits()}
    assert found["api-ip"].kind == "rule"
    assert found["api"].describe() == "api — @ratelimit on accounts:send, key ip, 3/m"
    assert found[f"{HERE}.dynamic"].describe().endswith("key ip, callable")
    assert list(found).count(f"{HERE}.stacked") == 1


@pytest.mark.django_db
class TestAdmin:
    USAGE = "/admin/ratelimit_app/rule/usage/"

    @pytest.fixture
    def staff(self) -> Client:
        user = User.objects.create_superuser("boss", password="pw")
        client = Client()
        client.force_login(user)
        return client

    def test_an_unknown_name_is_a_form_error(self, staff: Client) -> None:
        page = staff.post(self.USAGE, {"rule": "helo", "subject": "192.0.2.24"})
        assert page.status_code == 200 and page.context["usage"] is None
        assert page.context["form"].errors["rule"]

    def test_a_rule_is_still_found(self, staff: Client) -> None:
        page = staff.post(self.USAGE, {"rule": "api-ip", "subject": "192.0.2.24"})
        assert page.context["usage"]["count"] == 0

    def test_a_decorator_group_is_found(self, staff: Client) -> None:
        with frozen_clock(T0):
            assert hits("/hello/", "192.0.2.25", 2) == [200, 200]
            page = staff.post(self.USAGE, {"rule": f"{HERE}.hello", "subject": "192.0.2.25"})
        assert page.context["usage"]["count"] == 2


def test_a_scope_whose_throttles_the_urlconf_imports_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a fresh ``manage.py`` process our throttles register when the views import them."""
    monkeypatch.setattr(sources, "_sources", {})
    limit = operations.find_limit("lazy-scope", key="ip", rate="5/m")

    class Urls(types.ModuleType):
        @property
        def urlpatterns(self) -> list[Any]:
            sources.register("lazy", kind="test", limits=lambda: {"lazy:x": limit}, problems=list)
            return [path("hello/", hello, name="hello")]

    with override_settings(ROOT_URLCONF=Urls("lazy_urls")):
        assert operations.find_limit("lazy:x") is limit


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("group", "words"),
    [(f"{HERE}.dynamic", "depends on the request"), (f"{HERE}.stacked", "names 2 limits")],
)
def test_the_admin_says_why_a_group_cannot_be_looked_up(group: str, words: str) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("boss", password="pw"))
    page = client.post(TestAdmin.USAGE, {"rule": group, "subject": "192.0.2.26"})
    assert page.context["usage"] is None
    assert words in str(page.context["form"].errors)
