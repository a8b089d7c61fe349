"""Sealed addresses: an address kept in the database that only this site can read.

A ban on every path must be found for every request of the site, from the client's address,
at the cost of a dictionary look-up (docs/performance). Its row keeps the address hashed (the
key every process and person finds it by) and *sealed*: encrypted under a key derived from
``SECRET_KEY``, so each process can read the addresses of the bans it holds and look a request
up by its address as it is, with no hash per request. Someone who reads the database without
``SECRET_KEY`` learns no more than from the hashed key.

The cipher: a fresh random 16-byte nonce per seal, and the address XORed with the first bytes
of BLAKE2b (a pseudo-random function keyed with 32 bytes derived from ``SECRET_KEY``) of that
nonce: a one-block stream cipher for values of at most 64 bytes (an IPv6 address is at most 45
characters), and an 8-byte keyed BLAKE2b tag of both. Sealed text is ``v1:`` + the nonce, the
tag and the cipher text in hex. The key follows ``SECRET_KEY``: text sealed under another one
(or changed) reads as nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from django.conf import settings

from ratelimit_app.runtime import RUNTIME

__all__ = ["MAX_SEALED", "seal", "unseal"]

#: The longest value sealed (one BLAKE2b output).
MAX_SEALED = 64
_PREFIX = "v1:"
_PERSON = b"bucketry-seal"
_TAG = b"bucketry-tag"


def _key() -> bytes:
    """32 bytes derived from ``SECRET_KEY`` (a part of the runtime)."""
    return RUNTIME.part(_derived_key)


def _derived_key() -> bytes:
    secret = str(getattr(settings, "SECRET_KEY", "") or "")
    return hashlib.sha256(f"django-bucketry seal\x00{secret}".encode()).digest()


def _stream(nonce: bytes, size: int) -> bytes:
    return hashlib.blake2b(nonce, key=_key(), digest_size=MAX_SEALED, person=_PERSON).digest()[
        :size
    ]


def seal(value: str) -> str:
    """``value`` sealed (``""`` for a value longer than :data:`MAX_SEALED` bytes)."""
    data = value.encode()
    if len(data) > MAX_SEALED:
        return ""
    nonce = os.urandom(16)
    sealed = bytes(a ^ b for a, b in zip(data, _stream(nonce, len(data)), strict=True))
    return _PREFIX + nonce.hex() + _tag(nonce, sealed).hex() + sealed.hex()


def _tag(nonce: bytes, sealed: bytes) -> bytes:
    return hashlib.blake2b(nonce + sealed, key=_key(), digest_size=8, person=_TAG).digest()


def unseal(text: str) -> str | None:
    """The value :func:`seal` sealed in ``text``, or None (empty, malformed, or sealed under
    another ``SECRET_KEY``: then not valid text, or not the value)."""
    if not text.startswith(_PREFIX):
        return None
    try:
        raw = bytes.fromhex(text[len(_PREFIX) :])
    except ValueError:
        return None
    nonce, tag, sealed = raw[:16], raw[16:24], raw[24:]
    if not sealed or len(sealed) > MAX_SEALED or not hmac.compare_digest(tag, _tag(nonce, sealed)):
        return None
    data = bytes(a ^ b for a, b in zip(sealed, _stream(nonce, len(sealed)), strict=True))
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None
