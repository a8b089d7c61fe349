"""``RATELIMIT_BACKEND`` and the cache a backend is chosen from: configuration mistakes are
``ImproperlyConfigured`` (never a backend failure that fails open or closed), every built-in
backend can be named by the setting, the custom-backend contract of ``docs/backends.rst`` is
the one the code runs, and a ``DummyCache`` never limits."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from ratelimit_app.backends import get_backend, reset_backends
from ratelimit_app.backends.cache import CacheBackend
from ratelimit_app.core import get_usage, reset
from ratelimit_app.decorators import ratelimit
from ratelimit_app.exceptions import Ratelimited
from ratelimit_app.testing import frozen_clock

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: The built-in backend each kind of cache of ``backend_kind`` selects by itself.
BUILT_IN = {
    "locmem": "ratelimit_app.backends.cache.CacheBackend",
    "memcached": "ratelimit_app.backends.memcached.MemcachedBackend",
    "redis": "ratelimit_app.backends.redis.RedisBackend",
}


def limited_view(rate: str = "2/m", **kwargs: Any) -> Any:
    @ratelimit(key="ip", rate=rate, block=False, **kwargs)
    def view(request: HttpRequest) -> bool:
        return bool(request.limited)  # type: ignore[attr-defined]

    return view


@pytest.fixture(autouse=True)
def fresh_backends() -> Iterator[None]:
    reset_backends()
    yield
    reset_backends()


def test_every_builtin_backend_can_be_named_by_the_setting(
    backend_kind: str, rf: Any, group: str
) -> None:
    # The memcached and Redis backends took (alias, cache, location, options): named by
    # RATELIMIT_BACKEND they failed to build, which was reported as "cannot connect" and
    # refused every request (or, failing open, silently limited nothing).
    with override_settings(RATELIMIT_BACKEND=BUILT_IN[backend_kind]):
        backend = get_backend()
        assert f"{type(backend).__module__}.{type(backend).__name__}" == BUILT_IN[backend_kind]
        view = limited_view(group=group)
        assert [view(rf.get("/")) for _ in range(3)] == [False, False, True]


class NotABackend:
    """Has the methods, but is no Backend subclass."""

    def __init__(self, alias: str, cache: Any) -> None:
        pass


class ThreeArguments(CacheBackend):
    """A backend whose constructor wants more than the contract's ``(alias, cache)``."""

    def __init__(self, alias: str, cache: Any, servers: list[str]) -> None:
        super().__init__(alias, cache)


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("no.such.module.Backend", "cannot be imported"),
        ("django.core.cache.backends.locmem.LocMemCache", "is not a subclass"),
        (f"{__name__}.NotABackend", "is not a subclass"),
        ("ratelimit_app.backends.base.Backend", "does not implement delete, run_many"),
        (f"{__name__}.ThreeArguments", "cannot be built as cls(alias, cache)"),
    ],
)
@pytest.mark.parametrize("fail_open", [False, True])
def test_a_bad_backend_setting_is_a_configuration_error(
    setting: str, says: str, fail_open: bool, rf: Any, group: str
) -> None:
    with override_settings(RATELIMIT_BACKEND=setting, RATELIMIT_FAIL_OPEN=fail_open):
        with pytest.raises(ImproperlyConfigured, match="RATELIMIT_BACKEND") as info:
            get_backend()
        assert says in str(info.value) and setting in str(info.value)
        # Not a backend failure: the view neither refuses everything (closed) nor runs
        # unlimited (open).
        with pytest.raises(ImproperlyConfigured, match="RATELIMIT_BACKEND"):
            limited_view(group=group)(rf.get("/"))


# -- the custom backend of docs/backends.rst ---------------------------------------------


@ratelimit(key="ip", rate="2/m")
def documented_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("documented/", documented_view)]


def test_the_documented_custom_backend_limits_to_a_429(
    monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    text = (DOCS / "backends.rst").read_text(encoding="utf-8")
    # The page shows the file inline, so that it reads on its own in a clone.
    source = (DOCS / "examples" / "memory_backend.py").read_text(encoding="utf-8")
    assert ".. code-block:: python\n\n" + textwrap.indent(source, "   ") in text
    # As a user installs it: a module on the path, named by its dotted path.
    monkeypatch.syspath_prepend(str(DOCS / "examples"))
    with override_settings(
        RATELIMIT_BACKEND="memory_backend.MemoryBackend", ROOT_URLCONF=__name__
    ):
        backend = get_backend()
        assert type(backend).__name__ == "MemoryBackend"
        with frozen_clock(1_000_000.0) as clock:
            codes = [client.get("/documented/").status_code for _ in range(2)]
            clock.advance(30)
            codes += [client.get("/documented/").status_code for _ in range(2)]
            assert codes == [200, 200, 429, 429]
            # The refused hits were taken back (undo): once the first two have left the
            # window, there is room again (counted, the refusals would fill it till t+90).
            clock.advance(31)
            assert client.get("/documented/").status_code == 200
        # reset() goes through delete().
        assert backend.counters  # type: ignore[attr-defined]
        assert reset(
            "tests.ratelimit.test_backend_config.documented_view",
            "127.0.0.1",
            key="ip",
            rate="2/m",
        )


# -- DummyCache ----------------------------------------------------------------------------


DUMMY_CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "dev": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"},
}


@override_settings(CACHES=DUMMY_CACHES, RATELIMIT_USE_CACHE="dev")
def test_a_dummy_cache_never_limits(rf: Any, group: str) -> None:
    # It stores nothing: through the generic cache path every hit was a lost write, so
    # every decorated view refused every request.
    for algorithm in ("sliding_window", "leaky_bucket"):
        view = limited_view("1/m", group=f"{group}-{algorithm}", algorithm=algorithm)
        assert [view(rf.get("/")) for _ in range(5)] == [False] * 5, algorithm

        @ratelimit(key="ip", rate="1/m", group=f"{group}-{algorithm}-block", algorithm=algorithm)
        def blocking(request: HttpRequest) -> str:
            return "ok"

        assert [blocking(rf.get("/")) for _ in range(3)] == ["ok"] * 3, algorithm
        usage = get_usage(rf.get("/"), group, key="ip", rate="1/m", algorithm=algorithm)
        assert usage is not None and usage["count"] == 0 and not usage["should_limit"]


@override_settings(CACHES=DUMMY_CACHES, RATELIMIT_USE_CACHE="dev")
def test_a_dummy_cache_still_refuses_a_rate_of_zero(rf: Any, group: str) -> None:
    # As django-ratelimit: each check sees its own hit, and a rate of 0 admits none.
    @ratelimit(key="ip", rate="0/m", group=group)
    def never(request: HttpRequest) -> str:
        return "ok"

    with pytest.raises(Ratelimited):
        never(rf.get("/"))
    assert limited_view("1/m", group=group + "-one")(rf.get("/")) is False
