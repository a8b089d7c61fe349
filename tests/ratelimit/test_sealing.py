"""Sealed addresses (:mod:`ratelimit_app.identity.sealing`): what a ban on every path keeps
so that every process finds it by the address, with no hash per request."""

from __future__ import annotations

import pytest
from django.test import override_settings

from ratelimit_app.identity.sealing import MAX_SEALED, seal, unseal


@pytest.mark.parametrize("value", ["192.0.2.1", "2001:db8::", "::ffff:192.0.2.1", "x" * 64])
def test_a_sealed_value_unseals_to_itself_and_shows_nothing_of_it(value: str) -> None:
    sealed = seal(value)
    assert unseal(sealed) == value
    assert value not in sealed and value.encode().hex() not in sealed
    assert seal(value) != sealed  # a fresh nonce each time: equal addresses look unrelated


def test_another_secret_key_reads_nothing() -> None:
    sealed = seal("192.0.2.1")
    with override_settings(SECRET_KEY="another secret key, long enough for Django's checks"):
        assert unseal(sealed) is None
    assert unseal(sealed) == "192.0.2.1"


@pytest.mark.parametrize(
    "text",
    ["", "v1:", "v1:zz", "v2:" + "00" * 40, "v1:" + "00" * 24, "192.0.2.1"],
)
def test_malformed_text_reads_as_nothing(text: str) -> None:
    assert unseal(text) is None


def test_a_changed_byte_reads_as_nothing() -> None:
    sealed = seal("198.51.100.7")
    last = sealed[-1]
    assert unseal(sealed[:-1] + ("0" if last != "0" else "1")) is None


def test_a_value_too_long_is_not_sealed() -> None:
    assert seal("x" * (MAX_SEALED + 1)) == ""
