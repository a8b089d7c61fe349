"""No function of ``ratelimit_app`` or ``metrics_app`` (migrations aside) is over 80 lines or
above cyclomatic complexity 20, as radon measures them (closures included).

:data:`KNOWN` lists the functions still being split; it can only shrink: a listed function
that no longer offends fails the test until it is taken off.
"""

from __future__ import annotations

from pathlib import Path
from textwrap import indent

from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parent.parent
APPS = ("ratelimit_app", "metrics_app")
MAX_LINES = 80
MAX_COMPLEXITY = 20

#: "path:function" (or "path:Class.method") -> what it measured when listed.
KNOWN: dict[str, str] = {}


def measure(source: str) -> dict[str, tuple[int, int]]:
    """``(lines, complexity)`` of every function, method and closure of ``source``, by name
    (``f``, ``Class.method``, ``f.closure``)."""
    found = {}
    blocks = [
        (f"{b.classname}.{b.name}" if b.is_method else b.name, b)
        for b in cc_visit(source)
        if not hasattr(b, "methods")  # a class: its methods come as blocks of their own
    ]
    while blocks:
        name, block = blocks.pop()
        found[name] = (block.endline - block.lineno + 1, block.complexity)
        # radon leaves a closure's branches out of its function's measure: measure it too.
        blocks += [(f"{name}.{c.name}", c) for c in block.closures]
    return found


def offenders() -> dict[str, str]:
    found = {}
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for name, (lines, complexity) in measure(path.read_text()).items():
                if lines > MAX_LINES or complexity > MAX_COMPLEXITY:
                    where = f"{path.relative_to(ROOT).as_posix()}:{name}"
                    found[where] = f"{lines} lines, complexity {complexity}"
    return found


def test_no_function_is_too_long_or_too_complex() -> None:
    found = offenders()
    assert {k: v for k, v in found.items() if k not in KNOWN} == {}, "split them by job"


def test_every_known_offender_still_offends() -> None:
    found = offenders()
    assert [k for k in KNOWN if k not in found] == [], "split: take them off KNOWN"


def test_the_measure_sees_length_complexity_methods_and_closures() -> None:
    branches = "".join(f"if x == {i}:\n    return {i}\n" for i in range(20)) + "return x\n"
    source = "\n".join(
        [
            "def long():",
            indent("x = 1\n" * 80, " " * 4),
            "def tangled(x):",
            indent(branches, " " * 4),
            "class C:",
            "    def method(self, x):",
            indent(branches, " " * 8),
            "def outer(x):",
            "    def inner(x):",
            indent(branches, " " * 8),
            "    return inner(x)",
        ]
    )
    found = measure(source)
    assert found["long"] == (81, 1)
    assert found["tangled"] == (42, 21)
    assert found["C.method"] == (42, 21)
    assert found["outer.inner"] == (42, 21)
    assert set(found) == {"long", "tangled", "C.method", "outer", "outer.inner"}
