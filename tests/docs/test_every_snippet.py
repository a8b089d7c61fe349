"""Every Python snippet of README.md and docs/ is run by a test (docs/index.rst promises it):
a module of this package lists it in ``RUNS``, or :data:`tests.docs.snippets.ELSEWHERE`
names the test that runs it. A new block without a test fails here."""

from __future__ import annotations

import importlib
from collections import Counter

from tests.docs.snippets import DOCS, ELSEWHERE, ROOT, all_snippets


def runs_here() -> Counter[tuple[str, int]]:
    found: Counter[tuple[str, int]] = Counter()
    for path in sorted((ROOT / "tests" / "docs").glob("test_*.py")):
        module = importlib.import_module(f"tests.docs.{path.stem}")
        found.update(getattr(module, "RUNS", []))
    return found


def test_every_snippet_is_run_by_a_test() -> None:
    here = runs_here()
    run = set(here) | set(ELSEWHERE)
    missing = [s.where for key, s in all_snippets().items() if key not in run]
    assert missing == [], f"snippets no test runs: {missing}"
    assert set(run) <= set(all_snippets()), sorted(set(run) - set(all_snippets()))


def test_the_tests_run_elsewhere_exist() -> None:
    for where in set(ELSEWHERE.values()):
        path, name = where.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), where


def test_the_pages_have_snippets() -> None:
    """The collection sees the pages' blocks (an extractor that finds none proves nothing)."""
    pages = Counter(page for page, _ in all_snippets())
    assert pages["ratelimit"] == 17 and pages["README"] == 5
    assert {path.stem for path in DOCS.glob("*.rst")} >= set(pages) - {"README"}
