"""The strict xfails of :func:`tests.peers.suites.mark_differences` count only the failure a
difference documents: a peer's test that fails any other way (a fixture that errors, a
server CI could not start, another exception) must show as a failure, never as the
documented difference. Run in a pytest of its own on a throwaway directory."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
from pathlib import Path

import pytest

from tests.peers import suites

DIFFERENCES = {
    ("TestPeer", name): suites.Difference("documented", AssertionError)
    for name in ("test_documented", "test_other_error", "test_setup_fails", "test_passes")
}


def pytest_collection_modifyitems(items):
    suites.mark_differences(items, Path(__file__).parent, "test_peer", DIFFERENCES)


@pytest.fixture
def server():
    pytest.fail("CI=true and 'memcached' not found on PATH", pytrace=False)
"""

PEER = """
import pytest


class TestPeer:
    def test_documented(self):
        assert 1 == 2

    def test_other_error(self):
        raise KeyError("not the documented difference")

    @pytest.mark.usefixtures("server")
    def test_setup_fails(self):
        assert 1 == 2

    def test_passes(self):
        pass

"""


def test_a_difference_is_xfailed_only_for_the_exception_it_documents(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_peer.py").write_text(PEER)
    plugins_off = ["no:django", "no:django_smart_ratelimit", "no:cacheprovider"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "--rootdir", str(tmp_path), str(tmp_path)]
        + [arg for plugin in plugins_off for arg in ("-p", plugin)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The short summary (-rA): "XFAIL test_peer.py::TestPeer::test_documented - ...",
    # "ERROR at setup of test_peer.py::TestPeer::test_setup_fails - ...".
    outcomes = {
        found[1]: found[0]
        for found in re.findall(r"^([A-Z]+) .*?::TestPeer::(\w+)", run.stdout, re.MULTILINE)
    }
    assert outcomes == {
        "test_documented": "XFAIL",
        "test_other_error": "FAILED",
        "test_setup_fails": "ERROR",
        # Strict: the difference is gone, so the docs are wrong.
        "test_passes": "FAILED",
    }, run.stdout + run.stderr
