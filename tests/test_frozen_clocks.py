"""The two ``frozen_clock`` helpers: one shape, each moving its own app's clock only."""

from __future__ import annotations

import ast
import inspect
import textwrap
from datetime import UTC, datetime
from typing import Any

import pytest

import metrics_app.clock
import metrics_app.testing
import ratelimit_app.clock
import ratelimit_app.testing

APPS = [
    (ratelimit_app.testing, ratelimit_app.clock, metrics_app.clock),
    (metrics_app.testing, metrics_app.clock, ratelimit_app.clock),
]


def _code(obj: Any) -> str:
    """``obj``'s source without its docstrings (they name their own app)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and ast.get_docstring(node):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def test_the_two_are_one_shape() -> None:
    for name in ("FrozenClock", "frozen_clock"):
        ours, theirs = (getattr(m, name) for m in (ratelimit_app.testing, metrics_app.testing))
        assert _code(ours) == _code(theirs)
        assert inspect.signature(ours) == inspect.signature(theirs)


@pytest.mark.parametrize(("testing", "own", "other"), APPS)
def test_each_moves_its_own_clock_only(testing: Any, own: Any, other: Any) -> None:
    before = own.now
    with testing.frozen_clock(datetime(2026, 1, 1, tzinfo=UTC)) as clock:
        assert own.now() == clock() == datetime(2026, 1, 1, tzinfo=UTC).timestamp()
        assert abs(other.now() - datetime.now(UTC).timestamp()) < 60
        clock.advance(61)
        assert own.now() == clock.t == 1_767_225_661
        clock.set(5)
        assert own.now() == 5.0
        clock.set(datetime(1970, 1, 1, 0, 1, tzinfo=UTC))
        assert own.now() == 60.0
    assert own.now is before
    with testing.frozen_clock(1_700_000_000) as clock:
        assert own.now() == 1_700_000_000.0
