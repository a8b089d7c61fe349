"""``post:<field>`` and ``email`` keys inside Django REST framework views.

``@ratelimit`` inside an ``@api_view`` (or on an ``APIView`` method) is handed DRF's
``Request``, whose ``content_type`` is the whole header (``multipart/form-data;
boundary=...``): the key must read what the view's ``request.data`` reads, for every body
DRF parses, and leave the view its data.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings
from django.urls import path
from django.utils.decorators import method_decorator
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIClient, APIRequestFactory
from rest_framework.views import APIView

from ratelimit_app import store
from ratelimit_app.decorators import ratelimit
from ratelimit_app.identity import keys
from ratelimit_app.testing import forget_refusals


@api_view(["POST"])
@ratelimit(key="post:username", rate="3/m")
def function_view(request: Request) -> Response:
    return Response({"username": request.data.get("username")})


class ClassView(APIView):
    @method_decorator(ratelimit(key="post:username", rate="3/m"))
    def post(self, request: Request) -> Response:
        return Response({"username": request.data.get("username")})


@api_view(["POST"])
@ratelimit(key="email", rate="3/m")
def email_view(request: Request) -> Response:
    return Response({"email": request.data.get("email")})


@api_view(["POST"])
def undecorated_view(request: Request) -> Response:
    return Response({"username": request.data.get("username")})


urlpatterns = [
    path("undecorated/", undecorated_view),
    path("function/", function_view),
    path("class/", ClassView.as_view()),
    path("email/", email_view),
]

#: The bodies DRF's default parsers read, as the test client sends them.
FORMATS = ["multipart", "form", "json"]


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    """This module's views, with nothing remembered (the tests that count take
    ``backend_kind``: local memory, memcached and Redis)."""
    forget_refusals()
    with override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=[]):
        yield
    forget_refusals()
    caches["default"].clear()


def post(url: str, body: dict[str, Any], kind: str, ip: str = "192.0.2.10") -> Any:
    """POST ``body`` to ``url`` as ``kind``: ``multipart`` (with its boundary), ``form``
    (URL-encoded, as a browser's form without a file), ``form-charset`` (the same, with a
    charset parameter) or ``json``."""
    client = APIClient(REMOTE_ADDR=ip)
    if kind.startswith("form"):
        content_type = "application/x-www-form-urlencoded"
        if kind == "form-charset":
            content_type += "; charset=utf-8"
        return client.generic("POST", url, urllib.parse.urlencode(body), content_type)
    return client.post(url, body, format=kind)


@pytest.mark.parametrize("kind", [*FORMATS, "form-charset"])
@pytest.mark.parametrize("url", ["/function/", "/class/"])
def test_each_username_has_its_own_bucket_and_the_view_reads_its_data(
    backend_kind: str, url: str, kind: str
) -> None:
    answers = [post(url, {"username": "same"}, kind) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 403]
    assert [a.data for a in answers[:3]] == [{"username": "same"}] * 3
    # Another account from the same address: its own bucket, not the IP's.
    other = post(url, {"username": "other"}, kind)
    assert other.status_code == 200 and other.data == {"username": "other"}


@pytest.mark.parametrize("kind", FORMATS)
def test_email_keys_read_the_drf_body_too(backend_kind: str, kind: str) -> None:
    answers = [post("/email/", {"email": " Same@X.com"}, kind) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 403]
    assert post("/email/", {"email": "other@x.com"}, kind).status_code == 200


def drf_request(body: bytes, content_type: str, ip: str = "192.0.2.20") -> Request:
    """A DRF ``Request`` as a view receives it, its body not yet parsed."""
    raw = APIRequestFactory().generic("POST", "/", body, content_type, REMOTE_ADDR=ip)
    return APIView().initialize_request(raw)


def test_a_field_absent_or_null_falls_back_to_the_ip() -> None:
    for body, content_type in (
        (b'{"username": null}', "application/json"),
        (b'{"name": "x"}', "application/json"),
        (b"[1, 2]", "application/json"),
        (b"name=x", "application/x-www-form-urlencoded"),
        (b"", "application/json"),
    ):
        request = drf_request(body, content_type)
        assert keys.subject("post:username", "g", request) == ("ip", "192.0.2.20"), body


def test_a_file_is_no_value() -> None:
    """``request.POST`` holds no file; neither does the key."""
    raw = APIRequestFactory().post(
        "/", {"username": _upload()}, format="multipart", REMOTE_ADDR="192.0.2.21"
    )
    request = APIView().initialize_request(raw)
    assert keys.subject("post:username", "g", request) == ("ip", "192.0.2.21")
    assert request.data["username"].name == "a.txt"  # the view still has its file


def _upload() -> Any:
    return SimpleUploadedFile("a.txt", b"contents")


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"{not json", "application/json"),
        (b"--x\r\nbroken", "multipart/form-data"),  # no boundary
        (b"<a/>", "application/xml"),  # no parser: 415 for the view
    ],
)
def test_a_body_drf_cannot_parse_gives_the_view_its_error(body: bytes, content_type: str) -> None:
    """The key falls back to the IP (never raises), and the view meets the error itself,
    as it would without the limit (DRF answers 400 or 415, not an empty form)."""
    request = drf_request(body, content_type)
    expected = _parse_error(drf_request(body, content_type))
    assert keys.subject("post:username", "g", request) == ("ip", "192.0.2.20")
    assert _parse_error(request) == expected and expected is not None


def _parse_error(request: Request) -> str | None:
    try:
        request.data  # noqa: B018
    except Exception as exc:  # ParseError, UnsupportedMediaType
        return f"{type(exc).__name__}: {exc}"
    return None


def test_the_view_still_reads_json_after_the_key() -> None:
    request = drf_request(json.dumps({"username": "Bob", "n": 1}).encode(), "application/json")
    assert keys.subject("post:username", "g", request) == ("post:username", "Bob")
    assert request.data == {"username": "Bob", "n": 1}


def test_a_body_drf_cannot_parse_is_still_the_views_400() -> None:
    client = APIClient(REMOTE_ADDR="192.0.2.11")
    answer = client.generic("POST", "/function/", b"{not json", "application/json")
    assert answer.status_code == 400 and "JSON parse error" in answer.data["detail"]


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_an_upload_over_djangos_memory_limit_is_read_as_drf_streams_it(backend_kind: str) -> None:
    """Django keeps no more than ``DATA_UPLOAD_MAX_MEMORY_SIZE`` of a body in memory; DRF's
    multipart parser streams files to disk: the key reads the field all the same."""

    def upload(username: str) -> Any:
        big = SimpleUploadedFile("big.bin", b"x" * 5000)
        body = {"username": username, "file": big}
        return APIClient(REMOTE_ADDR="192.0.2.12").post("/class/", body, format="multipart")

    assert [upload("same").status_code for _ in range(4)] == [200, 200, 200, 403]
    other = upload("other")
    assert other.status_code == 200 and other.data == {"username": "other"}


@pytest.mark.parametrize("kind", [*FORMATS, "form-charset"])
def test_a_rule_of_the_middleware_reads_the_body_and_leaves_the_view_its_data(
    backend_kind: str, kind: str
) -> None:
    """The middleware reads Django's request before DRF wraps it: DRF then reads the form
    Django parsed, or the body Django kept."""
    rule = {"name": "drf-username", "path": "/undecorated/", "key": "post:username"}
    middleware = ["ratelimit_app.middleware.RatelimitMiddleware"]
    settings = {"RATELIMIT_RULES": [{**rule, "rate": "3/m"}]}
    with override_settings(MIDDLEWARE=middleware, **settings):
        store.forget()
        answers = [post("/undecorated/", {"username": "same"}, kind) for _ in range(4)]
        other = post("/undecorated/", {"username": "other"}, kind)
    store.forget()
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert [a.json() for a in answers[:3]] == [{"username": "same"}] * 3
    assert other.status_code == 200 and other.json() == {"username": "other"}
