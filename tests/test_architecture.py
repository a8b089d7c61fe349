"""The layers of docs/architecture.rst, held against the code.

Every import of ``ratelimit_app`` and ``metrics_app`` is read from the source, those inside
functions included: a module may import from its own layer or below, never from above; the
imports form no circle; and ``metrics_app`` never imports ``ratelimit_app``, which reaches
``metrics_app`` only from the two modules named below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Module -> layer, as docs/architecture.rst lists them (a sub-package counts as one module
#: unless it is listed by its modules).
LAYERS: dict[str, dict[str, int]] = {
    "ratelimit_app": {
        "ratelimit_app": 0,
        "conf": 0,
        "clock": 0,
        "exceptions": 0,
        "signals": 0,
        "rates": 0,
        "refusals": 0,
        "windows": 1,
        "gcra": 1,
        "keys": 1,
        "limits": 2,
        "access": 2,
        "rules": 2,
        "declared": 3,
        "models": 3,
        "backends": 3,
        "store": 4,
        "engine": 4,
        "enforce": 5,
        "core": 5,
        "operations": 5,
        "responses": 5,
        "middleware": 6,
        "decorators": 6,
        "throttling": 6,
        "management": 6,
        "metrics": 6,
        "testing": 6,
        "admin": 7,
        "checks": 7,
        "apps": 7,
    },
    "metrics_app": {
        "names": 0,
        "clock": 0,
        "signals": 0,
        "retention": 0,
        "conf": 1,
        "charts": 1,
        "models": 2,
        "buffer.aggregator": 2,
        "buffer.lifecycle": 2,
        "storage": 3,
        "redis_buffer": 4,
        "buffer.flusher": 4,
        "rollup": 4,
        "buffer.process": 5,
        "tasks": 5,
        "buffer": 6,
        "query": 6,
        "decorators": 7,
        "views": 7,
        "checks": 7,
        "management": 7,
        "testing": 7,
        "admin": 8,
        "apps": 8,
        "metrics_app": 8,  # the package's face re-exports record, flush, series...
    },
}
#: The only modules of ratelimit_app that import metrics_app.
BRIDGES = {"ratelimit_app.metrics", "ratelimit_app.admin"}


def modules() -> dict[str, Path]:
    """Every module of both apps but the migrations, by dotted name."""
    found = {}
    for app in LAYERS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The modules of ``known`` that ``path`` imports, anywhere in it."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    yield full
                elif node.module in known:
                    yield node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imports(path, known)) - {name} for name, path in known.items()}


def layer(module: str) -> tuple[str, int]:
    """``(app, layer)`` of a module: its own entry, else its closest listed parent's."""
    app, _, rest = module.partition(".")
    table = LAYERS[app]
    parts = rest.split(".") if rest else []
    while parts:
        if ".".join(parts) in table:
            return app, table[".".join(parts)]
        parts.pop()
    return app, table[app]


def test_every_module_has_a_layer() -> None:
    unlisted = []
    for name in modules():
        app, _, rest = name.partition(".")
        top = rest.split(".")[0] if rest else app
        if top not in LAYERS[app] and rest not in LAYERS[app]:
            unlisted.append(name)
    assert unlisted == [], "add these to LAYERS and to docs/architecture.rst"


def test_no_import_points_up_a_layer() -> None:
    upward = []
    for module, deps in graph().items():
        app, own = layer(module)
        for dep in deps:
            dep_app, theirs = layer(dep)
            if dep_app == app and theirs > own:
                upward.append(f"{module} (layer {own}) imports {dep} (layer {theirs})")
    assert upward == []


def test_the_apps_meet_only_at_the_bridges() -> None:
    crossing = sorted(
        f"{module} imports {dep}"
        for module, deps in graph().items()
        for dep in deps
        if layer(module)[0] != layer(dep)[0] and module not in BRIDGES
    )
    assert crossing == []


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in edges.get(node, ()):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    # A package's face (its __init__) importing its own modules is not a circle of the
    # design: Python runs it before any of them. The other edges must form no circle.
    edges = {
        module: {d for d in deps if not d.startswith(module + ".")}
        for module, deps in graph().items()
    }
    assert cycles(edges) == []


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_circle_finder_finds_circles(
    edges: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert cycles(edges) == expected


def test_the_checks_see_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from ratelimit_app.store import current\n")
    known = {"ratelimit_app.store": Path("store.py")}
    assert list(imports(source, known)) == ["ratelimit_app.store"]
