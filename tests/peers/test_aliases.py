"""The ``django_ratelimit`` aliases are ours only inside :func:`swapped`: the real package
stays importable for the benchmarks and ``tests/ratelimit/test_core.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import django_ratelimit.core as real_core

from ratelimit_app import core
from tests.peers.django_ratelimit_suite.aliases import aliases, peer_tests_path, swapped


def test_the_aliases_are_scoped_and_the_peer_file_is_the_wheels() -> None:
    assert peer_tests_path().parent == Path(real_core.__file__).parent
    with swapped(aliases()):
        import django_ratelimit.core as aliased

        assert aliased.get_usage is core.get_usage
        assert sys.modules["django_ratelimit.tests"].__file__ == str(peer_tests_path())
    assert sys.modules["django_ratelimit.core"] is real_core
    assert "django_ratelimit.tests" not in sys.modules
    import django_ratelimit.core as again

    assert again.get_usage is not core.get_usage
