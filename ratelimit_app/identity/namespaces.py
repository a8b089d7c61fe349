"""A subject as the counters store it: a salted hash of its limit, kind and value."""

from __future__ import annotations

from ratelimit_app.conf import conf
from ratelimit_app.runtime import RUNTIME

#: Subjects whose namespaces a process remembers (a 34-character string each); the memo
#: starts over when full. A value is the client's text: one longer than an address, an
#: email or a derived subject is hashed again rather than remembered.
NAMESPACE_MEMO = 8192
NAMESPACE_MEMO_VALUE = 80


def namespace(group: str, kind: str, value: str) -> str:
    """The hashed, hash-tagged part of a key: no raw IP or email ever reaches the cache.

    The hash is salted with a value derived from ``SECRET_KEY``, so a key read off the cache
    cannot be reversed by hashing every IPv4 address. Recent subjects are remembered in the
    runtime (``RUNTIME.namespaces``, starting over when full), never stored elsewhere; a
    value longer than an address, an email or a derived subject is hashed again each time.
    """
    memo = RUNTIME.namespaces
    found = memo.get((group, kind, value))
    if found is None:
        # surrogatepass: a group named with a lone surrogate (a key's values never hold one:
        # keys.py derives those) is hashed as it is, not a UnicodeEncodeError per request.
        raw = f"{conf.SALT}\x00{group}\x00{kind}\x00{value}".encode("utf-8", "surrogatepass")
        found = "{" + conf.HASH(raw).hexdigest()[:32] + "}"
        if len(value) <= NAMESPACE_MEMO_VALUE:
            if len(memo) >= NAMESPACE_MEMO:
                memo.clear()
            memo[group, kind, value] = found
    return found
