"""The bans in force that a process holds in memory, so a banned request is refused with no
round trip and no query: filled from the database's rows by the configuration in force
(:mod:`ratelimit_app.store`), read by :mod:`ratelimit_app.bans.applied`."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from ratelimit_app.identity.sealing import unseal

__all__ = ["MOST_BANS", "PRUNE_EVERY", "HeldBans"]

#: The most bans a process holds, about 150 bytes each (15 MB at the bound): at it, the
#: ended ones are dropped, and no new ban is made until some end
#: (:func:`ratelimit_app.bans.applied.impose`).
MOST_BANS = 100_000


class HeldBans:
    """The bans in force that this process holds, each with the Unix time it ends: a
    limit's own bans by hashed key (``rule``: a check's namespace), bans on every path by
    the address itself (``site``: unsealed from the row), and the newest change read
    (``seen``, an aware datetime: the next read starts there)."""

    __slots__ = ("pruned", "rule", "seen", "site")

    def __init__(self) -> None:
        self.rule: dict[str, float] = {}
        self.site: dict[str, float] = {}
        self.seen: Any = None
        #: time.monotonic() of the last :meth:`prune`.
        self.pruned = -math.inf

    def __len__(self) -> int:
        return len(self.rule) + len(self.site)

    def __bool__(self) -> bool:
        return bool(self.rule or self.site)

    def put(self, rows: Iterable[tuple[str, Any, bool, Any, str]], now: float) -> None:
        """Take in ``rows`` of :class:`~ratelimit_app.models.Ban` (key, until, site,
        changed, sealed): a ban in force is held, an ended or lifted one dropped. A ban on
        every path whose address cannot be unsealed (sealed under another ``SECRET_KEY``)
        is left out, as its hashed key would not match either."""
        for key, until, site, changed, sealed in rows:
            held = self.rule
            if site:
                address = unseal(sealed)
                if address is None:
                    continue
                held, key = self.site, address
            end = until.timestamp()
            if end > now:
                held[key] = end
            else:
                held.pop(key, None)
            if self.seen is None or changed > self.seen:
                self.seen = changed

    def prune(self, now: float) -> None:
        """Drop the bans that have ended (a look-up ignores them already): a pass over
        them all, so at most once every :data:`PRUNE_EVERY` seconds."""
        if time.monotonic() < self.pruned + PRUNE_EVERY:
            return
        self.pruned = time.monotonic()
        for held in (self.rule, self.site):
            for key in [k for k, end in held.items() if end <= now]:
                del held[key]


#: Seconds between two prunes by one process (of the bans held, and of the database's rows).
PRUNE_EVERY = 60.0
