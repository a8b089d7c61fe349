"""The Python snippets of README.md and of every page of docs/, as a reader copies them.

A snippet is named by its page and its place on the page (``("operators", 4)``: the fifth
Python block of docs/operators.rst; README.md is ``"README"``). A test takes one with
:func:`snippet`, which also checks that the block still says what the test expects, so a block
inserted above it, or rewritten, fails the test that ran the old one instead of running the
wrong one. :mod:`tests.docs.test_every_snippet` checks that every snippet is run by a test:
those of this package (each module's ``RUNS``), or one elsewhere listed in :data:`ELSEWHERE`.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

#: A Python block of a page: the directive at any indentation, its body indented deeper.
_DIRECTIVE = re.compile(r"^( *)\.\. code-block:: python\n", re.MULTILINE)
_FENCE = re.compile(r"^( *)```python\n(.*?)^ *```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Snippet:
    page: str
    index: int
    line: int  # where the block starts in its file, for messages
    code: str

    @property
    def where(self) -> str:
        name = "README.md" if self.page == "README" else f"docs/{self.page}.rst"
        return f"{name}:{self.line}"


def _rst_blocks(page: str, text: str) -> list[Snippet]:
    found: list[Snippet] = []
    for match in _DIRECTIVE.finditer(text):
        indent = len(match.group(1))
        body: list[str] = []
        for line in text[match.end() :].splitlines():
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            if line.strip().startswith(":") and not body:  # the directive's options
                continue
            body.append(line)
        code = textwrap.dedent("\n".join(body)).strip("\n") + "\n"
        line_no = text.count("\n", 0, match.start()) + 1
        found.append(Snippet(page, len(found), line_no, code))
    return found


def _readme_blocks(text: str) -> list[Snippet]:
    return [
        Snippet(
            "README",
            index,
            text.count("\n", 0, m.start()) + 1,
            textwrap.dedent(m.group(2)).strip("\n") + "\n",
        )
        for index, m in enumerate(_FENCE.finditer(text))
    ]


@cache
def all_snippets() -> dict[tuple[str, int], Snippet]:
    """Every Python snippet of README.md and docs/*.rst, by ``(page, index)``."""
    found: list[Snippet] = _readme_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    for path in sorted(DOCS.glob("*.rst")):
        found += _rst_blocks(path.stem, path.read_text(encoding="utf-8"))
    return {(s.page, s.index): s for s in found}


def snippet(page: str, index: int, *needles: str) -> Snippet:
    """The snippet ``index`` of ``page``, which must contain each of ``needles``."""
    found = all_snippets().get((page, index))
    assert found is not None, f"{page} has no Python block {index}"
    for needle in needles:
        assert needle in found.code, f"{found.where} no longer says {needle!r}:\n{found.code}"
    return found


#: Snippets run by tests outside this package: (page, index) -> the test that runs it.
ELSEWHERE: dict[tuple[str, int], str] = {
    # The README's settings, view and rules, appended to a new project with the built wheel.
    (
        "README",
        0,
    ): "tests/packaging/test_install.py::test_a_new_project_gets_429_from_the_readme_view",
    (
        "README",
        2,
    ): "tests/packaging/test_install.py::test_a_new_project_gets_429_from_the_readme_view",
    (
        "README",
        3,
    ): "tests/packaging/test_install.py::test_a_new_project_gets_429_from_the_readme_view",
    (
        "README",
        4,
    ): "tests/packaging/test_install.py::test_a_new_project_gets_429_from_the_readme_view",
    ("quickstart", 3): "tests/packaging/test_install.py::"
    "test_the_quickstart_shows_the_rules_the_readme_tested",
    ("operators", 5): "tests/ratelimit/test_operators_snippets.py::"
    "test_the_scanner_of_unknown_links_is_banned_from_the_whole_site",
    ("celery", 0): "tests/test_docs.py::test_the_celery_wiring_as_documented",
    ("celery", 1): "tests/test_docs.py::test_the_celery_wiring_as_documented",
    ("celery", 2): "tests/test_docs.py::test_the_celery_wiring_as_documented",
    ("backends", 5): "tests/ratelimit/test_backend_config.py::"
    "test_the_documented_custom_backend_limits_to_a_429",
    ("migrating", 2): "tests/peers/test_migrating.py::"
    "test_the_drf_exception_handler_answers_429_for_a_refusal",
}
