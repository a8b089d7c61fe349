"""django-ratelimit 4.1's test classes, collected here from the installed wheel's ``tests.py``
(loaded by path through :mod:`.aliases`, never copied).

Each class runs as the peer wrote it, with its counters in local memory as its own
``test_settings.py`` has them; the classes that count also run with the counters on our
real memcached and Redis servers (the ``...OnMemcached`` and ``...OnRedis`` subclasses),
where our fast paths do the counting. :mod:`.conftest` applies the settings and the aliases.
"""

from __future__ import annotations

from tests.peers import suites
from tests.peers.django_ratelimit_suite.aliases import PEER_TESTS, aliases, peer_test_cases

#: The peer's classes whose tests count on its default cache (``cache.clear()`` in setUp).
COUNTING = ("RatelimitTests", "FunctionsTests", "RatelimitCBVTests")


def _classes() -> dict[str, type]:
    cases = peer_test_cases(aliases()[PEER_TESTS])
    return suites.with_counter_servers(cases, COUNTING, __name__)


globals().update(_classes())
