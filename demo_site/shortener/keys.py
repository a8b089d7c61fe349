"""Short keys: random, hard to guess, and never given to two links.

A key is 8 characters from an alphabet of 56 that leaves out look-alikes (0/O/o, 1/l/I):
56**8, about 10**14 keys (46 bits), so a client guessing keys finds one of a million links
once in about 10**8 tries, and the ``shorturl-scan`` rule lets an address try 300 a day.
Keys come from :mod:`secrets`, not :mod:`random`. Two links never share a key: the column
is unique, and a key drawn twice (a collision) is drawn again.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction

from demo_site.shortener.models import Link

ALPHABET = "23456789abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"
LENGTH = 8
#: Draws before giving up (with 10**14 keys, even a second draw is practically never needed).
ATTEMPTS = 5


class KeyspaceExhausted(Exception):
    """Every draw collided with an existing key: a broken generator, not bad luck."""


def new_key(length: int = LENGTH) -> str:
    """A random key of ``length`` characters from :data:`ALPHABET`."""
    return "".join(secrets.choice(ALPHABET) for _ in range(length))


def create_link(url: str, *, user: Any = None, draw: Callable[[], str] = new_key) -> Link:
    """Store a link to ``url`` under a fresh key; draw again when the key is taken.

    The unique constraint decides, not a look-up first: two requests that draw the same key
    at the same moment cannot both have it. ``user`` (anonymous: nobody) is kept as the
    link's creator. Raises :class:`KeyspaceExhausted` after
    :data:`ATTEMPTS` collisions.
    """
    owner = user if getattr(user, "is_authenticated", False) else None
    for _ in range(ATTEMPTS):
        try:
            with transaction.atomic():
                return Link.objects.create(key=draw(), url=url, created_by=owner)
        except IntegrityError:
            continue
    raise KeyspaceExhausted(f"{ATTEMPTS} keys drawn in a row were all taken")
