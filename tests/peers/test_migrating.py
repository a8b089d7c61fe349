"""What ``docs/migrating.rst`` says about django-ratelimit 4.1, checked against the installed
package (the real one: these tests are outside the alias shim), and the snippets it gives."""

from __future__ import annotations

import importlib.util
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from ratelimit_app.backends import reset_backends
from ratelimit_app.core import get_usage
from ratelimit_app.decorators import ratelimit
from ratelimit_app.exceptions import Ratelimited
from tests.peers.django_ratelimit_suite.aliases import swapped

DOCS = Path(__file__).resolve().parents[2] / "docs"
rf = RequestFactory()


@pytest.fixture(autouse=True)
def fresh_backends() -> Iterator[None]:
    reset_backends()
    yield
    reset_backends()


@pytest.mark.parametrize("kind", ["pymemcache", "django-redis", "django's redis"])
@pytest.mark.parametrize("fail_open", [False, True])
def test_an_outage_raises_in_django_ratelimit_and_never_here(
    kind: str, fail_open: bool, closed_port: int
) -> None:
    """django-ratelimit 4.1 raises the cache client's error during an outage: with Redis on
    every request whatever RATELIMIT_FAIL_OPEN says, with pymemcache on the first request
    (then its client marks the server dead and the setting applies). Here no request
    raises, and RATELIMIT_FAIL_OPEN decides from the first."""
    from django_ratelimit.core import get_usage as peer_get_usage

    location = {
        "pymemcache": ("django.core.cache.backends.memcached.PyMemcacheCache", "127.0.0.1:{}"),
        "django-redis": ("django_redis.cache.RedisCache", "redis://127.0.0.1:{}/0"),
        "django's redis": (
            "django.core.cache.backends.redis.RedisCache",
            "redis://127.0.0.1:{}/0",
        ),
    }[kind]
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "down": {"BACKEND": location[0], "LOCATION": location[1].format(closed_port)},
    }
    args: dict[str, Any] = {"group": "g", "key": "ip", "rate": "5/m", "increment": True}
    with override_settings(
        CACHES=caches, RATELIMIT_USE_CACHE="down", RATELIMIT_FAIL_OPEN=fail_open
    ):
        raised = []
        for _ in range(3):
            try:
                peer_get_usage(rf.get("/"), **args)
            except Exception as exc:  # the cache client's own error class
                raised.append(type(exc).__module__.split(".")[0])
            else:
                raised.append("")
        if kind == "pymemcache":
            assert raised == ["builtins", "", ""]  # ConnectionRefusedError, then the setting
        else:
            assert raised == ["redis"] * 3
        ours = [get_usage(rf.get("/"), **args) for _ in range(3)]
        if fail_open:
            assert ours == [None] * 3
        else:
            assert all(u is not None and u["should_limit"] for u in ours)


# -- the Django REST framework exception handler of docs/migrating.rst ---------------------


def load_drf_example(delegate: Any) -> types.ModuleType:
    """The example file, with ``rest_framework.views.exception_handler`` as ``delegate``.

    djangorestframework is not a dependency of this project: the stand-in provides only the
    one name the example imports, so this checks the example's own logic (a ``Ratelimited``
    becomes the middleware's 429; everything else goes to DRF's handler), not DRF.
    """
    views = types.ModuleType("rest_framework.views")
    views.exception_handler = delegate  # type: ignore[attr-defined]
    package = types.ModuleType("rest_framework")
    package.views = views  # type: ignore[attr-defined]
    path = DOCS / "examples" / "drf_exception_handler.py"
    spec = importlib.util.spec_from_file_location("drf_exception_handler", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with swapped({"rest_framework": package, "rest_framework.views": views}):
        spec.loader.exec_module(module)
    return module


def test_the_drf_exception_handler_answers_429_for_a_refusal() -> None:
    text = (DOCS / "migrating.rst").read_text(encoding="utf-8")
    # The page shows the file inline, so that it reads on its own in a clone.
    source = (DOCS / "examples" / "drf_exception_handler.py").read_text(encoding="utf-8")
    assert ".. code-block:: python\n\n" + textwrap.indent(source, "   ") in text
    delegated: list[Exception] = []

    def drf_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse:
        delegated.append(exc)
        return HttpResponse(status=403)

    handler = load_drf_example(drf_handler).exception_handler

    @ratelimit(key="ip", rate="1/m", group="drf-example")
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    django_request = rf.get("/", HTTP_ACCEPT="application/json")
    view(django_request)
    with pytest.raises(Ratelimited) as info:
        view(django_request)
    # DRF's Request keeps the Django request as ``_request``.
    context = {"request": types.SimpleNamespace(_request=django_request), "view": None}
    response = handler(info.value, context)
    assert response.status_code == 429
    assert response["Content-Type"] == "application/problem+json"
    assert int(response["Retry-After"]) >= 1 and "RateLimit" in response
    assert delegated == []
    other = PermissionDenied("not yours")
    assert handler(other, context).status_code == 403 and delegated == [other]
