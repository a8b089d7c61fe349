"""The copied DRF test module (see the package docstring), loaded through the import swap."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import sys
import types
import unittest
from functools import cache
from pathlib import Path

#: The djangorestframework release the text file comes from, and its SHA-256.
VERSION = "3.18.3"
SHA256 = "8f2a7c4becc177b28c0faa5944c6377c4db51dc80f883b349db6333b2d6c308f"
PATH = Path(__file__).with_name("test_throttling.py.txt")
#: The name the copy is imported under (its classes' ``__module__``).
MODULE = "tests.peers.drf_suite.drf_test_throttling"
SWAPPED = "rest_framework.throttling"


def digest() -> str:
    return hashlib.sha256(PATH.read_bytes()).hexdigest()


@cache
def module() -> types.ModuleType:
    """The copy, imported with ``rest_framework.throttling`` being ``ratelimit_app.throttling``
    (only while its imports run: DRF's module is back in ``sys.modules`` after)."""
    from ratelimit_app import throttling

    loader = importlib.machinery.SourceFileLoader(MODULE, str(PATH))
    spec = importlib.util.spec_from_loader(MODULE, loader)
    assert spec is not None
    found = importlib.util.module_from_spec(spec)
    saved = sys.modules.get(SWAPPED)
    sys.modules[SWAPPED] = throttling
    try:
        loader.exec_module(found)
    finally:
        if saved is None:
            sys.modules.pop(SWAPPED, None)
        else:
            sys.modules[SWAPPED] = saved
    return found


def peer_test_cases() -> dict[str, type[unittest.TestCase]]:
    """The test classes the copy defines."""
    return {
        name: obj
        for name, obj in vars(module()).items()
        if isinstance(obj, type)
        and issubclass(obj, unittest.TestCase)
        and obj.__module__ == MODULE
    }
