from __future__ import annotations

import zlib
from typing import Any
from unittest import mock

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory, override_settings
from django_ratelimit.core import get_usage as peer_get_usage

from ratelimit_app import ALL, UNSAFE
from ratelimit_app.algorithms import windows
from ratelimit_app.backends import reset_backends
from ratelimit_app.core import get_usage, is_ratelimited, reset
from ratelimit_app.signals import backend_failed
from ratelimit_app.testing import frozen_clock

pytestmark = pytest.mark.usefixtures("backend_kind")

rf = RequestFactory()
T0 = 1_800_000_000.0


def hit(group: str, ip: str = "192.0.2.10", rate: str = "3/m", **kw: Any) -> dict[str, Any]:
    usage = get_usage(rf.get("/", REMOTE_ADDR=ip), group=group, key="ip", rate=rate, **kw)
    assert usage is not None
    return usage


def test_usage_dict(group: str) -> None:
    with frozen_clock(T0 + 10):
        first = hit(group, increment=True)
        assert first == {
            "count": 1,
            "limit": 3,
            "should_limit": False,
            "time_left": 60,  # capped at the period, as django-ratelimit's; reset is exact
            "remaining": 2,
            "reset": 61,
            "retry_after": 0,
            "rate": "3/m",
            "rates": [
                {
                    "rate": "3/m",
                    "window": 60,
                    "count": 1,
                    "limit": 3,
                    "remaining": 2,
                    "reset": 61,
                    "should_limit": False,
                }
            ],
            "algorithm": "sliding_window",
        }
        hit(group, increment=True)
        hit(group, increment=True)
        over = hit(group, increment=True)
        assert over["should_limit"] and over["count"] == 4 and over["remaining"] == 0
        assert over["retry_after"] == 61
        assert hit(group)["count"] == 3  # the refused hit was taken back


def test_same_answers_as_django_ratelimit_inside_one_window(group: str) -> None:
    request = rf.get("/", REMOTE_ADDR="192.0.2.11")
    ours = [
        is_ratelimited(request, group=group, key="ip", rate="5/m", increment=True)
        for _ in range(8)
    ]
    theirs = []
    for _ in range(8):
        usage = peer_get_usage(request, group=group, key="ip", rate="5/h", increment=True)
        theirs.append(bool(usage and usage["should_limit"]))
    assert ours == theirs == [False] * 5 + [True] * 3


def test_arguments_like_django_ratelimit(group: str) -> None:
    request = rf.get("/", REMOTE_ADDR="192.0.2.12")
    with pytest.raises(ImproperlyConfigured):
        get_usage(request, key="ip", rate="5/m")  # neither group nor fn
    with pytest.raises(ImproperlyConfigured):
        get_usage(request, group=group, rate="5/m")  # no key
    assert get_usage(request, group=group, key="ip", rate=None) is None
    assert get_usage(request, group=group, key="ip", rate="5/m", method="POST") is None
    assert get_usage(request, group=group, key="ip", rate="5/m", method=UNSAFE) is None
    assert get_usage(request, group=group, key="ip", rate="5/m", method=ALL) is not None
    assert get_usage(request, group=group, key="ip", rate=lambda g, r: None) is None

    def view(request: Any) -> None:
        pass

    usage = get_usage(request, fn=view, key="ip", rate="5/m", increment=True)
    assert usage is not None and usage["count"] == 1
    again = get_usage(request, group=f"{__name__}.{view.__qualname__}", key="ip", rate="5/m")
    assert again is not None and again["count"] == 1  # default group: module.qualname


def test_several_rates_every_one_enforced(group: str) -> None:
    with frozen_clock(T0) as clock:
        results = []
        for _ in range(12):
            results.append(hit(group, rate="5/m;8/h", increment=True)["should_limit"])
            clock.advance(20)
        # 3 per minute pass the 5/m rate; the 8/h rate stops the 9th hit.
        assert results == [False] * 8 + [True] * 4
        last = hit(group, rate="5/m;8/h")
        assert last["rate"] == "8/h" and [r["rate"] for r in last["rates"]] == ["5/m", "8/h"]


def test_edge_bursts_never_admit_2n(group: str) -> None:
    """django-ratelimit's fixed windows admit 2N across an edge; sliding windows do not."""
    n, edge = 10, T0 + 3600  # an hour boundary
    times = [edge - 0.5] * n * 2 + [edge + 0.5] * n * 2
    with frozen_clock(times[0]) as clock:
        ours = 0
        for t in times:
            clock.set(t)
            ours += not hit(group, rate=f"{n}/m", increment=True)["should_limit"]
    assert ours == n
    # django-ratelimit's windows end at crc32(key) % period past a multiple of the period,
    # inclusive: the next window starts one second later.
    peer_edge = T0 + 3600 + zlib.crc32(b"192.0.2.10") % 60 + 1
    request = rf.get("/", REMOTE_ADDR="192.0.2.10")
    theirs = 0
    for t in [peer_edge - 0.5] * n * 2 + [peer_edge + 0.5] * n * 2:
        with mock.patch("django_ratelimit.core.time.time", return_value=t):
            usage = peer_get_usage(
                request, group=group + "p", key="ip", rate=f"{n}/m", increment=True
            )
            theirs += not (usage and usage["should_limit"])
    assert theirs == 2 * n


def test_reset_clears_a_subject(group: str) -> None:
    for _ in range(4):
        hit(group, ip="192.0.2.13", increment=True)
    assert hit(group, ip="192.0.2.13")["count"] == 3
    assert reset(group, "192.0.2.13", key="ip", rate="3/m")
    assert hit(group, ip="192.0.2.13")["count"] == 0
    assert not reset(group, "", key="ip", rate="3/m")


def test_reset_normalises_emails(group: str) -> None:
    request = rf.post("/", {"email": "Alice@Example.com"})
    get_usage(request, group=group, key="email", rate="3/m", increment=True)
    assert reset(group, "  ALICE@example.COM", key="email", rate="3/m")
    usage = get_usage(request, group=group, key="email", rate="3/m")
    assert usage is not None and usage["count"] == 0


@mock.patch.object(windows, "HIERARCHICAL", True)
def test_hierarchical_mode_end_to_end(group: str) -> None:
    with frozen_clock(T0) as clock:
        for _ in range(5):
            assert not hit(group, rate="5/d", increment=True)["should_limit"]
            clock.advance(3000)
        assert hit(group, rate="5/d", increment=True)["should_limit"]
        clock.set(T0 + 86400 + 1)  # the first hit has left the day window
        assert not hit(group, rate="5/d", increment=True)["should_limit"]


def test_backend_failure_signal_and_fail_modes(group: str) -> None:
    dead = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:9/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.05, "SOCKET_TIMEOUT": 0.05},
    }
    received = []

    def on_failure(sender: Any, **kwargs: Any) -> None:
        received.append(kwargs)

    backend_failed.connect(on_failure)
    try:
        with override_settings(CACHES={"default": dead, "rl": dead}, RATELIMIT_USE_CACHE="rl"):
            reset_backends()
            closed = hit(group, increment=True)
            assert closed["should_limit"] and closed["limit"] == 0  # django-ratelimit's
            with override_settings(RATELIMIT_FAIL_OPEN=True):
                assert get_usage(rf.get("/"), group=group, key="ip", rate="3/m") is None
    finally:
        backend_failed.disconnect(on_failure)
        reset_backends()
    assert received and received[0]["alias"] == "rl"


def test_look_then_count_failures_like_django_ratelimit(group: str) -> None:
    """The classic pattern: look before the view, count only failed attempts."""
    request = rf.post("/", {"email": "bob@example.com"})
    allowed = 0
    for _ in range(20):
        if is_ratelimited(request, group=group, key="email", rate="5/m"):
            continue
        allowed += 1  # ... the password was wrong: count it
        is_ratelimited(request, group=group, key="email", rate="5/m", increment=True)
    assert allowed == 5
    usage = get_usage(request, group=group, key="email", rate="5/m")
    assert usage is not None
    assert usage["should_limit"]
    assert 0 < usage["retry_after"] <= 61


def test_stacked_limits_on_one_view_keep_their_own_counters(group: str) -> None:
    get, post = rf.get("/", REMOTE_ADDR="192.0.2.14"), rf.post("/", REMOTE_ADDR="192.0.2.14")
    for _ in range(6):
        get_usage(get, group=group, key="ip", rate="100/m", method="GET", increment=True)
    usage = get_usage(post, group=group, key="ip", rate="5/m", method="POST", increment=True)
    assert usage is not None
    assert usage["count"] == 1  # the GETs are not counted against the POST limit


@mock.patch.object(windows, "HIERARCHICAL", True)
def test_reset_is_complete_in_hierarchical_mode(group: str) -> None:
    with frozen_clock(T0 + 1234) as clock:
        for _ in range(3):
            hit(group, ip="192.0.2.15", rate="5/d", increment=True)
            clock.advance(7)
        assert reset(group, "192.0.2.15", key="ip", rate="5/d")
        for step in (0, 60, 3600, 7200):
            clock.advance(step)
            assert hit(group, ip="192.0.2.15", rate="5/d")["count"] == 0, step


def test_reset_needs_a_concrete_rate(group: str) -> None:
    with pytest.raises(ValueError, match="depends on the request"):
        reset(group, "192.0.2.16", key="ip", rate="tests.ratelimit.test_rates.rate_for")
    with pytest.raises(ValueError, match="depends on the request"):
        reset(group, "192.0.2.16", key="ip", rate=lambda g, r: "5/m")
    with pytest.raises(ValueError, match="needs the key and rate"):
        reset(group, "192.0.2.16", key="ip")
    with pytest.raises(ValueError, match="No rule named"):
        reset(group, "192.0.2.16")


def test_keys_change_with_the_secret_key(group: str) -> None:
    from ratelimit_app.identity.keys import namespace

    before = namespace(group, "ip", "192.0.2.17")
    with override_settings(SECRET_KEY="another-secret"):
        assert namespace(group, "ip", "192.0.2.17") != before
    assert namespace(group, "ip", "192.0.2.17") == before


def test_a_cache_without_location_fails_closed_without_raising(group: str) -> None:
    empty = {"BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache", "LOCATION": ""}
    with override_settings(CACHES={"default": empty, "rl": empty}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        assert hit(group, increment=True)["should_limit"]
    reset_backends()


@pytest.mark.parametrize(
    "cache",
    [
        {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": ""},
        {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "nonsense://x"},
        {"BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache", "LOCATION": ""},
    ],
)
async def test_an_unbuildable_backend_fails_like_a_dead_one(cache: dict[str, Any]) -> None:
    from tests.ratelimit import views

    with override_settings(CACHES={"default": cache, "rl": cache}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        usage = get_usage(rf.get("/"), group="g", key="ip", rate="3/m", increment=True)
        assert usage is not None
        assert usage["should_limit"]  # fail closed, as django-ratelimit
        response = await views.async_view(rf.get("/"))
        assert response.status_code == 503  # the counters' outage, not the client's doing
    reset_backends()


def test_reset_and_lookup_find_what_the_key_stored(group: str) -> None:
    from ratelimit_app.core import lookup

    assert not reset(group, "not-an-ip", key="ip", rate="3/m")  # an ip key needs an IP
    # A header that holds an address is stored as sent (not masked), under its own kind.
    request = rf.get("/", HTTP_X_REAL_IP="2001:db8::1:2", REMOTE_ADDR="192.0.2.40")
    for _ in range(2):
        get_usage(request, group=group, key="header:x-real-ip", rate="3/m", increment=True)
    found = lookup(group, "2001:db8::1:2", key="header:x-real-ip", rate="3/m")
    assert found is not None and found["count"] == 2
    assert reset(group, "2001:db8::1:2", key="header:x-real-ip", rate="3/m")
    after = lookup(group, "2001:db8::1:2", key="header:x-real-ip", rate="3/m")
    assert after is not None and after["count"] == 0
    # Requests without the header fell back to the client IP: typed as an IP, found too.
    bare = rf.get("/", REMOTE_ADDR="192.0.2.41")
    get_usage(bare, group=group, key="header:x-real-ip", rate="3/m", increment=True)
    fallback = lookup(group, "192.0.2.41", key="header:x-real-ip", rate="3/m")
    assert fallback is not None and fallback["count"] == 1
