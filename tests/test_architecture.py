"""The layers of docs/architecture.rst, held against the code.

Every import of ``ratelimit_app`` and ``metrics_app`` is read from the source, those inside
functions included, and so is every reach by name (``import_module``, ``import_string``,
``sys.modules``) to a module named by a string: a module may import from its own layer or
below, never from above; the imports form no circle; and ``metrics_app`` never imports
``ratelimit_app``, which reaches ``metrics_app`` only from the two modules named below.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Module -> layer, as docs/architecture.rst lists them (a sub-package counts as one module
#: unless it is listed by its modules).
LAYERS: dict[str, dict[str, int]] = {
    "ratelimit_app": {
        "ratelimit_app": 0,
        "algorithms": 0,
        "config": 0,
        "identity": 0,
        "runtime": 0,
        "conf": 0,
        "clock": 0,
        "exceptions": 0,
        "signals": 0,
        "request_state": 0,
        "algorithms.rates": 0,
        "algorithms.calendar": 0,
        "engine.refusals": 0,
        "engine.refusals.memory": 0,
        "bans": 0,
        "operators": 0,
        "algorithms.windows": 1,
        "algorithms.gcra": 1,
        "identity.addresses": 1,
        "identity.provenance": 0,
        "identity.sealing": 0,
        "identity.namespaces": 1,
        "config.bans": 1,
        "bans.held": 1,
        "identity.keys": 1,
        "keys": 1,
        "config.mistakes": 2,
        "config.kinds": 2,
        "config.limits": 2,
        "config.policy": 2,
        "config.access": 2,
        "config.rules": 2,
        "config.sources": 2,
        "config.views": 2,
        "overrides": 2,
        "overrides.table": 2,
        "config.declared": 3,
        "models": 3,
        "backends": 3,
        "backends.memory": 3,
        "config.versions": 3,
        "store": 4,
        "bans.applied": 4,
        "engine.refusals.remembered": 4,
        "engine.refusals.recall": 4,
        "engine": 4,
        "overrides.applied": 4,
        "engine.enforce": 5,
        "engine.outcome": 5,
        "engine.screen": 5,
        "engine.matched": 5,
        "engine.compiled": 5,
        "core": 5,
        "operations": 5,
        "operators.operations": 5,
        "engine.responses": 5,
        "responses": 5,
        "middleware": 6,
        "decorators": 6,
        "throttling": 6,
        "management": 6,
        "testing": 6,
        "operators.metrics": 6,
        "operators.telemetry": 6,
        "admin": 7,
        "operators.admin": 7,
        "operators.refused": 7,
        "checks": 7,
        "apps": 7,
    },
    "metrics_app": {
        "names": 0,
        "topk": 0,
        "clock": 0,
        "signals": 0,
        "retention": 0,
        "conf": 1,
        "charts": 1,
        "models": 2,
        "buffer.aggregator": 2,
        "buffer.lifecycle": 2,
        "storage": 3,
        "buffer.shared": 4,
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
        "telemetry": 7,
        "admin": 8,
        "apps": 8,
        "metrics_app": 8,  # the package's face re-exports record, flush, series...
    },
}
#: The only modules of ratelimit_app that import metrics_app.
BRIDGES = {
    "ratelimit_app.operators.metrics",
    "ratelimit_app.operators.admin",
    "ratelimit_app.operators.refused",
}


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


#: Calls that import the module their first argument names.
IMPORTING_CALLS = {"import_module", "import_string", "__import__"}


def _is_sys_modules(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "modules"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


@functools.cache
def constants(path: Path) -> dict[str, str]:
    """The module-level ``NAME = "text"`` of ``path`` (none if there is no such file)."""
    found: dict[str, str] = {}
    if not path.is_file():
        return found
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def _names(path: Path, tree: ast.Module, known: dict[str, Path]) -> dict[str, str]:
    """The strings a bare name stands for in ``path``: its constants and those it imports."""
    found = dict(constants(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in known and not node.level:
            theirs = constants(known[node.module])
            for alias in node.names:
                if alias.name in theirs:
                    found[alias.asname or alias.name] = theirs[alias.name]
    return found


def _named(node: ast.AST | None, names: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    return None


def reached_by_name(tree: ast.Module, names: dict[str, str]) -> Iterator[str]:
    """Every dotted name that ``tree`` imports or looks up in ``sys.modules`` by a string:
    ``import_module("m")``, ``import_string("m.Class")``, ``"m" in sys.modules``,
    ``sys.modules["m"]``, ``sys.modules.get("m")``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            on_modules = isinstance(func, ast.Attribute) and _is_sys_modules(func.value)
            if (called in IMPORTING_CALLS or on_modules) and node.args:
                text = _named(node.args[0], names)
            else:
                continue
        elif isinstance(node, ast.Compare) and any(_is_sys_modules(c) for c in node.comparators):
            text = _named(node.left, names)
        elif isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
            text = _named(node.slice, names)
        else:
            continue
        if text:
            yield text


def _module_of(dotted: str, known: dict[str, Path]) -> str | None:
    """The longest module of ``known`` that ``dotted`` names or lies in."""
    parts = dotted.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) or None


def imports(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The modules of ``known`` that ``path`` imports, anywhere in it, or reaches by name."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
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
    for dotted in reached_by_name(tree, _names(path, tree, known)):
        module = _module_of(dotted, known)
        if module is not None:
            yield module


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


#: The one import allowed to point up: ``ratelimit_app.charge``, the public face's function
#: that imports ``core`` when it is called (never at import), so that a view calls
#: ``ratelimit_app.charge(request, n)`` as the docs write it.
FACE_EXPORTS = {("ratelimit_app", "ratelimit_app.core")}


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Each import of ``edges`` that points up a layer of its app."""
    found = []
    for module, deps in edges.items():
        app, own = layer(module)
        for dep in deps:
            dep_app, theirs = layer(dep)
            if dep_app == app and theirs > own and (module, dep) not in FACE_EXPORTS:
                found.append(f"{module} (layer {own}) imports {dep} (layer {theirs})")
    return found


def test_no_import_points_up_a_layer() -> None:
    assert upward(graph()) == []


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


REACH = "ratelimit_app.operators.operations (layer 5) imports ratelimit_app.throttling (layer 6)"


@pytest.mark.parametrize(
    "source",
    [
        'import sys\nloaded = "ratelimit_app.throttling" in sys.modules\n',
        'import sys\nloaded = "ratelimit_app.throttling" not in sys.modules\n',
        'import sys\nfound = sys.modules.get("ratelimit_app.throttling")\n',
        'import sys\nfound = sys.modules["ratelimit_app.throttling"]\n',
        'import importlib\nfound = importlib.import_module("ratelimit_app.throttling")\n',
        "from importlib import import_module\n"
        'def f():\n    return import_module("ratelimit_app.throttling")\n',
        "from django.utils.module_loading import import_string\n"
        'found = import_string("ratelimit_app.throttling.AnonRateThrottle")\n',
        'import sys\nNAME = "ratelimit_app.throttling"\nloaded = NAME in sys.modules\n',
        "import sys\nfrom ratelimit_app.conf import THROTTLING\n"
        "loaded = THROTTLING in sys.modules\n",
    ],
)
def test_a_reach_by_name_up_a_layer_fails(tmp_path: Path, source: str) -> None:
    module = tmp_path / "operations.py"
    module.write_text(source)
    conf = tmp_path / "conf.py"
    conf.write_text('THROTTLING = "ratelimit_app.throttling"\n')
    known = {
        "ratelimit_app.operators.operations": module,
        "ratelimit_app.conf": conf,
        "ratelimit_app.throttling": tmp_path / "throttling.py",
    }
    edges = {
        "ratelimit_app.operators.operations": set(imports(module, known)) - {"ratelimit_app.conf"}
    }
    assert upward(edges) == [REACH]


@pytest.mark.parametrize(
    "source",
    [
        'PATH = "ratelimit_app.throttling.AnonRateThrottle"\n',  # a string, not a reach
        "from django.utils.module_loading import import_string\n"
        "def f(path):\n    return import_string(path)\n",  # a setting's path: not ours
        'import sys\nloaded = "rest_framework" in sys.modules\n',  # not a module of ours
    ],
)
def test_a_string_alone_is_no_reach(tmp_path: Path, source: str) -> None:
    module = tmp_path / "operations.py"
    module.write_text(source)
    known = {
        "ratelimit_app.operators.operations": module,
        "ratelimit_app.throttling": Path("t.py"),
    }
    assert list(imports(module, known)) == []
