"""The ``django_ratelimit`` names, mapped to ``ratelimit_app``, and the peer's tests loaded
through them.

django-ratelimit's ``tests.py`` imports ``django_ratelimit.decorators``, ``.exceptions`` and
``.core`` (including two private helpers, ``_split_rate`` and ``_get_ip``), and names its own
functions by dotted path (``"django_ratelimit.tests.mykey"``). :func:`swapped` puts our
modules under those names in ``sys.modules`` for as long as it is active, then puts back
whatever was there: the real package, imported by the benchmarks and by
``tests/ratelimit/test_core.py``, is never shadowed outside it.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import sys
import types
import unittest
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import ratelimit_app
from ratelimit_app import core, decorators, exceptions, keys
from ratelimit_app.algorithms import rates

PEER = "django_ratelimit"
#: The module name the peer's tests are loaded under (its dotted paths name it).
PEER_TESTS = f"{PEER}.tests"


@cache
def peer_tests_path() -> Path:
    """The installed wheel's ``tests.py``, found without importing the package."""
    spec = importlib.util.find_spec(PEER)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{PEER} is not installed (it is a dev dependency)")
    return Path(spec.origin).with_name("tests.py")


def _split_rate(rate: Any) -> tuple[int, int]:
    """django-ratelimit's private rate parser, which its tests call: one rate as
    ``(count, seconds)``, parsed by ours."""
    (only,) = rates.normalize(rate)
    return only.count, only.seconds


def _get_ip(request: Any) -> str | None:
    """django-ratelimit's private client-address helper (masked, as the ``ip`` key counts
    it): ours."""
    return keys.client_ip(request)


def _module(name: str, attrs: dict[str, Any], package: bool = False) -> types.ModuleType:
    module = types.ModuleType(name)
    # A spec, as an imported module has: importlib.util.find_spec() reads it.
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    module.__dict__.update(attrs)
    if package:
        module.__path__ = []  # a package, so that "django_ratelimit.x" names resolve
    return module


@cache
def aliases() -> dict[str, types.ModuleType]:
    """Every ``django_ratelimit`` name the peer's tests use, as our modules, with the peer's
    ``tests.py`` itself (imported by path, through these aliases, on the first call)."""
    spec = importlib.util.spec_from_file_location(PEER_TESTS, peer_tests_path())
    assert spec is not None and spec.loader is not None
    tests = importlib.util.module_from_spec(spec)
    core_alias = _module(
        f"{PEER}.core",
        {name: getattr(core, name) for name in core.__all__}
        | {"_split_rate": _split_rate, "_get_ip": _get_ip},
    )
    found = {
        f"{PEER}.core": core_alias,
        f"{PEER}.decorators": decorators,
        f"{PEER}.exceptions": exceptions,
        PEER_TESTS: tests,
    }
    package = _module(
        PEER,
        {"ALL": ratelimit_app.ALL, "UNSAFE": ratelimit_app.UNSAFE}
        | {name.rpartition(".")[2]: module for name, module in found.items()},
        package=True,
    )
    modules = {PEER: package, **found}
    with swapped(modules):
        spec.loader.exec_module(tests)
    return modules


@contextlib.contextmanager
def swapped(modules: dict[str, types.ModuleType]) -> Iterator[None]:
    """``modules`` in ``sys.modules`` while active; what was there before, after."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def peer_test_cases(module: types.ModuleType) -> dict[str, type[unittest.TestCase]]:
    """The test classes the peer's module defines (not the ones it imports)."""
    return {
        name: obj
        for name, obj in vars(module).items()
        if isinstance(obj, type)
        and issubclass(obj, unittest.TestCase)
        and obj.__module__ == PEER_TESTS
    }
